"""Submitting a run or reusing it: the state machine that keeps one job per experiment whatever fails
(a lock per run folder, a reservation written before sbatch, the job held until it is recorded).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Sequence

from workshop_lib import jobs as cluster
from workshop_lib.core import paths
from workshop_lib.core.errors import ClusterError, SubmitError, WorkshopError
from workshop_lib.core.run_directory import (
    ATTEMPTS_DIR, DEEPSPEED_CONFIG_NAME, INTERRUPTED_NAME, LOCK_NAME, RESERVATION_NAME, SCRIPT_NAME, STAGING_DIR,
    RunDirectory,
)
from workshop_lib.experiments import Experiment
from workshop_lib.jobs import slurm_output
from workshop_lib.jobs.backend import get_backend, resolve_backend
from workshop_lib.jobs.states import COMPLETED, HELD, PENDING, UNKNOWN, JobInfo
from workshop_lib.runs.record import RunRecord, write_atomically
from workshop_lib.runs.run import (
    RUNS_VARIABLE, Run, folder_backend, load_run, may_hold_unrecorded_jobs, query_runs, run_directory, unrecorded_jobs,
)
from workshop_lib.checks.sbatch import sbatch_request
from workshop_lib.scripts import render_script
from workshop_lib.sites.profiles import Profile, load_profile
from workshop_lib.sites.requirements import check_before_submit

# Entries of a run directory that belong to the run's bookkeeping, not to an attempt.
_BOOKKEEPING = {ATTEMPTS_DIR, STAGING_DIR, LOCK_NAME, RESERVATION_NAME, INTERRUPTED_NAME}
LATE_JOB = ("a late job of an interrupted submission: the controller created it after this run was submitted "
            "again, and job.json does not name it")
LOCK_TIMEOUT_S = 120.0
FAULT_VARIABLE = "WORKSHOP_FAULT"  # tests only: names a step at which the submitter kills itself


def prepare_run_directory(experiment: Experiment, profile: Profile, directory: Path) -> Path:
    """Render the script into `directory`, with its own copy of the DeepSpeed config; returns the script."""
    directory.mkdir(parents=True, exist_ok=True)
    deepspeed_config = None
    if experiment.deepspeed_config and not (experiment.engine == "nemo" and profile.nemo.enabled):
        source = paths.DS_CONFIGS_DIR / experiment.deepspeed_config
        if not source.is_file():
            raise WorkshopError(f"DeepSpeed config {source} is missing; it belongs in slurm/ds_configs/ "
                                f"(needed by {experiment.id})")
        # The job reads its own copy: editing the shared config later cannot change a queued job.
        shutil.copyfile(source, RunDirectory(directory).deepspeed_config)
        deepspeed_config = DEEPSPEED_CONFIG_NAME  # the job runs in its folder: the name is its path there
    script = RunDirectory(directory).script
    script.write_text(render_script(experiment, profile, deepspeed_config=deepspeed_config))
    return script


# ---- submitting: the state machine ------------------------------------------------------------
@contextmanager
def run_lock(directory: Path, timeout: float = LOCK_TIMEOUT_S):
    """Hold the run directory's lock (fcntl): one submitter at a time per run, across processes."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        handle = open(RunDirectory(directory).lock, "a+")
    except OSError as error:
        raise WorkshopError(f"cannot write to the run folder {directory} ({error.strerror}): submitting, even "
                            f"to reuse a completed run, takes the run's lock. To only read the results that exist "
                            f"(what `make book` does), set WORKSHOP_SUBMIT=0 before executing the notebook; to "
                            f"submit, use a writable runs folder (--runs-dir, or ${RUNS_VARIABLE})") from error
    deadline = time.monotonic() + timeout
    with handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise WorkshopError(f"another notebook or `workshop submit` has held {RunDirectory(directory).lock} "
                                        f"for {timeout:.0f} s; let it finish (or stop it) and try again") from None
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def submit_experiment(experiment: Experiment, profile: Profile | str | None = None, *,
                      root: Path | str | None = None, force: bool = False, backend: str | None = None,
                      sbatch_args: Sequence[str] = ()) -> Run:
    """Submit one experiment unless an equal run has completed or is still active."""
    profile = load_profile(profile) if not isinstance(profile, Profile) else profile
    directory = run_directory(experiment, root)
    with run_lock(directory):
        run = load_run(experiment, root)  # read under the lock: another submitter may just have recorded a job
        if run.damage:
            run.note = "not submitted: job.json is damaged (see the message)"
            return run
        settled: list[str] = []  # what was done about jobs an interrupted submission left behind
        try:
            if run.files.reservation.exists():
                adopted = _settle_reservation(run, settled)
                if adopted is not None:
                    return adopted
            run = _submit_or_reuse(run, profile, force, backend, sbatch_args, settled)
        except OSError as error:  # a full disk, a folder turned read-only: say where, and what re-running does
            raise WorkshopError(
                f"could not write in the run folder {directory} ({error.strerror}: {error.filename}): free some "
                f"disk space (`df -h {directory.parent}`) or submit into another runs folder (--runs-dir, "
                f"${RUNS_VARIABLE}), then re-run. A job this submission already handed to the scheduler is adopted "
                "then, not doubled.") from error
        run.note = "; ".join([*settled, run.note])
        return run


