"""Fault injection on the real local SLURM cluster: a participant's bad day, case by case.

Each case drives the project's own submit path (rendered scripts of the tiny profile, `runs.py`, the SLURM
backend) and asserts what the design promises: no duplicate job (counted by squeue and sacct, by job name
and run folder), no lost or overwritten output, and the right state and explanation shown.

The training is replaced by a launcher that sleeps and appends `<job id> <restart count> <i>` lines to
`train/progress.txt` (two jobs writing into one folder would show up there); everything else in the job
script is the real one. The cases share the session's cluster: the TIMEOUT job is submitted early and
checked last, so its minute of waiting overlaps the other cases.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from workshop_lib import runs as runs_module
from workshop_lib.cli import main
from workshop_lib.experiments import get_experiment
from workshop_lib.sites.profiles import PROFILES_DIR, load_profile
from workshop_lib.runs import load_run, run_status, submit_experiment, wait_for_runs
from workshop_lib.core.run_directory import RESERVATION_NAME

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

BASELINE = get_experiment("fsdp/baseline")
SECOND = get_experiment("zero/baseline")
THIRD = get_experiment("zero/single-gpu/zero0")

# A "notebook": submit, print what happened, optionally wait. Killed with SIGKILL by the tests, or interrupted.
# Ctrl-C reaches it as in a kernel even where the test run itself ignores SIGINT (a `make test &` in a script
# starts with SIGINT ignored, and its children inherit that: the interrupt cases then saw no interrupt at all).
NOTEBOOK = """
import json, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
from workshop_lib.experiments import get_experiment
from workshop_lib.runs import submit_experiments, wait_for_runs
profile, root, wait = sys.argv[1], sys.argv[2], sys.argv[3] == "wait"
runs = submit_experiments([get_experiment(i) for i in sys.argv[4:]], profile, root=root, backend="slurm")
print(json.dumps({r.experiment.id: [r.record.job_id if r.record else None, r.note] for r in runs}), flush=True)
if wait:
    wait_for_runs(runs, timeout=120, progress=False)
"""


def fault_profile(folder: Path, seconds: float = 3, status: int = 0, allocate_mib: int = 0,
                  time_limit: str = "00:10:00") -> Path:
    """The tiny profile with a launcher that writes progress lines for `seconds`, then allocates memory,
    fails with a Python traceback, or exits 0."""
    folder.mkdir(parents=True, exist_ok=True)
    launcher = folder / "launcher"
    lines = ["#!/bin/bash",
             f'for i in $(seq 1 {int(seconds * 2)}); do echo "$SLURM_JOB_ID ${{SLURM_RESTART_COUNT:-0}} $i" '
             '>> train/progress.txt; sleep 0.5; done']
    if allocate_mib:
        lines.append(f'python3 -c "import time; x = b\\"1\\" * ({allocate_mib} * 2**20); time.sleep(30)"')
    if status:
        lines.append('python3 -c "raise ValueError(\'the injected failure\')"')
    lines.append(f"exit {status}")
    launcher.write_text("\n".join(lines) + "\n")
    launcher.chmod(launcher.stat().st_mode | stat.S_IXUSR)
    data = yaml.safe_load((PROFILES_DIR / "tiny.yml").read_text())
    data["python"]["torchrun"] = str(launcher)
    data["scheduler"]["time_limits"] = {chapter: time_limit for chapter in (1, 2, 3, 4)}
    path = folder / "tiny.yml"
    path.write_text(yaml.safe_dump(data))
    assert load_profile(path).name == "tiny"
    return path


def notebook(profile: Path, root: Path, experiments, wait: bool = False, **env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", NOTEBOOK, str(profile), str(root), "wait" if wait else "no",
                             *(e.id for e in experiments)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, **env})


def scheduler_jobs(directory: Path) -> set[str]:
    """Ids of every job whose working directory is `directory`, from squeue and (where kept) sacct."""
    found = set()
    listed = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i|%j|%Z"], capture_output=True, text=True)
    accounted = subprocess.run(["sacct", "-n", "-P", "-X", "-a", "-S", "now-3hours", "-o", "JobID,JobName,WorkDir"],
                               capture_output=True, text=True)
    for output in (listed.stdout, accounted.stdout if accounted.returncode == 0 else ""):
        for line in output.splitlines():
            job_id, name, workdir = (line.split("|") + ["", "", ""])[:3]
            if workdir == str(directory):
                found.add(job_id)
    return found


def wait_until(condition, timeout: float = 60, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def job_state(job_id: str) -> str:
    result = subprocess.run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"], capture_output=True, text=True)
    return result.stdout.strip()


def running_record(root: Path, experiment):
    """The run's record once its job runs."""
    def ready():
        run = load_run(experiment, root)
        return run if run.record and job_state(run.record.job_id) == "RUNNING" else None
    return wait_until(ready, 60, f"{experiment.id} to run")


