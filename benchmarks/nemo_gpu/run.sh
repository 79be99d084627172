#!/usr/bin/env bash
# NeMo itself on this machine's GPUs, for chapter 1-2 experiments: rows of book/reference/chapter<N>.json with
# run_engine nemo, through the chapters' own job scripts and the local executor (benchmarks/reference_runs.py).
# All experiments of one call run on one machine, so a scaling series shares one card type. On the GPU machine,
# from the repository root, with NeMo's wheels in .nemo-wheels (bash benchmarks/nemo_gpu/fetch_wheels.sh, here):
#
#   bash benchmarks/nemo_gpu/run.sh CHAPTER EXPERIMENT [EXPERIMENT ...]
#   bash benchmarks/nemo_gpu/run.sh 1 lora/llama/1-gpu lora/llama/2-gpus lora/llama/4-gpus lora/llama/1-gpu-packed
#
# The local executor starts the largest jobs first and runs smaller ones side by side on free GPUs.
# STANDIN=1 also runs the PyTorch stand-in of the same experiments afterwards (same card);
# OUT_DIR (default book/reference) and TIMEOUT (default 540 s) are read from the environment.
set -uo pipefail
if [ $# -lt 2 ]; then
    sed -n '2,12p' "$0" >&2
    exit 2
fi
CHAPTER=$1
shift
OUT_DIR=${OUT_DIR:-book/reference}
TIMEOUT=${TIMEOUT:-540}
ROOT=$PWD
export PYTHONUNBUFFERED=1 WORKSHOP_BACKEND=local
status=0

# NeMo 2.4.1 from the carried wheels, in a subshell: its transformers 4.51 must not reach the stand-in.
( . benchmarks/nemo_gpu/device_env.sh .nemo-wheels &&
  python3 benchmarks/reference_runs.py --chapter "$CHAPTER" --profile gpu-workstation-nemo --only "$@" \
      --merge --runs runs-nemo --out "$OUT_DIR" --timeout "$TIMEOUT" ) || status=1

if [ "${STANDIN:-0}" = 1 ]; then
    # The stand-in in the image's own environment, plus the `datasets` its data loading needs.
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/standin-site \
        .nemo-wheels/datasets-*.whl .nemo-wheels/dill-*.whl .nemo-wheels/multiprocess-*.whl || status=1
    PYTHONPATH="/tmp/standin-site:$ROOT" python3 benchmarks/reference_runs.py --chapter "$CHAPTER" --only "$@" \
        --merge --runs runs-standin --out "$OUT_DIR" --timeout "$TIMEOUT" || status=1
fi
exit "$status"