def _submit_or_reuse(run: Run, profile: Profile, force: bool, backend: str | None, sbatch_args: Sequence[str],
                     settled: list[str]) -> Run:
    if run.record is not None:
        info = run.info()
        if info.state != UNKNOWN:
            _cancel_late_jobs(run, settled)
        if info.state == PENDING and info.reason == HELD:
            # Recorded, but its submitter stopped before releasing it (see _install).
            get_backend(run.record.backend).release(run.record.job_id)
            run.note = f"released job {run.record.job_id}, left held by an interrupted submission"
            return run
        if not info.finished:
            run.note = (f"job {run.record.job_id} is {info.state}: not doubled" if info.state != UNKNOWN else
                        f"job {run.record.job_id}: the scheduler does not answer, so it may still run: not "
                        f"submitted again ({first_line(info.reason)}); re-run this later")
            return run
        run.remember(info)
        same = records_this_experiment(run.record, run.experiment, profile)
        if same and info.state == COMPLETED and not force:
            run.note = f"reused: job {run.record.job_id} completed" + (
                f" (its {SCRIPT_NAME} was edited since: --force submits the edited script)"
                if edited_script(run) else "")
            return run
    return _submit_new(run, profile, backend, sbatch_args, settled)


def records_this_experiment(record: RunRecord, experiment: Experiment, profile: Profile) -> bool:
    """The record is of this very experiment on this profile: completed, it is reused instead of resubmitted."""
    return record.content_hash == experiment.content_hash and record.profile == profile.name


