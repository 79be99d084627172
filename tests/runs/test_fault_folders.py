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
import socket
import subprocess
import time
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


# ---- the late job: created by the controller after the re-run submitted its own --------------------------
def late_sbatch(folder: Path) -> tuple[dict, Path]:
    """PATH with an `sbatch` whose request reaches the controller late: it hands the submission to a process of
    its own (as a controller still working on a request would), says so in `<gate>.sent`, and blocks until it
    is stopped or the gate opens. The job is created once the test creates `<gate>.go`; its id is written to `<gate>.id`."""
    folder.mkdir(parents=True, exist_ok=True)
    gate = folder / "gate"
    wrapper = folder / "sbatch"
    # sbatch reads the script before it sends the request: the late job runs that copy. Both parts end when the
    # gate opens, or after two minutes if the test stopped before (nothing outlives the test for long).
    wait_for_gate = f"for i in $(seq 1200); do [ -e {gate}.go ] && break; sleep 0.1; done; [ -e {gate}.go ]"
    wrapper.write_text(
        "#!/bin/bash\n"
        f'cp "${{@: -1}}" {folder}/sent.sbatch\n'
        f"setsid bash -c '{wait_for_gate} && "
        f"{shutil.which('sbatch')} \"$@\" {folder}/sent.sbatch > {gate}.id.tmp 2> {gate}.err "
        f"&& mv {gate}.id.tmp {gate}.id' late-sbatch \"${{@:1:$#-1}}\" &\n"
        f"touch {gate}.sent\n"
        f"{wait_for_gate}\n")
    wrapper.chmod(0o755)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}, gate


def interrupted_then_resubmitted(tmp_path: Path, interrupt: signal.Signals):
    """A submitter stopped while its sbatch request is on its way, a re-run that submits and completes the run,
    then the first request's job created late (held, in the run folder). Returns (profile, root, run, late id)."""
    profile = fault_profile(tmp_path / "profile", seconds=0.5)
    root = tmp_path / "runs"
    environment, gate = late_sbatch(tmp_path / "bin")
    first = notebook(profile, root, [THIRD], **environment)
    wait_until(lambda: Path(f"{gate}.sent").exists(), 30, "sbatch to be called")
    first.send_signal(interrupt)
    first.wait(timeout=30)
    assert (runs_module.run_directory(THIRD, root) / RESERVATION_NAME).exists()
    rerun = submit_experiment(THIRD, load_profile(profile), root=root, backend="slurm")
    assert rerun.submitted_now, rerun.note
    assert wait_for_runs([rerun], timeout=90, progress=False)[0].state == "COMPLETED"
    Path(f"{gate}.go").touch()
    late = wait_until(lambda: Path(f"{gate}.id").exists() and Path(f"{gate}.id").read_text().strip(), 30,
                      "the late job")
    assert job_state(late) == "PENDING"
    return profile, root, rerun, late


@pytest.mark.parametrize("interrupt, finder", [(signal.SIGKILL, "cancel"), (signal.SIGINT, "reuse")])
def test_a_late_job_of_an_interrupted_submission_is_seen_by_status_and_cancelled(local_cluster, tmp_path,
                                                                                  interrupt, finder, capsys):
    profile, root, rerun, late = interrupted_then_resubmitted(tmp_path, interrupt)
    [status] = run_status([THIRD], root=root)
    assert status.state == "COMPLETED" and status.job_id == rerun.record.job_id
    assert f"job {late} (PENDING, held) waits in this run folder" in status.explanation
    if finder == "cancel":
        assert main(["cancel", THIRD.id, "--runs-dir", str(root)]) == 0
        assert f"cancelled job {late}" in capsys.readouterr().out
    else:
        reused = submit_experiment(THIRD, load_profile(profile), root=root, backend="slurm")
        assert "reused" in reused.note and f"cancelled job {late}" in reused.note
    assert job_state(late) == "CANCELLED"
    assert "waits in this run folder" not in run_status([THIRD], root=root)[0].explanation
    assert progress_jobs(load_run(THIRD, root)) == {rerun.record.job_id}


def test_a_job_the_record_does_not_name_stops_at_its_start_instead_of_overwriting_the_run(local_cluster, tmp_path):
    profile = fault_profile(tmp_path / "profile", seconds=0.5)
    root = tmp_path / "runs"
    run = submit_experiment(THIRD, load_profile(profile), root=root, backend="slurm")
    assert wait_for_runs([run], timeout=90, progress=False)[0].state == "COMPLETED"
    before = (run.directory / "train" / "progress.txt").read_text()
    # The run's own script, submitted again into its folder and released (by hand, or a late job released).
    other = subprocess.run(["sbatch", "--parsable", f"--chdir={run.directory}", str(run.directory / "job.sbatch")],
                           capture_output=True, text=True, check=True).stdout.strip()
    wait_until(lambda: job_state(other) in ("FAILED", "COMPLETED"), 60, "the second job to end")
    assert job_state(other) == "FAILED"
    assert (run.directory / "train" / "progress.txt").read_text() == before
    assert "names another job of this run" in (run.directory / f"slurm-{other}.out").read_text()
    assert load_run(THIRD, root).record.job_id == run.record.job_id


def test_a_submitter_clock_ahead_of_the_controller_still_adopts_its_job(local_cluster, tmp_path):
    profile = fault_profile(tmp_path / "profile", seconds=0.5)
    root = tmp_path / "runs"
    directory = runs_module.run_directory(THIRD, root)
    staged = runs_module.prepare_run_directory(THIRD, load_profile(profile), directory / ".next")
    # The submitter noted its reservation 1.5 s ahead of the controller's clock, then stopped after sbatch.
    reservation = {"reserved_at": time.time() + 1.5, "backend": "slurm", "experiment_id": THIRD.id,
                   "content_hash": THIRD.content_hash, "profile": "tiny", "sbatch_args": ["--open-mode=append"]}
    held = subprocess.run(["sbatch", "--parsable", "--hold", f"--chdir={directory}", "--open-mode=append",
                           str(staged)], capture_output=True, text=True, check=True).stdout.strip()
    # While its submitter runs (this process, here), status says the job is being submitted.
    runs_module.write_atomically(directory / RESERVATION_NAME, json.dumps(
        {**reservation, "pid": os.getpid(), "host": socket.gethostname()}) + "\n")
    assert "is being submitted right now" in run_status([THIRD], root=root)[0].explanation
    runs_module.write_atomically(directory / RESERVATION_NAME, json.dumps(reservation) + "\n")
    [waiting] = run_status([THIRD], root=root)  # not "NOT SUBMITTED": its job waits, held
    assert (waiting.state, waiting.job_id) == ("PENDING", held) and "held" in waiting.explanation
    adopted = submit_experiment(THIRD, load_profile(profile), root=root, backend="slurm")
    assert f"adopted job {held}" in adopted.note
    assert wait_for_runs([adopted], timeout=90, progress=False)[0].state == "COMPLETED"
    assert scheduler_jobs(directory) - cancelled_jobs(directory) == {held}
