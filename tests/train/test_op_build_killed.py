"""A job killed while DeepSpeed builds its op, and the next job: on the local SLURM cluster, with a real build.

The first chapter-3 job builds DeepSpeed's shared-memory op into an empty folder; it is cancelled (scancel) once
torch's build lock is on disk, which leaves the lock behind (torch removes it only when a build ends). The next
job must neither wait on that lock until its time limit nor fail: it says in its log that it removed the lock,
builds the op and completes.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from workshop_lib.experiments import get_experiment
from workshop_lib.runs import cancel_runs, query_runs, submit_experiments, wait_for_runs
from workshop_lib.train.extensions import EXTENSIONS_VARIABLE, TORCH_LOCK

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.train]

EXPERIMENT = "zero/single-gpu/zero0"
OP_FOLDER = "deepspeed_shm_comm"
BUILD_STARTS_WITHIN_S = 600  # the job waits for a node, starts torchrun and imports DeepSpeed first


def _log(run) -> str:
    return run.stdout_path.read_text() if run.stdout_path and run.stdout_path.exists() else "(no log yet)"


def _wait_for_build_lock(run, lock: Path) -> None:
    """Return once torch's build lock exists; fail if the job ends first or the build never starts."""
    deadline = time.monotonic() + BUILD_STARTS_WITHIN_S
    while not lock.exists():
        [info] = query_runs([run])
        assert not info.finished, f"the job ended ({info.state}) before it started building the op:\n{_log(run)[-3000:]}"
        assert time.monotonic() < deadline, f"no build lock after {BUILD_STARTS_WITHIN_S} s:\n{_log(run)[-3000:]}"
        time.sleep(0.2)


def test_the_job_after_one_killed_mid_build_clears_the_lock_and_completes(local_cluster, tmp_path, monkeypatch):
    # Jobs inherit the submitter's environment: both build into this empty folder, not the venv's prebuilt one.
    monkeypatch.setenv(EXTENSIONS_VARIABLE, str(tmp_path / "ops"))
    lock = tmp_path / "ops" / OP_FOLDER / TORCH_LOCK
    experiment = get_experiment(EXPERIMENT)

    [killed] = submit_experiments([experiment], "tiny", root=tmp_path / "killed", backend="slurm")
    _wait_for_build_lock(killed, lock)
    assert cancel_runs([experiment], root=tmp_path / "killed")
    [info] = wait_for_runs([killed], timeout=300, progress=False)
    assert info.state == "CANCELLED", info.state
    assert lock.exists(), "the cancelled build removed its lock: this test no longer provokes the fault"

    [after] = submit_experiments([experiment], "tiny", root=tmp_path / "after", backend="slurm")
    [info] = wait_for_runs([after], timeout=900, progress=False)
    log = _log(after)
    assert info.state == "COMPLETED", f"{info.state}:\n{log[-3000:]}"
    assert f"removed the stale build lock {lock}" in log
    assert not lock.exists()
    assert (tmp_path / "ops" / OP_FOLDER / f"{OP_FOLDER}.so").exists()
