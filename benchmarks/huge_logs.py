"""`workshop status` and `workshop collect` on a run whose log is huge (issue 40, item 4).

Writes a failed run of fsdp/baseline into a temporary runs folder whose slurm-<id>.out has SIZE bytes: the
job's header, trainer log lines every few thousand lines, then mostly noise (a warning repeated and tqdm
redraws, what fills real logs), and at the end a Python traceback and the footer. Then times each command in a
process of its own and reads its peak memory (ru_maxrss of the child).

    python3 benchmarks/huge_logs.py --size 1G            # both commands, a 600 s limit each
    python3 benchmarks/huge_logs.py --size 100M --limit 120
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXPERIMENT = "fsdp/baseline"
NOISE = ("/opt/venv/lib/python3.11/site-packages/torch/utils/checkpoint.py:92: UserWarning: None of the inputs "
         "have requires_grad=True. Gradients will be None\n"
         " 42%|████▏     | 420/1000 [01:03<01:27,  6.63it/s]\r 43%|████▎     | 430/1000 [01:04<01:25,  6.66it/s]\n")
TRAIN_LINE = "{'loss': 2.3456, 'grad_norm': 1.25, 'learning_rate': 4.9e-05, 'epoch': 0.01}\n"
END = ("Traceback (most recent call last):\n"
       '  File "/opt/venv/lib/python3.11/site-packages/workshop_lib/train/hf.py", line 210, in main\n'
       "    trainer.train()\n"
       '  File "/opt/venv/lib/python3.11/site-packages/transformers/trainer.py", line 1938, in train\n'
       "    return inner_training_loop(\n"
       "RuntimeError: the injected failure at the end of a huge log\n"
       " End time   : 2026-11-27 10:00:00\n Total time : 01:00:00\nExit status: 1\n")


def parse_size(text: str) -> int:
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)


def write_run(root: Path, size: int) -> Path:
    folder = root / EXPERIMENT
    folder.mkdir(parents=True)
    record = {"experiment_id": EXPERIMENT, "content_hash": "0", "profile": "tiny", "job_id": "12",
              "backend": "slurm", "submitted_at": "2026-11-27T09:00:00+00:00", "stdout": "slurm-12.out",
              "final_state": "FAILED", "exit_code": 1}
    (folder / "job.json").write_text(json.dumps(record, indent=2))
    block = (NOISE * 2000 + TRAIN_LINE).encode()
    with open(folder / "slurm-12.out", "wb") as log:
        log.write(b"Job 12 (fsdp-baseline) on node1, run directory x\n Start time : 2026-11-27 09:00:00\n")
        written = 0
        while written < size:
            log.write(block)
            written += len(block)
        log.write(END.encode())
    return folder


def measure(command: list[str], limit: float, env: dict) -> dict:
    """Wall time and peak memory of one command run in a child of its own (a fresh ru_maxrss)."""
    probe = ("import resource, subprocess, sys, time, json\n"
             "start = time.monotonic()\n"
             "try:\n"
             "    code = subprocess.run(sys.argv[2:], stdout=subprocess.DEVNULL,\n"
             "                          timeout=float(sys.argv[1])).returncode\n"
             "except subprocess.TimeoutExpired:\n"
             "    code = 'timeout'\n"
             "print(json.dumps({'seconds': round(time.monotonic() - start, 1), 'exit': code,\n"
             "                  'peak_rss_mib': round(\n"
             "                      resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)}))\n")
    result = subprocess.run([sys.executable, "-c", probe, str(limit), *command], capture_output=True, text=True,
                            env=env)
    return json.loads(result.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="1G", help="the log's size: 100M, 1G, …")
    parser.add_argument("--limit", type=float, default=600, help="seconds each command may take")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder) / "runs"
        started = time.monotonic()
        log = write_run(root, parse_size(args.size)) / "slurm-12.out"
        print(f"wrote {log.stat().st_size / 2**20:.0f} MiB in {time.monotonic() - started:.1f} s")
        env = {**os.environ, "WORKSHOP_RUNS_DIR": str(root), "WORKSHOP_BACKEND": "local"}
        workshop = [sys.executable, "-m", "workshop_lib.cli"]
        for name, command in (("status", [*workshop, "status", EXPERIMENT, "--runs-dir", str(root)]),
                              ("collect", [*workshop, "collect", "--chapter", "4", "--runs", str(root)])):
            print(name, json.dumps(measure(command, args.limit, env)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