def script_digest(path: Path) -> str:
    """What job.json keeps of the script it submitted, to tell a later edit of it."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def edited_script(run: Run) -> bool:
    """The run's job.sbatch differs from the script its recorded job was submitted with (a person raised its
    --time, as the TIMEOUT explanation suggests). Unknown for records written before job.json kept the digest."""
    script = run.files.script
    return bool(run.record is not None and run.record.script_sha256 and script.is_file()
                and script_digest(script) != run.record.script_sha256)


def _carry_edited_script(run: Run, profile: Profile, staged: Path, settled: list[str]) -> None:
    """An edited job.sbatch of this very experiment and profile is what the person wants submitted: it replaces
    the freshly rendered one, and the note says so. One of an earlier version of the experiment is not carried
    (its settings no longer match): it stays with that attempt under attempts/, and the note says that too."""
    if not edited_script(run):
        return
    if records_this_experiment(run.record, run.experiment, profile):
        shutil.copyfile(run.files.script, staged)
        settled.append(f"submitting your edited {SCRIPT_NAME} (it differs from the script of job "
                       f"{run.record.job_id}); delete it before re-running to get the rendered one again")
    else:
        settled.append(f"your edit of {SCRIPT_NAME} was made for an earlier version of this experiment (or "
                       f"another profile), so it is not submitted: it stays with job {run.record.job_id}'s files "
                       f"under {ATTEMPTS_DIR}/, and the script is rendered anew (set --time for good in the "
                       "profile's scheduler.time_limits)")


def _submit_new(run: Run, profile: Profile, backend: str | None, sbatch_args: Sequence[str],
                settled: list[str]) -> Run:
    check_before_submit(run.experiment, profile)  # a skipped `workshop setup` step: say so before the queue
    chosen = resolve_backend(backend)
    if _may_hold_strays(run):  # a fresh run folder cannot: spare the scheduler a query per new run
        _cancel_strays(run, chosen, settled)
    staging = run.files.staging
    shutil.rmtree(staging, ignore_errors=True)
    script = prepare_run_directory(run.experiment, profile, staging)
    _carry_edited_script(run, profile, script, settled)
    # The command line is kept with the reservation: a submitter that dies before job.json leaves the
    # adopter what it needs to name the job and find its log (--job-name, --output win over the script).
    reservation = {"reserved_at": time.time(), "backend": chosen, "pid": os.getpid(), "host": socket.gethostname(),
                   "experiment_id": run.experiment.id, "content_hash": run.experiment.content_hash,
                   "profile": profile.name, "sbatch_args": ["--open-mode=append", *sbatch_args]}
    write_atomically(run.files.reservation, json.dumps(reservation) + "\n")
    _fault_point("after-reserve")
    try:
        job = cluster.submit(script, workdir=run.directory, backend=chosen, hold=True,
                             sbatch_args=reservation["sbatch_args"])
    except SubmitError as refused:
        if _may_have_submitted(refused):
            raise SubmitError(f"{refused}\n{_KEPT}".format(directory=run.directory)) from refused
        # The scheduler answered no: no job exists, so the reservation goes.
        _drop_reservation(run.directory)
        raise
    except ClusterError as error:  # e.g. sbatch did not answer in time: it may have submitted the job
        raise ClusterError(f"{error}\n{_KEPT}".format(directory=run.directory)) from error
    # Anything else (Ctrl-C, a kill) also leaves the reservation: a job may exist, and the next submission
    # adopts or cancels it.
    _fault_point("after-submit")
    _install(run, job.job_id, reservation)
    run.submitted_now = True
    run.note = f"submitted job {job.job_id}"
    return run


_KEPT = ("The job may have reached the scheduler, so {directory} keeps its reservation: re-running the cell "
         "(or `workshop submit`) adopts that job or cancels it, and never starts a second one.")


def _may_have_submitted(refused: SubmitError) -> bool:
    """sbatch timed out waiting for the controller's answer: the controller may still have queued the job."""
    return "timed out" in str(refused).lower()


def _drop_reservation(directory: Path) -> None:
    RunDirectory(directory).reservation.unlink(missing_ok=True)
    shutil.rmtree(RunDirectory(directory).staging, ignore_errors=True)


