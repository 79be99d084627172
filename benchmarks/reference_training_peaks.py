"""The stored reference rows' GPU peak, made the training step's own (issue 40, item 10).

Until 2026-11-27 the tensor census kept the gradients it counted on step 2 alive, so every later step peaked one
gradient copy higher than it needed; the process peak the rows stored (`allocated_peak_mib`) carries that copy
(2,133 MiB on BLOOM-560m in fp32, 16 GiB on the Llama TP 2 stand-in). The allocator's peak over step 2 itself
(`rank0_step_peak_mib`) was measured before the leak could act; after the fix every later step peaks at it
(zero/baseline 19,597.1 MiB, zero0 18,331.1, fsdp/baseline 12,161.3 then 12,158.3 for steps 3-30; two H200s,
2026-11-27, `WORKSHOP_STEP_PEAKS=1`). So for each GPU row with a census this keeps the stored peak as
`process_peak_mib` and shows rank 0's step-2 peak, saying so in `allocated_scope`. Rows without a census (chapter
3's, from before the census existed) had no leak and stay as they are. Idempotent:

    python3 benchmarks/reference_training_peaks.py book/reference/*.json
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

SCOPE = "training step 2, rank 0"
NOTE = {"command": "benchmarks/reference_training_peaks.py",
        "what": "allocated_peak_mib of GPU rows with a tensor census = rank 0's allocator peak over step 2 "
                "(the census had kept step 2's gradients alive, raising later steps); the stored value is "
                "process_peak_mib"}


def corrected(row: dict) -> bool:
    """Give one row the training step's peak; False where it has none to give or already has it."""
    step = row.get("rank0_step_peak_mib")
    if row.get("allocated_kind") != "cuda_max_allocated" or step is None or row.get("allocated_scope"):
        return False
    row["process_peak_mib"] = row.get("allocated_peak_mib")
    row["allocated_peak_mib"] = row["rank0_peak_mib"] = step
    row["allocated_scope"] = SCOPE
    return True


def main(paths: list[str]) -> int:
    for path in map(Path, paths):
        data = json.loads(path.read_text())
        rows = data.get("results") if isinstance(data, dict) else None
        if not isinstance(rows, list):
            continue
        changed = sum(corrected(row) for row in rows)
        if not changed:
            print(f"{path}: nothing to change")
            continue
        date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        data["corrections"] = data.get("corrections", []) + [{"date": date, **NOTE}]  # not a measurement
        path.write_text(json.dumps(data, indent=1, default=str) + "\n")
        print(f"{path}: {changed} rows now show the training step's peak")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
