"""The CLI fuzz cases of the fourth fault round (issue 40, item 9): each ran into a traceback or past 90 s.
Each runs as a `workshop` process of its own with a 30 s limit, and must end in a message (or its answer) with
no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

LIMIT_S = 30
pytestmark = pytest.mark.slow  # a `workshop` process per case


def nested_profile(folder: Path) -> Path:
    path = folder / "deep.yml"
    path.write_text("name: tiny\ntraining: " + "[" * 20000 + "]" * 20000 + "\n")
    return path


def config_holding_a_list(folder: Path) -> Path:
    path = folder / "config.json"
    path.write_text("[1, 2, 3]\n")
    return path


def fifo(folder: Path) -> Path:
    path = folder / "gpu_memory.csv"
    os.mkfifo(path)  # read, it waits for a writer forever
    return path


def script_of(folder: Path, name: str, body: str, repeat: int = 1) -> Path:
    path = folder / name
    with open(path, "w") as script:
        script.write("#!/bin/bash\n#SBATCH --nodes=1\n")
        for _ in range(repeat):
            script.write(body)
    return path


def huge_script(folder: Path) -> Path:  # 100 MB of commands
    return script_of(folder, "huge.sbatch", "torchrun --nproc_per_node=1 train.py --lr 1\n" * 2**14, repeat=142)


def one_long_line(folder: Path) -> Path:  # one 5 MB line
    return script_of(folder, "line.sbatch", "echo \"" + "x " * (5 * 2**19) + "\"\n")


def long_line_under_the_limit(folder: Path) -> Path:  # 200 KB on one line: still checked, in linear time
    return script_of(folder, "line.sbatch", "echo \"" + "x " * 100_000 + "\"\n")


def scheduler_answering_nothing(folder: Path) -> dict:
    """squeue and sacct that know no job (each call costs a process, as the real ones do)."""
    bin_folder = folder / "bin"
    bin_folder.mkdir()
    for tool in ("squeue", "sacct"):
        (bin_folder / tool).write_text("#!/bin/sh\nexit 0\n")
        (bin_folder / tool).chmod(0o755)
    return {"PATH": f"{bin_folder}{os.pathsep}{os.environ['PATH']}"}


# (arguments from the temporary folder, the exit status, a phrase the output must hold, extra environment)
CASES = {
    "estimate-config-list": (lambda f: ["estimate", "--model", str(config_holding_a_list(f))], 2,
                             "not an object of settings", None),
    "estimate-experiment-id": (lambda f: ["estimate", "zero/single-gpu/zero1"], 0, "model states per GPU", None),
    "profile-nested-deeply": (lambda f: ["render", "zero/baseline", "--profile", str(nested_profile(f))], 2,
                              "nests its blocks too deeply", None),
    "memory-dev-zero": (lambda f: ["memory", "/dev/zero"], 2, "not a regular file", None),
    "memory-fifo": (lambda f: ["memory", str(fifo(f))], 2, "not a regular file", None),
    "check-100-mb-script": (lambda f: ["check", str(huge_script(f))], 1, "far more than a job script", None),
    "check-5-mb-line": (lambda f: ["check", str(one_long_line(f))], 1, "far more than a job script", None),
    "check-200-kb-line": (lambda f: ["check", str(long_line_under_the_limit(f))], 0, "1 script checked", None),
    "check-empty-path": (lambda f: ["check", ""], 2, "an empty path", None),
    "jobs-3000-ids": (lambda f: ["jobs", "--backend", "slurm", *map(str, range(1, 3001))], 1,
                      "the scheduler does not know job", scheduler_answering_nothing),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_fuzz_case_ends_in_a_message_within_the_limit(case, tmp_path):
    arguments, status, said, environment = CASES[case]
    env = {**os.environ, "WORKSHOP_RUNS_DIR": str(tmp_path / "runs"), "WORKSHOP_STATE_DIR": str(tmp_path / "state"),
           **(environment(tmp_path) if environment else {})}
    done = subprocess.run([sys.executable, "-m", "workshop_lib.cli", *arguments(tmp_path)], capture_output=True,
                          text=True, env=env, timeout=LIMIT_S, stdin=subprocess.DEVNULL)
    output = done.stdout + done.stderr
    assert "Traceback" not in output, output[-3000:]
    assert done.returncode == status, output[-3000:]
    assert said in output, output[-3000:]