def _settle_reservation(run: Run, settled: list[str]) -> Run | None:
    """A submission was interrupted between reserving and recording: finish it with the job it left (adopted
    when it is the run's only waiting job and its script is staged), else cancel every job it left.
    Returns the run when adopted, or when the scheduler cannot be asked (then nothing is submitted);
    None when the reservation is settled and a submission may follow (`settled` says what was done)."""
    path = run.files.reservation
    try:
        reservation = json.loads(path.read_text())
        backend_name, since = reservation["backend"], float(reservation["reserved_at"])
    except (OSError, ValueError, KeyError, TypeError):
        reservation, since = None, 0.0
        backend_name = run.record.backend if run.record is not None else None
    if reservation is not None and reservation.get("job_id"):
        # The job was submitted and its files were being moved in: finish that, from where it stopped.
        _install(run, reservation["job_id"], reservation)
        run.note = (f"adopted job {reservation['job_id']}: its submission stopped while moving its files in; "
                    "they are in place now")
        return run
    try:
        backend = get_backend(backend_name or resolve_backend(None))
        found = backend.jobs_in(run.directory, since)
    except ClusterError as error:
        run.note = (f"an earlier submission was interrupted and the scheduler does not answer ({first_line(error)}):"
                    " not submitting, so as not to start a second job; re-run this later")
        return run
    named = run.record.job_id if run.record is not None else None
    waiting = [info for info in found if info.state == PENDING and info.job_id != named]
    staged = reservation is not None and (run.files.staging / SCRIPT_NAME).is_file()
    if len(waiting) == 1 and staged:
        job_id = waiting[0].job_id
        _install(run, job_id, reservation)
        run.note = (f"adopted job {job_id}: it waited in this run folder, the run's only job, submitted by a "
                    "submission that stopped before recording it")
        return run
    _remember_interruption(run, reservation)
    _drop_reservation(run.directory)
    _cancel(backend, waiting, run, settled, "an interrupted submission left it" + (
        "" if len(waiting) < 2 else f" ({len(waiting)} jobs in one run folder)"))
    return None


def _cancel_late_jobs(run: Run, settled: list[str]) -> None:
    """In a folder where a submission was interrupted, cancel a job of it that the controller created after the
    re-run had submitted its own (found by reuse as by a new submission: once released it would write over
    this run's files)."""
    if not run.files.interrupted.exists():
        return  # no interrupted submission here: spare the scheduler a query per reused run
    try:
        late = unrecorded_jobs(run)
    except ClusterError:
        return  # the recorded job's query just answered; the next submission or `workshop cancel` looks again
    _cancel(get_backend(run.record.backend), late, run, settled, LATE_JOB)


def _remember_interruption(run: Run, reservation: dict | None) -> None:
    """Note an interrupted submission whose job was not found: its sbatch may still reach the controller, and
    the job it makes then must be found by status, cancel and reuse (`may_hold_unrecorded_jobs`)."""
    path = run.files.interrupted
    try:
        noted = json.loads(path.read_text()) if path.is_file() else []
    except (OSError, ValueError):
        noted = []
    noted = (noted if isinstance(noted, list) else [])[-9:]  # the latest ten are plenty: the file says "look"
    noted.append({"reserved_at": (reservation or {}).get("reserved_at"), "settled_at": time.time(),
                  "backend": (reservation or {}).get("backend")})
    write_atomically(path, json.dumps(noted) + "\n")


def _cancel_strays(run: Run, backend_name: str, settled: list[str]) -> None:
    """Before a new submission: cancel waiting jobs in the run folder that job.json does not name (once
    released they would write into the new attempt's files). A scheduler that cannot be asked is left to
    sbatch, which then says so."""
    backend = get_backend(backend_name)
    try:
        found = backend.jobs_in(run.directory)
    except ClusterError:
        return
    named = run.record.job_id if run.record is not None else None
    _cancel(backend, [info for info in found if info.state == PENDING and info.job_id != named], run, settled,
            "it waited in this run folder and job.json does not name it")


def _cancel(backend, infos: Sequence[JobInfo], run: Run, settled: list[str], why: str) -> None:
    for info in infos:
        try:
            backend.cancel(info.job_id)
        except ClusterError as error:
            raise ClusterError(f"job {info.job_id} waits in {run.directory} but job.json does not name it, and "
                               f"cancelling it failed ({first_line(error)}): cancel it yourself "
                               f"(`workshop cancel --job {info.job_id}`, or scancel) and re-run") from error
        settled.append(f"cancelled job {info.job_id} ({why}; once released it would overwrite this run's files)")


