"""Submission into run directories: render, submit, record, reuse, never double, never lose a result.

These tests run the real rendered scripts through the local executor (job control without a scheduler).
The profile's launcher is swapped for a short shell command so that each job takes about a second;
the scripts, job control and the bookkeeping are the real ones.
"""

from __future__ import annotations

import dataclasses
import json
import stat

import pytest
import yaml

from repo_paths import REPO
from workshop_lib.cli import main
from workshop_lib.experiments import get_experiment
from workshop_lib.sites.profiles import PROFILES_DIR, load_profile
from workshop_lib.core.paths import runs_root
from workshop_lib.runs import (
    NOT_SUBMITTED, RunRecord, run_status, submit_experiment, submit_experiments, wait_for_runs,
)

EXPERIMENT = get_experiment("fsdp/baseline")


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """Local job control with its own state folder and runs root."""
    monkeypatch.setenv("WORKSHOP_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("WORKSHOP_BACKEND", "local")
    monkeypatch.setenv("WORKSHOP_RUNS_DIR", str(tmp_path / "runs"))
    return tmp_path


def quick_profile(tmp_path, seconds: float = 0.2, status: int = 0):
    """The tiny profile with a launcher that sleeps, records its arguments and exits with ``status``."""
    launcher = tmp_path / "launcher"
    launcher.write_text(f"#!/bin/bash\nsleep {seconds}\necho \"$@\" > launched_with.txt\nexit {status}\n")
    launcher.chmod(launcher.stat().st_mode | stat.S_IXUSR)
    data = yaml.safe_load((PROFILES_DIR / "tiny.yml").read_text())
    data["python"]["torchrun"] = str(launcher)
    path = tmp_path / f"quick{status}.yml"
    path.write_text(yaml.safe_dump(data))
    profile = load_profile(path)
    return dataclasses.replace(profile, name="tiny")


def test_runs_root_prefers_argument_then_environment(isolated, tmp_path):
    assert runs_root(tmp_path / "elsewhere") == (tmp_path / "elsewhere").resolve()
    assert runs_root() == (isolated / "runs").resolve()


def test_submit_records_the_job_and_a_completed_run_is_reused(isolated):
    profile = quick_profile(isolated)
    run = submit_experiment(EXPERIMENT, profile)
    assert run.submitted_now
    directory = isolated / "runs" / "fsdp" / "baseline"
    assert run.directory == directory.resolve()
    record = json.loads((directory / "job.json").read_text())
    assert record["experiment_id"] == EXPERIMENT.id and record["content_hash"] == EXPERIMENT.content_hash
    assert record["profile"] == "tiny" and record["job_id"] and record["backend"] == "local"
    assert (directory / "job.sbatch").read_text().startswith("#!/bin/bash")
    [info] = wait_for_runs([run], timeout=60, progress=False)
    assert info.state == "COMPLETED"
    assert "--output-dir train" in (directory / "launched_with.txt").read_text()
    assert (directory / run.record.stdout).is_file() and "Job finished" in (directory / run.record.stdout).read_text()
    assert RunRecord.load(directory).final_state == "COMPLETED"

    again = submit_experiment(EXPERIMENT, profile)
    assert not again.submitted_now and again.record.job_id == run.record.job_id and "reused" in again.note

    forced = submit_experiment(EXPERIMENT, profile, force=True)
    assert forced.submitted_now and forced.record.job_id != run.record.job_id
    [archived] = (directory / "attempts").iterdir()  # <job id>-<submit time>: a reused id cannot collide
    assert archived.name.startswith(f"{run.record.job_id}-")
    assert json.loads((archived / "job.json").read_text())["final_state"] == "COMPLETED"
    assert "Job finished" in (archived / run.record.stdout).read_text()
    assert not (directory / run.record.stdout).exists()  # the new attempt starts with a clean folder
    wait_for_runs([forced], timeout=60, progress=False)


def test_a_changed_experiment_or_a_failed_run_is_submitted_again(isolated):
    failing = quick_profile(isolated, status=3)
    first = submit_experiment(EXPERIMENT, failing)
    assert wait_for_runs([first], timeout=60, progress=False)[0].state == "FAILED"
    retried = submit_experiment(EXPERIMENT, quick_profile(isolated))
    assert retried.submitted_now
    wait_for_runs([retried], timeout=60, progress=False)
    changed = dataclasses.replace(EXPERIMENT, per_device_batch=2)
    assert submit_experiment(changed, quick_profile(isolated)).submitted_now


def test_an_active_run_is_never_doubled_even_with_force(isolated):
    slow = quick_profile(isolated, seconds=5)
    first = submit_experiment(EXPERIMENT, slow)
    second = submit_experiment(EXPERIMENT, slow, force=True)
    assert not second.submitted_now and second.record.job_id == first.record.job_id
    assert "not doubled" in second.note
    first.job.cancel()
    wait_for_runs([first], timeout=60, progress=False)


def test_status_and_skipping_experiments_outside_the_grid(isolated, capsys):
    profile = quick_profile(isolated)
    outside = get_experiment("fsdp/multi-node/8-nodes")
    runs = submit_experiments([EXPERIMENT, outside], profile)
    assert runs[0].submitted_now and not runs[1].submitted_now and "skipped" in runs[1].note
    wait_for_runs(runs, timeout=60, progress=False)
    states = {status.experiment_id: status.state for status in run_status([EXPERIMENT, outside])}
    assert states == {EXPERIMENT.id: "COMPLETED", outside.id: NOT_SUBMITTED}
    assert main(["status", "--chapter", "4"]) == 0
    out = capsys.readouterr().out
    assert "fsdp/baseline" in out and "COMPLETED" in out and NOT_SUBMITTED in out


def test_the_notebook_side_never_imports_torch():
    import subprocess
    import sys

    code = ("import sys, workshop_lib.runs, workshop_lib.scripts, workshop_lib.checks.experiment_rules, "
            "workshop_lib.checks.lint, workshop_lib.cli.experiments; print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_a_lost_local_job_counts_as_failed_and_is_resubmitted(tmp_path, monkeypatch):
    """A run whose job record vanished (state folder wiped) and whose log has no footer is LOST:
    ended, so it does not block a new submission."""
    import json

    from workshop_lib.experiments import get_experiment
    from workshop_lib.runs import load_run

    monkeypatch.setenv("WORKSHOP_STATE_DIR", str(tmp_path / "state"))
    experiment = get_experiment("zero/baseline")
    folder = tmp_path / "runs" / experiment.id
    folder.mkdir(parents=True)
    (folder / "job.json").write_text(json.dumps({
        "job_id": "local-99", "backend": "local", "experiment_id": experiment.id,
        "content_hash": experiment.content_hash, "profile": "tiny", "submitted_at": "2026-01-01T00:00:00+00:00"}))
    run = load_run(experiment, tmp_path / "runs")
    assert run.record is not None
    info = run.info()
    assert info.state == "LOST" and "no footer" in info.reason
    (folder / "slurm-local-99.out").write_text("training...\n Exit status: 0\n")
    assert run.info().state == "COMPLETED"  # the job's own footer decides, not its absence


def test_a_damaged_job_json_affects_its_own_row_only_and_says_how_to_recover(isolated, capsys):
    profile = quick_profile(isolated)
    damaged_experiment = get_experiment("fsdp/single-gpu/full-shard")
    runs = submit_experiments([EXPERIMENT, damaged_experiment], profile)
    wait_for_runs(runs, timeout=60, progress=False)
    record = runs[1].directory / "job.json"
    record.write_text(record.read_text()[:40])  # a half-written file, as a crash mid-write left it before
    statuses = {status.experiment_id: status for status in run_status([EXPERIMENT, damaged_experiment])}
    assert statuses[EXPERIMENT.id].state == "COMPLETED"
    damaged = statuses[damaged_experiment.id]
    assert damaged.state == "DAMAGED" and "job.json is damaged" in damaged.explanation
    assert f"slurm-{runs[1].record.job_id}.out" in damaged.explanation
    # The job completed: the advice keeps it (renaming job.json would run the experiment again).
    assert "Exit status: 0" in damaged.explanation and "Leave job.json as it is" in damaged.explanation
    assert main(["status", EXPERIMENT.id, damaged_experiment.id]) == 0
    assert "DAMAGED" in capsys.readouterr().out
    kept = submit_experiment(damaged_experiment, profile)
    assert not kept.submitted_now and "damaged" in kept.note  # an unreadable record may hide an active job
    record.rename(record.with_name("job.json.damaged"))  # how to run it again (the advice for a failed job)
    again = submit_experiment(damaged_experiment, profile)
    assert again.submitted_now
    [archived] = (again.directory / "attempts").iterdir()
    assert archived.name.startswith("unrecorded-") and (archived / "job.json.damaged").is_file()
    assert (archived / runs[1].record.stdout).is_file()  # nothing of the earlier run is lost
    wait_for_runs([again], timeout=60, progress=False)


def test_status_writes_nothing(isolated):
    profile = quick_profile(isolated)
    [run] = submit_experiments([EXPERIMENT], profile)
    wait_for_runs([run], timeout=60, progress=False)
    directory = run.directory
    record = json.loads((directory / "job.json").read_text())
    record["final_state"] = None  # as if nobody had waited for the job
    (directory / "job.json").write_text(json.dumps(record))

    def snapshot():
        return {path: (path.stat().st_mtime_ns, path.read_bytes()) for path in directory.rglob("*") if path.is_file()}

    before = snapshot()
    [status] = run_status([EXPERIMENT])
    assert status.state == "COMPLETED"
    assert snapshot() == before  # status asks the scheduler but records nothing


def test_a_reused_job_id_never_overwrites_an_earlier_attempt(isolated, monkeypatch):
    failing = quick_profile(isolated, status=3)
    first = submit_experiment(EXPERIMENT, failing)
    assert wait_for_runs([first], timeout=60, progress=False)[0].state == "FAILED"
    # A fresh scheduler state: job ids start again at 1.
    monkeypatch.setenv("WORKSHOP_STATE_DIR", str(isolated / "fresh-state"))
    second = submit_experiment(EXPERIMENT, failing)
    assert second.submitted_now and second.record.job_id == first.record.job_id
    assert wait_for_runs([second], timeout=60, progress=False)[0].state == "FAILED"
    monkeypatch.setenv("WORKSHOP_STATE_DIR", str(isolated / "fresher-state"))
    third = submit_experiment(EXPERIMENT, quick_profile(isolated))
    assert third.record.job_id == first.record.job_id
    attempts = sorted((third.directory / "attempts").iterdir())
    assert len(attempts) == 2 and all(a.name.startswith(f"{first.record.job_id}-") for a in attempts)
    for attempt in attempts:
        assert "Exit status: 3" in (attempt / first.record.stdout).read_text()
    wait_for_runs([third], timeout=60, progress=False)


def test_submit_from_a_subfolder_writes_where_the_chapter_reads(isolated, monkeypatch):
    from workshop_lib.core.paths import repository_root, runs_root as shared_runs_root

    monkeypatch.delenv("WORKSHOP_RUNS_DIR")
    monkeypatch.chdir(repository_root() / "notebooks")
    assert runs_root() == shared_runs_root() == repository_root() / "runs"


def test_the_notebook_explains_a_failed_run_without_a_checks_passed_badge(isolated, capsys):
    from workshop_lib.book.chapter.facade import Selection, run_experiments

    failing = quick_profile(isolated, status=3)
    selection = Selection(4, failing, (EXPERIMENT,), (EXPERIMENT,), ())
    [run] = run_experiments(selection, wait_timeout_s=60, progress=False)
    shown = capsys.readouterr().out
    assert "why it did not complete" in shown and "FAILED: exit code 3" in shown and "Hint:" in shown
    assert "checks passed" not in shown and "Still running" not in shown and "still queued" not in shown
    assert "ended without completing" in shown


def test_a_view_of_two_failed_runs_asks_sacct_once_for_both(isolated, monkeypatch, capsys):
    """`workshop status`, the notebook's table and `workshop submit --wait` explain every failed run
    with its earlier attempts, asking sacct once for the whole view, never again per run."""
    from workshop_lib.jobs import slurm as slurm_backend
    from workshop_lib.cli.experiments import _print_explanations
    from workshop_lib.book.chapter.your_runs import show_run_table
    from workshop_lib.runs import load_run
    from workshop_lib.jobs.slurm_output import JobInfo

    asked = []

    def accounting(job_ids, duplicates=False, origin=None):  # sacct -D: job 7 was requeued after NODE_FAIL
        asked.append(sorted(job_ids))
        return {"7#0": JobInfo(job_id="7", state="NODE_FAIL", node_list="node1"),
                "7#1": JobInfo(job_id="7", state="FAILED", exit_code=3)}

    monkeypatch.setattr(slurm_backend.BACKEND, "accounting", accounting)
    experiments = [get_experiment("fsdp/baseline"), get_experiment("zero/baseline")]
    for job_id, experiment in zip(("7", "8"), experiments):
        folder = isolated / "runs" / experiment.id
        folder.mkdir(parents=True)
        RunRecord(experiment.id, experiment.content_hash, "tiny", job_id, "slurm", "2026-01-01T00:00:00+00:00",
                  final_state="FAILED", exit_code=3).save(folder)

    statuses = run_status(experiments)
    assert [status.state for status in statuses] == ["FAILED", "FAILED"]
    assert "earlier attempt: NODE_FAIL on node1" in statuses[0].explanation
    assert "earlier attempt" not in statuses[1].explanation and "exit code 3" in statuses[1].explanation
    assert asked == [["7", "8"]]

    runs = [load_run(experiment) for experiment in experiments]
    asked.clear()
    show_run_table(runs)
    assert asked == [["7", "8"]] and "earlier attempt: NODE_FAIL on node1" in capsys.readouterr().out
    asked.clear()
    _print_explanations(runs, [run.info() for run in runs])
    assert asked == [["7", "8"]] and "earlier attempt: NODE_FAIL on node1" in capsys.readouterr().out


def test_the_callers_job_name_and_output_decide_the_record_and_its_log(isolated, monkeypatch):
    """--job-name and --output given to submit win over the script's directives: job.json names the job
    and the log as the scheduler does, also when a submitter that died before job.json is adopted."""
    from workshop_lib.runs import submit as runs_module

    profile = quick_profile(isolated)
    run = submit_experiment(EXPERIMENT, profile, sbatch_args=["--job-name", "mine", "-o", "log-%x-%j.txt"])
    assert run.record.job_name == "mine" and run.record.stdout == f"log-mine-{run.record.job_id}.txt"
    [info] = wait_for_runs([run], timeout=60, progress=False)
    assert info.state == "COMPLETED" and "Exit status: 0" in (run.directory / run.record.stdout).read_text()

    def dies_before_recording(*args):
        raise KeyboardInterrupt  # the submitter stops between sbatch and job.json

    with monkeypatch.context() as patched, pytest.raises(KeyboardInterrupt):
        patched.setattr(runs_module, "_install", dies_before_recording)
        submit_experiment(EXPERIMENT, profile, force=True, sbatch_args=["-J", "again", "--output=again-%j.log"])
    adopted = submit_experiment(EXPERIMENT, profile)
    assert "adopted" in adopted.note and adopted.record.job_id != run.record.job_id
    assert adopted.record.job_name == "again" and adopted.record.stdout == f"again-{adopted.record.job_id}.log"
    [info] = wait_for_runs([adopted], timeout=60, progress=False)
    assert info.state == "COMPLETED" and "Exit status: 0" in (adopted.directory / adopted.record.stdout).read_text()


def test_a_damaged_record_of_a_job_that_did_not_complete_says_to_rename_it(tmp_path):
    from workshop_lib.runs import RunRecord
    from workshop_lib.runs.record import DamagedRecord

    (tmp_path / "job.json").write_text('{"experiment_id": ')
    (tmp_path / "slurm-7.out").write_text("step 1\n Exit status: 3\n")
    with pytest.raises(DamagedRecord, match="ends with `Exit status: 3`.*rename job.json to job.json.damaged"):
        RunRecord.load(tmp_path)
    (tmp_path / "slurm-7.out").unlink()
    with pytest.raises(DamagedRecord, match="never ran: rename job.json"):
        RunRecord.load(tmp_path)


def test_a_full_disk_during_a_submission_is_a_message_not_an_oserror(isolated, monkeypatch):
    import errno

    from workshop_lib.runs import submit as runs_module
    from workshop_lib.core.errors import WorkshopError

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(isolated))

    monkeypatch.setattr(runs_module, "prepare_run_directory", full)
    with pytest.raises(WorkshopError, match="No space left on device.*free some disk space"):
        submit_experiment(EXPERIMENT, quick_profile(isolated))
    assert main(["submit", "--profile", str(quick_profile(isolated)), EXPERIMENT.id]) == 2


def test_cancel_stops_a_chapters_active_jobs_and_says_what_it_did(isolated, capsys):
    from workshop_lib.runs import cancel_runs, load_run

    slow, done = get_experiment("fsdp/single-gpu/full-shard"), EXPERIMENT
    [finished] = submit_experiments([done], quick_profile(isolated))
    wait_for_runs([finished], timeout=60, progress=False)
    (isolated / "slow").mkdir()
    [running] = submit_experiments([slow], quick_profile(isolated / "slow", seconds=60))
    never = get_experiment("fsdp/gpt/1-gpu")
    lines = cancel_runs([slow, done, never])
    assert lines == [f"{slow.id}: cancelled job {running.record.job_id} (it was {lines[0].split('was ')[1]}",
                     f"{done.id}: job {finished.record.job_id} already ended (COMPLETED): nothing to cancel",
                     f"{never.id}: nothing to cancel (not submitted)"]
    [info] = wait_for_runs([load_run(slow)], timeout=30, progress=False)
    assert info.state == "CANCELLED"
    # The shell's way, for a whole chapter: nothing is left to cancel now.
    assert main(["cancel", "--chapter", "4"]) == 0
    shown = capsys.readouterr().out
    assert f"{slow.id}: job {running.record.job_id} already ended (CANCELLED)" in shown
    assert main(["cancel"]) == 2 and "nothing to cancel: give experiment ids" in capsys.readouterr().err


def test_the_read_only_view_reads_a_finished_runs_footer(isolated):
    """`make book` (WORKSHOP_SUBMIT=0) asks no scheduler: a run whose job.json has no final state yet is
    shown as its log's footer says, not UNKNOWN."""
    from workshop_lib.runs import load_run, read_only_info

    [run] = submit_experiments([EXPERIMENT], quick_profile(isolated))
    wait_for_runs([run], timeout=60, progress=False)
    record = json.loads((run.directory / "job.json").read_text())
    record["final_state"] = None  # as a notebook that never waited leaves it
    (run.directory / "job.json").write_text(json.dumps(record))
    assert "Exit status: 0" in run.stdout_path.read_text()
    assert read_only_info(load_run(EXPERIMENT)).state == "COMPLETED"
    run.stdout_path.write_text("step 1\n")  # still running, or killed: the folder cannot tell
    assert read_only_info(load_run(EXPERIMENT)).state == "UNKNOWN"


def test_the_books_way_to_stop_a_chapter_is_the_real_one():
    import shlex
    from pathlib import Path

    from workshop_lib.book.chapter import facade as nb
    from workshop_lib.cli import build_parser

    page = (REPO / "book" / "slurm_primer.md").read_text()
    commands = [line for line in page.splitlines() if line.startswith("workshop cancel")]
    assert len(commands) >= 3
    for line in commands:
        args = build_parser().parse_args(shlex.split(line)[1:])
        assert args.command == "cancel" and (args.chapter or args.experiment_ids or args.job)
    assert "nb.cancel_experiments(selection, runs_dir)" in page and callable(nb.cancel_experiments)


def test_a_runs_folder_that_cannot_be_written_points_to_read_only_mode(isolated):
    from workshop_lib.core.errors import WorkshopError

    blocked = isolated / "a-file"
    blocked.write_text("not a folder\n")  # as root no permission blocks a write; a file in the path does
    with pytest.raises(WorkshopError, match="WORKSHOP_SUBMIT=0"):
        submit_experiment(EXPERIMENT, quick_profile(isolated), root=blocked / "runs")