def killed_while_running(profile: Path, root: Path, experiment):
    """A notebook that submitted `experiment` and waits, killed with SIGKILL once the job runs; the run."""
    waiting = notebook(profile, root, [experiment], wait=True)
    running = running_record(root, experiment)
    waiting.send_signal(signal.SIGKILL)
    waiting.wait()
    return running


def progress_jobs(run) -> set[str]:
    lines = (run.directory / "train" / "progress.txt").read_text().split("\n")
    return {line.split()[0] for line in lines if line.strip()}


# ---- node failure (first: it needs both nodes free) ---------------------------------------------
def test_a_node_set_down_mid_job_requeues_it_and_keeps_both_attempts(local_cluster, tmp_path):
    profile = fault_profile(tmp_path / "profile", seconds=5)
    root = tmp_path / "runs"
    run = submit_experiment(BASELINE, profile, root=root, backend="slurm")
    running = running_record(root, BASELINE)
    node = subprocess.run(["squeue", "-h", "-j", run.record.job_id, "-o", "%N"], capture_output=True,
                          text=True).stdout.strip()
    wait_until(lambda: (running.directory / "train" / "progress.txt").exists(), 30, "the first attempt's output")
    subprocess.run(["scontrol", "update", f"nodename={node}", "state=down", "reason=fault-injection"], check=True)
    try:
        # SLURM requeues it and starts it again after cred_expire (10 s on the local cluster).
        [info] = wait_for_runs([run], timeout=90, progress=False)
    finally:
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], capture_output=True)
    assert info.state == "COMPLETED"
    log = run.stdout_path.read_text()
    assert log.count(f"Job {run.record.job_id} (") == 2, log  # --open-mode=append: both attempts' lines
    restarts = {line.split()[1] for line in (run.directory / "train" / "progress.txt").read_text().splitlines()}
    assert restarts == {"0", "1"}
    assert scheduler_jobs(run.directory) == {run.record.job_id}
    assert runs_module.earlier_attempts(run) == (f"NODE_FAIL on {node}",)
    [status] = run_status([BASELINE], root=root)
    assert status.state == "COMPLETED" and f"NODE_FAIL on {node}" in status.explanation


# ---- --time exceeded: submitted now, checked at the end --------------------------------------------
TIMEOUT_CASE: dict = {}


def test_time_limit_job_is_submitted(local_cluster, tmp_path_factory):
    folder = tmp_path_factory.mktemp("timeout")
    profile = fault_profile(folder / "profile", seconds=300, time_limit="00:01:00")
    run = submit_experiment(BASELINE, profile, root=folder / "runs", backend="slurm")
    assert run.submitted_now
    TIMEOUT_CASE.update(run=run, root=folder / "runs")


# ---- a notebook killed ----------------------------------------------------------------------------
def test_kill_9_mid_wait_then_rerun_neither_doubles_nor_loses_the_job(local_cluster, tmp_path):
    profile = fault_profile(tmp_path / "profile", seconds=4)
    root = tmp_path / "runs"
    running = killed_while_running(profile, root, SECOND)
    again = submit_experiment(SECOND, load_profile(profile), root=root, backend="slurm")
    assert not again.submitted_now and again.record.job_id == running.record.job_id and "not doubled" in again.note
    [info] = wait_for_runs([again], timeout=90, progress=False)
    assert info.state == "COMPLETED"
    assert scheduler_jobs(again.directory) == {again.record.job_id}
    assert progress_jobs(again) == {again.record.job_id}
    assert not (again.directory / "attempts").exists()
    reused = submit_experiment(SECOND, load_profile(profile), root=root, backend="slurm")
    assert "reused" in reused.note