def _install(run: Run, job_id: str, reservation: dict) -> None:
    """The held job is submitted: archive the previous attempt, move the new files in, record, release.
    Each phase is written into the reservation first, so that a submitter stopped anywhere here is
    finished by the next one (`_settle_reservation`) instead of leaving the job unnamed."""
    directory, staging = run.directory, run.files.staging
    path = run.files.reservation
    if not reservation.get("job_id"):
        if run.record is not None and not run.record.final_state:
            run.remember(run.info())
        reservation = {**reservation, "job_id": job_id, "attempt": _attempt_name(run), "phase": "archive"}
        write_atomically(path, json.dumps(reservation) + "\n")
    if reservation.get("phase") == "archive":
        _archive_attempt(run, reservation.get("attempt"))
        _fault_point("after-archive")
        reservation = {**reservation, "phase": "move"}
        write_atomically(path, json.dumps(reservation) + "\n")
    if staging.is_dir():
        for entry in sorted(staging.iterdir()):
            os.replace(entry, directory / entry.name)
            _fault_point("mid-move")
        staging.rmdir()
    _fault_point("after-move")
    run.files.train.mkdir(exist_ok=True)
    script = run.files.script
    sbatch_args = reservation.get("sbatch_args", ["--open-mode=append"])  # absent in an older reservation
    request = sbatch_request(script.read_text(errors="replace"), sbatch_args) if script.is_file() else {}
    stdout = slurm_output.expected_stdout(script, directory, job_id, sbatch_args)
    run.record = RunRecord(
        experiment_id=reservation["experiment_id"], content_hash=reservation["content_hash"],
        profile=reservation["profile"], job_id=job_id, backend=reservation["backend"],
        stdout=stdout.name if stdout.parent == directory else str(stdout),
        submitted_at=datetime.fromtimestamp(reservation["reserved_at"], timezone.utc).isoformat(timespec="seconds"),
        job_name=request.get("job-name") or SCRIPT_NAME,
        script_sha256=script_digest(script) if script.is_file() else None)
    run.record.save(directory)
    path.unlink(missing_ok=True)
    _fault_point("before-release")
    get_backend(run.record.backend).release(job_id)


def _may_hold_strays(run: Run) -> bool:
    """Whether an earlier submission could have left a job in this run folder that job.json does not name:
    only where one ran before (a record, files, attempts). A submission keeps its reservation file wherever a
    job may exist, and that file is settled before this point."""
    return run.record is not None or any(entry.name not in {LOCK_NAME, RESERVATION_NAME}
                                         for entry in run.directory.iterdir())


def _attempt_name(run: Run) -> str | None:
    """The attempts/ folder the previous attempt's files go to: <job id>-<submit time>, a name a reused job
    id cannot collide with; None when there is nothing to keep."""
    if not [entry for entry in run.directory.iterdir() if entry.name not in _BOOKKEEPING]:
        return None
    if run.record is not None:
        stamp = run.record.submitted_at.replace(":", "").replace("-", "").split("+")[0]
        name = f"{run.record.job_id}-{stamp}"
    else:
        name = "unrecorded-" + datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    candidate, suffix = name, 1
    while (run.files.attempts / candidate).exists():
        suffix += 1
        candidate = f"{name}-{suffix}"
    return candidate


def _archive_attempt(run: Run, name: str | None) -> Path | None:
    """Move the previous attempt's files to attempts/<name>/ so that no result is lost (resumable: a folder
    half filled by a stopped submitter takes the rest)."""
    entries = [entry for entry in run.directory.iterdir() if entry.name not in _BOOKKEEPING]
    if not entries:
        return None
    target = run.files.attempts / (name or _attempt_name(run))
    target.mkdir(parents=True, exist_ok=True)
    for entry in entries:
        os.replace(entry, target / entry.name)
    return target


