#!/usr/bin/env bash
# The NeMo 2.4.1 wheels for the lent GPU machine (CPython 3.12, x86_64), into .nemo-wheels/ (git-ignored; the
# device call carries it). Here, on a machine with PyPI and a python3.12 (the image's Python):
#
#   bash benchmarks/nemo_gpu/fetch_wheels.sh [DEST]
#
# wheels.txt is the list (benchmarks/nemo_gpu/wheel_list.py says the rule). Binary wheels are downloaded for
# this machine's CPython 3.12 (x86_64, glibc older than the image's); the five pins with no cp312 wheel on PyPI are built here from their sdists.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DEST=${1:-.nemo-wheels}
PY312=${PY312:-python3.12}
"$PY312" --version >/dev/null 2>&1 || { echo "fetch_wheels: $PY312 not found; set PY312=/path/to/python3.12" >&2; exit 2; }
mkdir -p "$DEST"
# Built from sdists (megatron-core compiles its C++ dataset helpers, so this takes a minute).
SDIST_ONLY="megatron-core antlr4-python3-runtime asciitree rouge_score wget"
binary=() built=()
while read -r pin; do
    [ -z "$pin" ] && continue
    name=${pin%%==*}
    if [[ " $SDIST_ONLY " == *" $name "* ]]; then built+=("$pin"); else binary+=("$pin"); fi
done < "$HERE/wheels.txt"
# This machine's own CPython 3.12 picks the wheels: x86_64 with glibc <= the image's (Ubuntu 24.04, 2.39).
"$PY312" -m pip download -q --no-deps --only-binary=:all: -d "$DEST" "${binary[@]}"
"$PY312" -m pip wheel -q --no-deps -w "$DEST" "${built[@]}"
count=$(ls "$DEST"/*.whl | wc -l)
echo "fetch_wheels: $count wheels in $DEST ($(du -sh "$DEST" | cut -f1)); wheels.txt lists $(grep -c . "$HERE/wheels.txt")"