def test_kill_9_between_sbatch_and_job_json_adopts_the_held_job(local_cluster, tmp_path):
    profile = fault_profile(tmp_path / "profile", seconds=1)
    root = tmp_path / "runs"
    crashed = notebook(profile, root, [THIRD], WORKSHOP_FAULT="after-submit")
    crashed.wait(timeout=60)
    assert crashed.returncode == -signal.SIGKILL
    directory = load_run(THIRD, root).directory
    assert (directory / RESERVATION_NAME).exists() and not (directory / "job.json").exists()
    [held] = wait_until(lambda: scheduler_jobs(directory), 10, "the held job")
    assert job_state(held) == "PENDING"  # submitted held: nothing ran before the folder was recorded
    adopted = submit_experiment(THIRD, load_profile(profile), root=root, backend="slurm")
    assert not adopted.submitted_now and adopted.record.job_id == held and "adopted" in adopted.note
    [info] = wait_for_runs([adopted], timeout=90, progress=False)
    assert info.state == "COMPLETED"
    assert scheduler_jobs(directory) == {held} and progress_jobs(adopted) == {held}
    assert not (directory / RESERVATION_NAME).exists() and not (directory / ".next").exists()


def test_kill_9_after_recording_but_before_release_releases_instead_of_resubmitting(local_cluster, tmp_path):
    profile = fault_profile(tmp_path / "profile", seconds=1)
    root = tmp_path / "runs"
    crashed = notebook(profile, root, [THIRD], WORKSHOP_FAULT="before-release")
    crashed.wait(timeout=60)
    run = load_run(THIRD, root)
    assert run.record is not None and job_state(run.record.job_id) == "PENDING"
    again = submit_experiment(THIRD, load_profile(profile), root=root, backend="slurm")
    assert "released" in again.note and again.record.job_id == run.record.job_id
    assert wait_for_runs([again], timeout=90, progress=False)[0].state == "COMPLETED"
    assert scheduler_jobs(run.directory) == {run.record.job_id}


# ---- two notebooks at once ------------------------------------------------------------------------
def test_two_notebooks_started_together_submit_each_experiment_once(local_cluster, tmp_path):
    profile = fault_profile(tmp_path / "profile", seconds=1)
    root = tmp_path / "runs"
    experiments = [BASELINE, SECOND, THIRD]
    notebooks = [notebook(profile, root, experiments) for _ in range(2)]
    answers = [json.loads(process.communicate(timeout=120)[0].splitlines()[-1]) for process in notebooks]
    for experiment in experiments:
        ids = {answer[experiment.id][0] for answer in answers}
        assert len(ids) == 1, answers  # both notebooks name the same job
        notes = sorted(answer[experiment.id][1] for answer in answers)
        assert notes[0].startswith("job ") and "not doubled" in notes[0] or "reused" in notes[0], notes
        assert notes[1].startswith("submitted job"), notes
        assert scheduler_jobs(load_run(experiment, root).directory) == ids
    runs = [load_run(experiment, root) for experiment in experiments]
    assert {info.state for info in wait_for_runs(runs, timeout=120, progress=False)} == {"COMPLETED"}


# ---- the scheduler unreachable during a re-run -----------------------------------------------------
def test_controller_down_during_a_rerun_archives_nothing_and_submits_nothing(local_cluster, tmp_path, capsys):
    profile = fault_profile(tmp_path / "profile", seconds=6)
    root = tmp_path / "runs"
    running = killed_while_running(profile, root, BASELINE)
    local_cluster._stop("slurmctld")
    local_cluster._stop("slurmdbd")
    try:
        again = submit_experiment(BASELINE, load_profile(profile), root=root, backend="slurm")
        assert not again.submitted_now and "does not answer" in again.note
        assert again.record.job_id == running.record.job_id and not (again.directory / "attempts").exists()
        assert again.stdout_path.exists()  # the running job's output stays where it is
        assert main(["status", "--runs-dir", str(root), BASELINE.id]) == 0
        shown = capsys.readouterr().out
        assert "UNKNOWN" in shown and "does not answer" in shown
        from workshop_lib.core.errors import SubmitError

        with pytest.raises(SubmitError, match="nothing was submitted"):
            submit_experiment(SECOND, load_profile(profile), root=root, backend="slurm")
        untouched = load_run(SECOND, root).directory
        assert sorted(p.name for p in untouched.iterdir()) == [".lock"]  # no record, reservation or staging
    finally:
        local_cluster.up(nodes=2)
    after = submit_experiment(BASELINE, load_profile(profile), root=root, backend="slurm")
    assert not after.submitted_now and after.record.job_id == running.record.job_id
    assert wait_for_runs([after], timeout=90, progress=False)[0].state == "COMPLETED"
    assert scheduler_jobs(after.directory) == {after.record.job_id} and progress_jobs(after) == {after.record.job_id}


