"""Fault injection on the real local SLURM cluster, fourth round: jobs that reach the scheduler late and jobs of
another folder. A job belongs to a run folder by its working directory, never by its name or id alone; a job of
an interrupted submission that the controller creates after the re-run is found by status, cancel and reuse,
and once released never writes over the run it does not belong to.

The helpers come from test_fault_injection (the launcher that writes `train/progress.txt`, the scheduler's view of
a folder); each case waits on events (a file, the scheduler's answer), never on a guess of how long a step takes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from test_fault_injection import (
    THIRD, cancelled_jobs, fault_profile, job_state, notebook, previous_failed_attempt, progress_jobs,
    scheduler_jobs, wait_until,
)
from workshop_lib import runs as runs_module
from workshop_lib.cli import main
from workshop_lib.core.run_directory import RESERVATION_NAME
from workshop_lib.runs import RunRecord, load_run, run_status, submit_experiment, wait_for_runs
from workshop_lib.sites.profiles import load_profile

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def held_job(directory: Path, script: Path, name: str = "orphan") -> str:
    """A held job whose working directory is `directory` (what an interrupted sbatch leaves)."""
    return subprocess.run(["sbatch", "--parsable", "--hold", f"--chdir={directory}", f"--job-name={name}",
                           "--output=/dev/null", str(script)], capture_output=True, text=True,
                          check=True).stdout.strip()


def orphan_script(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "orphan.sbatch"
    script.write_text("#!/bin/bash\necho orphan $SLURM_JOB_ID >> train/progress.txt\n")
    return script


def test_cancel_leaves_a_job_of_the_same_name_in_another_runs_folder_alone(local_cluster, tmp_path, capsys):
    # After a scheduler reset, an old run's job.json (no final state) names an id that the controller now
    # gives a job of the same name in another runs folder.
    elsewhere = tmp_path / "other-runs" / THIRD.id
    elsewhere.mkdir(parents=True)
    other = held_job(elsewhere, orphan_script(tmp_path), name="same-name")
    root = tmp_path / "runs"
    directory = runs_module.run_directory(THIRD, root)
    directory.mkdir(parents=True)
    RunRecord(THIRD.id, THIRD.content_hash, "tiny", other, "slurm", "2026-11-20T10:00:00+00:00",
              job_name="same-name").save(directory)
    try:
        assert main(["cancel", THIRD.id, "--runs-dir", str(root)]) == 0
        said = capsys.readouterr().out
        assert job_state(other) == "PENDING", said  # the other folder's job is untouched
        assert f"cancelled job {other}" not in said and "nothing to cancel" in said
    finally:
        subprocess.run(["scancel", other], check=False)


def fake_unreachable_scheduler(folder: Path) -> dict:
    """PATH with squeue and scancel answering as they do when the controller is down."""
    folder.mkdir(parents=True, exist_ok=True)
    for tool in ("squeue", "scancel", "sacct"):
        path = folder / tool
        path.write_text("#!/bin/bash\necho \"$0: error: Unable to contact slurm controller (connect failure)\" >&2\n"
                        "exit 1\n")
        path.chmod(0o755)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


def test_cancel_exits_non_zero_when_the_scheduler_does_not_answer(local_cluster, tmp_path, monkeypatch, capsys):
    root = tmp_path / "runs"
    directory = runs_module.run_directory(THIRD, root)
    directory.mkdir(parents=True)
    RunRecord(THIRD.id, THIRD.content_hash, "tiny", "4242", "slurm", "2026-11-20T10:00:00+00:00").save(directory)
    for name, value in fake_unreachable_scheduler(tmp_path / "bin").items():
        monkeypatch.setenv(name, value)
    assert main(["cancel", THIRD.id, "--runs-dir", str(root)]) == 1
    captured = capsys.readouterr()
    assert "not cancelled: the scheduler does not answer" in captured.out
    assert "scheduler did not answer" in captured.err and THIRD.id in captured.err
