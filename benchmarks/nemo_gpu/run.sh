#!/usr/bin/env bash
# NeMo itself and the PyTorch stand-in, one after the other on the same GPU, for one chapter 1-2 experiment:
# two rows of book/reference/chapter<N>.json (run_engine nemo and stand-in), through the chapter's own job
# scripts and the local executor (benchmarks/reference_runs.py). On the GPU machine, from the repository root,
# with NeMo's wheels in .nemo-wheels (benchmarks/NOTES.md, "NeMo on the lent GPU", says how to fetch them):
#
#   bash benchmarks/nemo_gpu/run.sh [EXPERIMENT] [CHAPTER] [OUT_DIR]     # default lora/llama/1-gpu 1 book/reference
set -uo pipefail
EXPERIMENT=${1:-lora/llama/1-gpu}
CHAPTER=${2:-1}
OUT_DIR=${3:-book/reference}
ROOT=$PWD
export PYTHONUNBUFFERED=1 WORKSHOP_BACKEND=local
status=0

# NeMo 2.4.1 from the carried wheels, in a subshell: its transformers 4.51 must not reach the stand-in.
( . benchmarks/nemo_gpu/device_env.sh .nemo-wheels &&
  python3 benchmarks/reference_runs.py --chapter "$CHAPTER" --profile gpu-workstation-nemo --only "$EXPERIMENT" \
      --merge --runs runs-nemo --out "$OUT_DIR" --timeout 480 ) || status=1

# The stand-in in the image's own environment, plus the `datasets` its data loading needs.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/standin-site \
    .nemo-wheels/datasets-*.whl .nemo-wheels/dill-*.whl .nemo-wheels/multiprocess-*.whl || status=1
PYTHONPATH="/tmp/standin-site:$ROOT" python3 benchmarks/reference_runs.py --chapter "$CHAPTER" --only "$EXPERIMENT" \
    --merge --runs runs-standin --out "$OUT_DIR" --timeout 300 || status=1
exit "$status"