# ---- failures that explain themselves ------------------------------------------------------------
def test_a_job_over_its_memory_is_killed_and_explained(local_cluster, tmp_path):
    profile = fault_profile(tmp_path / "profile", seconds=1, allocate_mib=400)
    small = dataclasses.replace(THIRD, memory="100M")
    run = submit_experiment(small, load_profile(profile), root=tmp_path / "runs", backend="slurm")
    [info] = wait_for_runs([run], timeout=90, progress=False)
    assert info.state in ("OUT_OF_MEMORY", "FAILED")  # FAILED (signal 9) where SLURM has no cgroups
    explanation = runs_module.explain_run(run, info)
    assert "--mem" in explanation.hint and "lower the per-device batch" in explanation.hint
    assert any("memory limit" in text for _, text in explanation.log_lines)


def test_a_failed_job_shows_its_traceback_not_the_footer(local_cluster, tmp_path, capsys):
    profile = fault_profile(tmp_path / "profile", seconds=1, status=3)
    root = tmp_path / "runs"
    assert main(["submit", "--profile", str(profile), "--runs-dir", str(root), "--backend", "slurm", "--wait",
                 SECOND.id]) == 1
    shown = capsys.readouterr().out
    assert "FAILED: exit code 3" in shown
    assert "ValueError: the injected failure" in shown and "Traceback" in shown
    assert "Exit status" not in shown and "Hint:" in shown


# ---- accounting off, and the controller has forgotten the job ------------------------------------
def test_time_limit_exceeded_is_timeout_with_the_limit_in_the_explanation(local_cluster):
    run, root = TIMEOUT_CASE["run"], TIMEOUT_CASE["root"]
    [info] = wait_for_runs([run], timeout=240, progress=False)
    assert info.state == "TIMEOUT" and run.job.accounting().state == "TIMEOUT"
    [status] = run_status([BASELINE], root=root)
    assert "of its 00:01:00 limit" in status.explanation and "raise the limit" in status.explanation
    assert "DUE TO TIME LIMIT" in status.explanation  # the log line that says so, not the footer


def test_without_accounting_a_forgotten_job_is_settled_from_its_footer(local_cluster, tmp_path):
    local_cluster.up(nodes=2, accounting=False, min_job_age=2)
    try:
        ok, failing = fault_profile(tmp_path / "ok", seconds=0.5), fault_profile(tmp_path / "bad", seconds=0.5,
                                                                                    status=3)
        root = tmp_path / "runs"
        completed = submit_experiment(BASELINE, ok, root=root, backend="slurm")
        failed = submit_experiment(SECOND, failing, root=root, backend="slurm")
        for run in (completed, failed):  # nobody waited: job.json has no final state
            wait_until(lambda: not job_state(run.record.job_id), 120, "the controller to forget the job")
            assert load_run(run.experiment, root).record.final_state is None
        again = submit_experiment(BASELINE, ok, root=root, backend="slurm")
        assert not again.submitted_now and "reused" in again.note  # the footer said exit 0
        retried = submit_experiment(SECOND, failing, root=root, backend="slurm")
        assert retried.submitted_now  # the footer said exit 3: FAILED, so submitted again...
        [archived] = (retried.directory / "attempts").iterdir()  # ...with the failed attempt kept
        assert json.loads((archived / "job.json").read_text())["final_state"] == "FAILED"
        assert "Exit status: 3" in (archived / f"slurm-{failed.record.job_id}.out").read_text()
        assert len(list(completed.directory.glob("slurm-*.out"))) == 1
        wait_for_runs([retried], timeout=90, progress=False)
    finally:
        local_cluster.up(nodes=2, accounting=True)


# ---- interrupted between reserving and recording: every point, one job in the end -------------------
# The earlier attempt's job: an id a fresh cluster does not hand out again during the session (with "1", the
# first job of a fresh cluster took the failed attempt's id and was mistaken for it).
PREVIOUS_JOB = "4000001"


