#!/usr/bin/env bash
# One call of the device tool: the cards, then run.sh, then what comes back under $OUT (the chapter JSON files
# and a tarball of the run folders' logs and monitors; checkpoints stay behind).
#
#   bash benchmarks/nemo_gpu/device_call.sh TAG CHAPTER EXPERIMENT [EXPERIMENT ...]
set -uo pipefail
TAG=$1
shift
OUT=${OUT:-/tmp/nemo-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
started=$(date +%s)
bash benchmarks/nemo_gpu/run.sh "$@"
status=$?
echo "run.sh exit $status after $(( $(date +%s) - started )) s"
cp book/reference/chapter1.json book/reference/chapter2.json "$OUT"/ 2>/dev/null
find runs-nemo -type f \( -name 'slurm-*.out' -o -name '*.csv' -o -name 'job.sbatch' -o -name 'job.json' \) \
    -size -20M -print0 | tar --null -czf "$OUT/logs-$TAG.tar.gz" -T -
ls -la "$OUT"
# The end of each log, for the reply's tail.
for log in $(find runs-nemo -name 'slurm-*.out' | sort); do
    echo "== $log"; grep -E "Error|error:|Traceback|Exit status|Total time|== nemo-local: real tokens" "$log" | tail -5
done
exit "$status"
