#!/usr/bin/env bash
# The CUDA path of the training engines on the BLOOM-560m shape (random weights, synthetic SQuAD):
# plain HF Trainer, DeepSpeed ZeRO-2 and FSDP FULL_SHARD, each with the seed's recipe
# (fp16, per-device batch 4 x accumulation 4, 512 tokens). Run on a GPU machine from the repo root:
#   bash benchmarks/cuda_smoke.sh OUT_DIR [STEPS]
set -euo pipefail
out=${1:?usage: cuda_smoke.sh OUT_DIR [STEPS]}
steps=${2:-40}
mkdir -p "$out"
gpus=$(nvidia-smi -L | wc -l)
nvidia-smi --query-gpu=timestamp,index,name,memory.used,memory.total --format=csv,nounits -l 1 > "$out/gpu_memory_smoke.csv" &
monitor=$!
trap 'kill $monitor 2>/dev/null || true' EXIT
common=(--model bloom-560m --random-init --data synthetic --precision fp16 --per-device-batch 4 --grad-accum 4
        --samples-per-gpu 2000 --max-steps "$steps" --eval-samples 32 --generation-samples 8)
run() {  # NAME NPROC ARGS...
    local name=$1 nproc=$2; shift 2
    echo "=== $name on $nproc GPU(s)"
    local started=$SECONDS
    CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((nproc - 1))) torchrun --standalone --nproc_per_node="$nproc" \
        -m workshop_lib.train.hf --output-dir "$out/$name" "${common[@]}" "$@" > "$out/$name.log" 2>&1 \
        || { echo "FAILED: $name"; tail -30 "$out/$name.log"; }
    echo "    wall $((SECONDS - started)) s"
    grep '"kind": "summary"' "$out/$name/metrics.jsonl" 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print("    samples/s %.1f  peak MiB/rank %s  final loss %.4f  world %d  %s" % (r["samples_per_s"],
          [round(x) for x in r["peak_memory_mib_per_rank"]], r["final_loss"], r["world_size"], r["precision"]))'
}
run plain 1
run zero2 1 --deepspeed slurm/ds_configs/zero2.json
if [ "$gpus" -ge 2 ]; then
    run ddp-2 2
    run fsdp-full-shard-2 2 --fsdp FULL_SHARD
else
    run fsdp-full-shard-1 1 --fsdp FULL_SHARD
fi