def _fault_point(name: str) -> None:
    """Fault injection for the tests: when $WORKSHOP_FAULT names this step, die here as `kill -9` would;
    `NAME:int` sends SIGINT instead (Ctrl-C in a terminal, a notebook's interrupt)."""
    chosen = os.environ.get(FAULT_VARIABLE, "")
    if chosen == name:
        os.kill(os.getpid(), signal.SIGKILL)
    elif chosen == f"{name}:int":
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)  # the handler raises KeyboardInterrupt at the next bytecode


def first_line(text) -> str:
    return str(text or "").strip().splitlines()[0][:160] if str(text or "").strip() else ""


def submit_experiments(experiments: Iterable[Experiment], profile: Profile | str | None = None, *,
                       root: Path | str | None = None, force: bool = False, backend: str | None = None,
                       skip_unsupported: bool = True) -> list[Run]:
    """Submit several experiments (the notebooks' entry point).

    Experiments outside the profile's grid (e.g. 8 nodes on the tiny profile) are skipped with a note
    when ``skip_unsupported``; otherwise they raise.
    """
    profile = load_profile(profile) if not isinstance(profile, Profile) else profile
    runs = []
    for experiment in experiments:
        reason = profile.unsupported_reason(experiment)
        if reason and skip_unsupported:
            run = load_run(experiment, root)
            run.note = f"skipped: {reason}"
            runs.append(run)
            continue
        runs.append(submit_experiment(experiment, profile, root=root, force=force, backend=backend))
    return runs


# ---- stopping ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class CancelReport:
    """What `cancel_runs_report` did: one line per run, and the runs whose scheduler did not answer (their
    jobs may still run)."""

    lines: list[str]
    unanswered: list[str]


def cancel_runs(experiments: Iterable[Experiment], root: Path | str | None = None) -> list[str]:
    """Cancel the queued or running job of each experiment's run (`workshop cancel`, a notebook's
    `nb.cancel_experiments`); one line per run says what was done. The run folders stay: re-running the
    chapter submits the cancelled runs again and reuses the completed ones."""
    return cancel_runs_report(experiments, root).lines


def cancel_runs_report(experiments: Iterable[Experiment], root: Path | str | None = None) -> CancelReport:
    """`cancel_runs`, saying also which runs could not be cancelled because the scheduler did not answer.
    A job is cancelled only where it runs in the run's own folder: after a scheduler reset, the recorded id
    (and the experiment's job name) may belong to another folder's job (`Job.settle` tells them apart)."""
    runs = [load_run(experiment, root) for experiment in experiments]
    lines, unanswered = [], []
    for run, info in zip(runs, query_runs(runs)):
        name = run.experiment.id
        cancelled_late = False
        if may_hold_unrecorded_jobs(run) and not run.damage:
            try:
                for late in unrecorded_jobs(run):
                    cancelled_late = True
                    get_backend(folder_backend(run)).cancel(late.job_id)
                    lines.append(f"{name}: cancelled job {late.job_id} (it was {late.state}; it waited in this run "
                                 "folder but job.json does not name it: a job of an interrupted submission)")
            except ClusterError as error:
                lines.append(f"{name}: could not look for (or cancel) jobs of an interrupted submission in "
                             f"{run.directory}: the scheduler does not answer ({first_line(error)}); try again later")
                unanswered.append(name)
                continue
        if run.record is None:
            if not cancelled_late:
                lines.append(f"{name}: nothing to cancel ({run.damage and 'job.json is damaged' or 'not submitted'})")
        elif info.state == UNKNOWN:
            lines.append(f"{name}: job {run.record.job_id} not cancelled: the scheduler does not answer "
                         f"({first_line(info.reason)}); try again later")
            unanswered.append(name)
        elif info.finished:
            lines.append(f"{name}: job {run.record.job_id} already ended ({info.state}): nothing to cancel")
        else:
            get_backend(run.record.backend).cancel(run.record.job_id)
            lines.append(f"{name}: cancelled job {run.record.job_id} (it was {info.state})")
    return CancelReport(lines, unanswered)