def previous_failed_attempt(directory: Path, experiment) -> None:
    """The files of an earlier attempt that failed (its record, log and metrics), for the archive to keep."""
    (directory / "train").mkdir(parents=True)
    record = runs_module.RunRecord(experiment_id=experiment.id, content_hash=experiment.content_hash, profile="tiny",
                                   job_id=PREVIOUS_JOB, backend="slurm", submitted_at="2026-11-20T10:00:00+00:00",
                                   final_state="FAILED", exit_code=3)
    record.save(directory)
    (directory / f"slurm-{PREVIOUS_JOB}.out").write_text("Exit status: 3\n")
    (directory / "train" / "metrics.jsonl").write_text('{"step": 1, "loss": 9.0}\n')


def gated_sbatch(folder: Path, stop: str) -> dict:
    """PATH with an `sbatch` that stops `before` calling the real one, or `after` it submitted but before it
    answers: a controller slow to take or to acknowledge the job. Where it stops it writes `folder/stopped`
    (with the job id, after), the event the test waits for; it goes on once `folder/go` exists (at most 120 s)."""
    import shutil

    folder.mkdir(parents=True, exist_ok=True)
    wait = 'for _ in $(seq 1200); do [ -e "$gate/go" ] && break; sleep 0.1; done'
    stopped = 'printf "%s\\n" "$answer" > "$gate/stopping" && mv "$gate/stopping" "$gate/stopped"'
    wrapper = folder / "sbatch"
    wrapper.write_text("\n".join([
        "#!/bin/bash", f"gate={shlex.quote(str(folder))}", "answer=",
        *([stopped, wait] if stop == "before" else []),
        f'answer=$({shlex.quote(shutil.which("sbatch"))} "$@")', "status=$?",
        *([stopped, wait] if stop == "after" else []),
        'printf "%s\\n" "$answer"', "exit $status"]) + "\n")
    wrapper.chmod(0o755)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


def stopped_in_sbatch(folder: Path) -> str:
    """Once the gated sbatch stopped: what it wrote (the job id when it stopped after submitting)."""
    stopped = folder / "stopped"
    wait_until(stopped.exists, 90, "sbatch to get there")
    return stopped.read_text().strip()


def assert_one_job_and_the_earlier_attempt_kept(root: Path, experiment, profile: Path, expected_note: str):
    again = submit_experiment(experiment, load_profile(profile), root=root, backend="slurm")
    assert expected_note in again.note, again.note
    [info] = wait_for_runs([again], timeout=90, progress=False)
    assert info.state == "COMPLETED"
    directory = again.directory
    assert scheduler_jobs(directory) - cancelled_jobs(directory) == {again.record.job_id}
    assert progress_jobs(again) == {again.record.job_id}
    assert not (directory / RESERVATION_NAME).exists() and not (directory / ".next").exists()
    [kept] = (directory / "attempts").iterdir()  # the failed attempt, whole, in one folder
    assert json.loads((kept / "job.json").read_text())["job_id"] == PREVIOUS_JOB
    assert (kept / "train" / "metrics.jsonl").read_text() == '{"step": 1, "loss": 9.0}\n'
    assert (kept / f"slurm-{PREVIOUS_JOB}.out").exists()
    return again


def cancelled_jobs(directory: Path) -> set[str]:
    listed = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i|%T|%Z"], capture_output=True, text=True)
    return {line.split("|")[0] for line in listed.stdout.splitlines()
            if line.split("|")[1:] == ["CANCELLED", str(directory)]}


@pytest.mark.parametrize("fault, expected_note", [
    ("after-reserve", "submitted job"),  # nothing reached the scheduler: submitted once, now
    ("after-submit", "adopted job"),  # held job, script still staged
    ("after-submit:int", "adopted job"),  # the same with Ctrl-C
    ("after-archive", "adopted job"),  # the earlier attempt archived, the new files not yet moved in
    ("mid-move", "adopted job"),  # killed between moving one file and the next
    ("after-move", "adopted job"),  # the files moved out of .next/, job.json not written
])
def test_a_submission_stopped_between_reserving_and_recording_ends_with_one_job(local_cluster, tmp_path, fault,
                                                                               expected_note):
    profile = fault_profile(tmp_path / "profile", seconds=0.5)
    root = tmp_path / "runs"
    previous_failed_attempt(runs_module.run_directory(THIRD, root), THIRD)
    crashed = notebook(profile, root, [THIRD], WORKSHOP_FAULT=fault)
    crashed.wait(timeout=60)
    assert crashed.returncode in (-signal.SIGKILL, -signal.SIGINT)  # killed, or ended by KeyboardInterrupt
    assert (runs_module.run_directory(THIRD, root) / RESERVATION_NAME).exists()
    assert_one_job_and_the_earlier_attempt_kept(root, THIRD, profile, expected_note)


@pytest.mark.parametrize("interrupt", [signal.SIGKILL, signal.SIGINT])
def test_a_submitter_stopped_while_a_slow_sbatch_has_not_answered_leaves_a_job_that_is_adopted(
        local_cluster, tmp_path, interrupt):
    profile = fault_profile(tmp_path / "profile", seconds=0.5)
    root = tmp_path / "runs"
    directory = runs_module.run_directory(THIRD, root)
    previous_failed_attempt(directory, THIRD)
    gate = tmp_path / "bin"
    waiting = notebook(profile, root, [THIRD], **gated_sbatch(gate, stop="after"))
    try:
        held = stopped_in_sbatch(gate)  # submitted, not yet answered
        assert scheduler_jobs(directory) == {held}
        waiting.send_signal(interrupt)
        waiting.wait(timeout=60)
    finally:
        (gate / "go").touch()
    assert (directory / RESERVATION_NAME).exists() and job_state(held) == "PENDING"
    again = assert_one_job_and_the_earlier_attempt_kept(root, THIRD, profile, f"adopted job {held}")
    assert again.record.job_id == held


def test_ctrl_c_before_a_slow_sbatch_submitted_anything_submits_once_on_the_rerun(local_cluster, tmp_path):
    profile = fault_profile(tmp_path / "profile", seconds=0.5)
    root = tmp_path / "runs"
    directory = runs_module.run_directory(THIRD, root)
    previous_failed_attempt(directory, THIRD)
    gate = tmp_path / "bin"
    waiting = notebook(profile, root, [THIRD], **gated_sbatch(gate, stop="before"))
    try:
        stopped_in_sbatch(gate)  # the reservation is written, nothing submitted yet
        assert (directory / ".next" / "job.sbatch").exists() and (directory / RESERVATION_NAME).exists()
        waiting.send_signal(signal.SIGINT)
        waiting.wait(timeout=60)
    finally:
        (gate / "go").touch()
    assert waiting.returncode != 0  # ended by the interrupt, not by finishing the submission
    assert (directory / RESERVATION_NAME).exists()  # it cannot know that sbatch had not submitted yet
    assert scheduler_jobs(directory) == set()
    assert_one_job_and_the_earlier_attempt_kept(root, THIRD, profile, "submitted job")


def test_held_jobs_the_record_does_not_name_are_cancelled_with_a_line_saying_why(local_cluster, tmp_path):
    profile = fault_profile(tmp_path / "profile", seconds=0.5)
    root = tmp_path / "runs"
    directory = runs_module.run_directory(THIRD, root)
    previous_failed_attempt(directory, THIRD)
    script = tmp_path / "orphan.sbatch"
    script.write_text("#!/bin/bash\necho orphan $SLURM_JOB_ID >> train/progress.txt\n")

    def held_job() -> str:
        return subprocess.run(["sbatch", "--parsable", "--hold", f"--chdir={directory}", "--output=/dev/null",
                               str(script)], capture_output=True, text=True, check=True).stdout.strip()

    # No reservation: left by a submitter of an older version, or by hand.
    stray = held_job()
    run = submit_experiment(THIRD, load_profile(profile), root=root, backend="slurm")
    assert f"cancelled job {stray}" in run.note and "job.json does not name it" in run.note
    assert job_state(stray) == "CANCELLED" and run.submitted_now
    assert wait_for_runs([run], timeout=90, progress=False)[0].state == "COMPLETED"
    # Two jobs left by one interrupted submission: neither is the run's only job, so both go.
    runs_module.write_atomically(directory / RESERVATION_NAME, json.dumps(
        {"reserved_at": time.time() - 5, "backend": "slurm", "experiment_id": THIRD.id,
         "content_hash": THIRD.content_hash, "profile": "tiny"}) + "\n")
    first, second = held_job(), held_job()
    reused = submit_experiment(THIRD, load_profile(profile), root=root, backend="slurm")
    assert f"cancelled job {first}" in reused.note and f"cancelled job {second}" in reused.note
    assert "reused" in reused.note and reused.record.job_id == run.record.job_id
    assert job_state(first) == job_state(second) == "CANCELLED"
    assert not (directory / RESERVATION_NAME).exists() and progress_jobs(reused) == {run.record.job_id}
