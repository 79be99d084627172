"""Run directories: render an experiment into ``runs/<experiment id>/``, submit it, remember the job.

A run directory holds ``job.sbatch`` (the script exactly as submitted), ``job.json`` (a RunRecord),
the job's stdout ``slurm-<jobid>.out``, the monitors (``gpu_memory_<node>.csv``; ``cpu_memory.txt`` on one
node or ``cpu_memory_<node>.txt`` per node; ``nccl_allreduce.txt``) and ``train/`` (the entry point's
``--output-dir``).

A run's life is a small state machine; each step happens under the run's lock (``.lock``, so two
notebooks on the same runs folder take turns) and each file is written whole (temp file + rename):

    NOT SUBMITTED ─reserve─▶ RESERVED ─sbatch --hold─▶ HELD ─archive, install, record, release─▶ ACTIVE ─▶ ENDED

- *reserve*: ``.reservation.json`` says a submission is under way, before ``sbatch`` is called. It is dropped
  only where no job can exist (sbatch answered no); a submitter stopped anywhere after that (killed, Ctrl-C,
  sbatch waiting on a slow controller) leaves it behind, and the next one settles it: it adopts the held job
  it finds in the run folder when that is the run's only waiting job, and cancels every other one, saying
  which and why. Before any new submission, waiting jobs in the folder that ``job.json`` does not name are
  cancelled too: once released they would write over the run's files.
- the new script is rendered into ``.next/`` and the job submitted *held*; only once ``sbatch`` succeeded
  do the previous attempt's files move to ``attempts/<job id>-<submit time>/`` (a name a reused job id
  cannot collide with), the new files take their place, ``job.json`` is written and the job released. The
  job id and each phase go into the reservation first, so a stopped install is finished, not repeated.
- *ACTIVE* includes UNKNOWN (a scheduler that does not answer): such a run is asked again later, never
  archived, never submitted again.
- *ENDED*: the scheduler's final state (``sacct``), or, where it has forgotten the job and keeps no
  accounting, what the job wrote when it ended (its footer's exit status; see ``cluster.ended_from_log``).
  The final state is written into ``job.json``: ids reused later do not matter.

Re-running a notebook therefore never resubmits finished work: an experiment whose content hash already
has a COMPLETED run on the same profile is reused, an active one is never doubled, and a run that is
replaced is archived rather than deleted. Jobs append to their log (``--open-mode=append``), so a job
SLURM requeues keeps each attempt's lines. Reading (status, tables) never writes.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

from workshop_lib import cluster, slurm_output
from workshop_lib.core import paths
from workshop_lib.backend import FORGOTTEN, get_backend, resolve_backend
from workshop_lib.core.errors import ClusterError, SubmitError, WorkshopError
from workshop_lib.experiments import Experiment, select_experiments
from workshop_lib.profiles import Profile, load_profile
from workshop_lib.checks.sbatch import sbatch_request
from workshop_lib.site_setup import check_before_submit
from workshop_lib.scripts import CPU_MEMORY_LOG, TRAIN_DIR, render_script
from workshop_lib.slurm_output import JobInfo

if TYPE_CHECKING:
    from workshop_lib.failures import Explanation

RUNS_VARIABLE = paths.RUNS_VARIABLE
SCRIPT_NAME = "job.sbatch"
RECORD_NAME = "job.json"
DEEPSPEED_CONFIG_NAME = "ds_config.json"
ATTEMPTS_DIR = "attempts"
STAGING_DIR = ".next"
LOCK_NAME = ".lock"
RESERVATION_NAME = ".reservation.json"
NOT_SUBMITTED = "NOT SUBMITTED"
DAMAGED = "DAMAGED"
UNKNOWN = cluster.UNREACHABLE
HELD = "JobHeldUser"  # squeue's reason for a job submitted with --hold
# Entries of a run directory that belong to the run's bookkeeping, not to an attempt.
_BOOKKEEPING = {ATTEMPTS_DIR, STAGING_DIR, LOCK_NAME, RESERVATION_NAME}
LOCK_TIMEOUT_S = 120.0
FAULT_VARIABLE = "WORKSHOP_FAULT"  # tests only: names a step at which the submitter kills itself


def runs_root(root: Path | str | None = None) -> Path:
    """Where run directories live (see `paths.runs_root`)."""
    return paths.runs_root(root)


def run_directory(experiment: Experiment, root: Path | str | None = None) -> Path:
    return runs_root(root) / experiment.id


class DamagedRecord(WorkshopError):
    """A job.json that cannot be read; the run's other files are intact."""


def write_atomically(path: Path, text: str) -> None:
    """Write a whole file or nothing: readers never see half of it."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


@dataclass(frozen=True)
class RunRecord:
    """What job.json says about the job submitted from a run directory."""

    experiment_id: str
    content_hash: str
    profile: str
    job_id: str
    backend: str
    submitted_at: str
    script: str = SCRIPT_NAME
    stdout: str | None = None  # file name of the job's stdout inside the run directory
    final_state: str | None = None  # written once a final state has been seen, so ids reused later do not matter
    exit_code: int | None = None
    job_name: str | None = None  # what the scheduler calls the job: an id reused by another job is told apart
    # How it ended, kept with the final state for the failure explanation (the scheduler forgets).
    signal: int | None = None
    elapsed_s: float | None = None
    time_limit_s: float | None = None
    reason: str | None = None

    def save(self, directory: Path) -> None:
        write_atomically(directory / RECORD_NAME, json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, directory: Path) -> "RunRecord | None":
        path = Path(directory) / RECORD_NAME
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text())
            known = {key: data[key] for key in cls.__dataclass_fields__ if key in data}
            return cls(**known)
        except (ValueError, TypeError, AttributeError) as error:
            raise DamagedRecord(f"{path} is damaged ({type(error).__name__}: {error}); the run's other files are "
                                f"intact. {_damaged_record_advice(Path(directory))}") from error


def _damaged_record_advice(directory: Path) -> str:
    """What to do about a damaged job.json, from what the job's log says: a completed run is kept as it is
    (renaming its record would run the experiment again)."""
    from workshop_lib.parse.footer import parse_footer

    logs = sorted(directory.glob("slurm-*.out"))
    if not logs:
        return (f"No job log is here, so the job never ran: rename job.json to job.json.damaged and re-run; the "
                f"next submission keeps this run's files under {ATTEMPTS_DIR}/ and submits it again.")
    names = ", ".join(log.name for log in logs)
    try:
        exit_status = parse_footer(logs[-1].read_text(errors="replace")).exit_status
    except OSError:
        exit_status = None
    if exit_status == 0:
        return (f"Its log {logs[-1].name} ends with `Exit status: 0`: the job completed and the tables read its "
                "results from the other files. Leave job.json as it is: renaming it would run the experiment "
                "again (this run is not submitted again while it is damaged).")
    ended = f"ends with `Exit status: {exit_status}`" if exit_status is not None else "has no footer yet"
    return (f"The job's log {names} {ended} (its number is the job id). If that job still runs (`squeue --me`), "
            "wait for it. Once it has ended without completing, rename job.json to job.json.damaged: the next "
            f"submission keeps every file of this run under {ATTEMPTS_DIR}/ and submits it again.")


@dataclass
class Run:
    """An experiment's run directory and the job recorded there (if any)."""

    experiment: Experiment
    directory: Path
    record: RunRecord | None
    submitted_now: bool = False
    note: str = ""
    damage: str | None = None  # why job.json could not be read

    @property
    def job(self) -> cluster.Job | None:
        if self.record is None:
            return None
        return cluster.job_from_id(self.record.job_id, self.record.backend, stdout_path=self.stdout_path,
                                   name=self.record.job_name)

    @property
    def stdout_path(self) -> Path | None:
        if self.record is None:
            return None
        return self.directory / (self.record.stdout or f"slurm-{self.record.job_id}.out")

    @property
    def train_dir(self) -> Path:
        return self.directory / TRAIN_DIR

    @property
    def cpu_memory_log(self) -> Path:
        return self.directory / CPU_MEMORY_LOG

    def info(self) -> JobInfo:
        """The job's state now (writes nothing): the recorded final state, or the scheduler's answer."""
        return query_runs([self])[0]

    def remember(self, info: JobInfo) -> None:
        """Write a final state into job.json (a restarted scheduler reuses job ids; the file does not).
        A read-only runs folder keeps what it has: the state is asked again next time."""
        if self.record is not None and info.finished and not self.record.final_state:
            self.record = replace(self.record, final_state=info.state, exit_code=info.exit_code, signal=info.signal,
                                  elapsed_s=info.elapsed_s, time_limit_s=info.time_limit_s, reason=info.reason)
            try:
                self.record.save(self.directory)
            except OSError:
                pass

    @property
    def state(self) -> str:
        return self.info().state


def query_runs(runs: Sequence[Run], max_age_s: float = 0.0) -> list[JobInfo]:
    """Each run's state, asking the scheduler once for all the runs still active (an answer this process got
    less than `max_age_s` seconds ago is reused). Writes nothing.
    A scheduler that cannot be asked gives UNKNOWN (with its message as the reason)."""
    answers: dict[int, JobInfo] = {}
    asking: list[tuple[int, cluster.Job]] = []
    for index, run in enumerate(runs):
        if run.damage:
            answers[index] = JobInfo(job_id="", state=DAMAGED, reason=run.damage)
        elif run.record is None:
            answers[index] = JobInfo(job_id="", state=NOT_SUBMITTED)
        elif run.record.final_state:
            record = run.record
            answers[index] = JobInfo(job_id=record.job_id, state=record.final_state, exit_code=record.exit_code,
                                     signal=record.signal, elapsed_s=record.elapsed_s, reason=record.reason,
                                     time_limit_s=record.time_limit_s, stdout_path=run.stdout_path,
                                     name=record.job_name)
        else:
            asking.append((index, run.job))
    if asking:
        try:
            infos = cluster.query_jobs([job for _, job in asking], max_age_s=max_age_s)
        except ClusterError as error:
            infos = [JobInfo(job_id=job.job_id, state=UNKNOWN, reason=str(error), stdout_path=job.stdout_path)
                     for _, job in asking]
        answers.update({index: info for (index, _), info in zip(asking, infos)})
    return [answers[index] for index in range(len(runs))]


def load_run(experiment: Experiment, root: Path | str | None = None) -> Run:
    """The run directory as it is on disk; a damaged job.json is reported on the Run, not raised."""
    directory = run_directory(experiment, root)
    try:
        return Run(experiment, directory, RunRecord.load(directory))
    except DamagedRecord as damaged:
        return Run(experiment, directory, None, damage=str(damaged), note="job.json damaged")


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
        shutil.copyfile(source, directory / DEEPSPEED_CONFIG_NAME)
        deepspeed_config = DEEPSPEED_CONFIG_NAME
    script = directory / SCRIPT_NAME
    script.write_text(render_script(experiment, profile, deepspeed_config=deepspeed_config))
    return script


# ---- submitting: the state machine ------------------------------------------------------------
@contextmanager
def run_lock(directory: Path, timeout: float = LOCK_TIMEOUT_S):
    """Hold the run directory's lock (fcntl): one submitter at a time per run, across processes."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        handle = open(directory / LOCK_NAME, "a+")
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
                    raise WorkshopError(f"another notebook or `workshop submit` has held {directory / LOCK_NAME} "
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
            if (directory / RESERVATION_NAME).exists():
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
        if info.state == "PENDING" and info.reason == HELD:
            # Recorded, but its submitter stopped before releasing it (see _install).
            get_backend(run.record.backend).release(run.record.job_id)
            run.note = f"released job {run.record.job_id}, left held by an interrupted submission"
            return run
        if not info.finished:
            run.note = (f"job {run.record.job_id} is {info.state}: not doubled" if info.state != UNKNOWN else
                        f"job {run.record.job_id}: the scheduler does not answer, so it may still run: not "
                        f"submitted again ({_first_line(info.reason)}); re-run this later")
            return run
        run.remember(info)
        same = records_this_experiment(run.record, run.experiment, profile)
        if same and info.state == "COMPLETED" and not force:
            run.note = f"reused: job {run.record.job_id} completed"
            return run
    return _submit_new(run, profile, backend, sbatch_args, settled)


def records_this_experiment(record: RunRecord, experiment: Experiment, profile: Profile) -> bool:
    """The record is of this very experiment on this profile: completed, it is reused instead of resubmitted."""
    return record.content_hash == experiment.content_hash and record.profile == profile.name


def _submit_new(run: Run, profile: Profile, backend: str | None, sbatch_args: Sequence[str],
                settled: list[str]) -> Run:
    check_before_submit(run.experiment, profile)  # a skipped `workshop setup` step: say so before the queue
    chosen = resolve_backend(backend)
    if _may_hold_strays(run):  # a fresh run folder cannot: spare the scheduler a query per new run
        _cancel_strays(run, chosen, settled)
    staging = run.directory / STAGING_DIR
    shutil.rmtree(staging, ignore_errors=True)
    script = prepare_run_directory(run.experiment, profile, staging)
    # The command line is kept with the reservation: a submitter that dies before job.json leaves the
    # adopter what it needs to name the job and find its log (--job-name, --output win over the script).
    reservation = {"reserved_at": time.time(), "backend": chosen, "pid": os.getpid(),
                   "experiment_id": run.experiment.id, "content_hash": run.experiment.content_hash,
                   "profile": profile.name, "sbatch_args": ["--open-mode=append", *sbatch_args]}
    write_atomically(run.directory / RESERVATION_NAME, json.dumps(reservation) + "\n")
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
    (directory / RESERVATION_NAME).unlink(missing_ok=True)
    shutil.rmtree(directory / STAGING_DIR, ignore_errors=True)


def _settle_reservation(run: Run, settled: list[str]) -> Run | None:
    """A submission was interrupted between reserving and recording: finish it with the job it left (adopted
    when it is the run's only waiting job and its script is staged), else cancel every job it left.
    Returns the run when adopted, or when the scheduler cannot be asked (then nothing is submitted);
    None when the reservation is settled and a submission may follow (`settled` says what was done)."""
    path = run.directory / RESERVATION_NAME
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
        run.note = (f"an earlier submission was interrupted and the scheduler does not answer ({_first_line(error)}):"
                    " not submitting, so as not to start a second job; re-run this later")
        return run
    named = run.record.job_id if run.record is not None else None
    waiting = [info for info in found if info.state == "PENDING" and info.job_id != named]
    staged = reservation is not None and (run.directory / STAGING_DIR / SCRIPT_NAME).is_file()
    if len(waiting) == 1 and staged:
        job_id = waiting[0].job_id
        _install(run, job_id, reservation)
        run.note = (f"adopted job {job_id}: it waited in this run folder, the run's only job, submitted by a "
                    "submission that stopped before recording it")
        return run
    _drop_reservation(run.directory)
    _cancel(backend, waiting, run, settled, "an interrupted submission left it" + (
        "" if len(waiting) < 2 else f" ({len(waiting)} jobs in one run folder)"))
    return None


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
    _cancel(backend, [info for info in found if info.state == "PENDING" and info.job_id != named], run, settled,
            "it waited in this run folder and job.json does not name it")


def _cancel(backend, infos: Sequence[JobInfo], run: Run, settled: list[str], why: str) -> None:
    for info in infos:
        try:
            backend.cancel(info.job_id)
        except ClusterError as error:
            raise ClusterError(f"job {info.job_id} waits in {run.directory} but job.json does not name it, and "
                               f"cancelling it failed ({_first_line(error)}): cancel it yourself "
                               f"(`workshop cancel --job {info.job_id}`, or scancel) and re-run") from error
        settled.append(f"cancelled job {info.job_id} ({why}; once released it would overwrite this run's files)")


def _install(run: Run, job_id: str, reservation: dict) -> None:
    """The held job is submitted: archive the previous attempt, move the new files in, record, release.
    Each phase is written into the reservation first, so that a submitter stopped anywhere here is
    finished by the next one (`_settle_reservation`) instead of leaving the job unnamed."""
    directory, staging = run.directory, run.directory / STAGING_DIR
    path = directory / RESERVATION_NAME
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
    (directory / TRAIN_DIR).mkdir(exist_ok=True)
    script = directory / SCRIPT_NAME
    sbatch_args = reservation.get("sbatch_args", ["--open-mode=append"])  # absent in an older reservation
    request = sbatch_request(script.read_text(errors="replace"), sbatch_args) if script.is_file() else {}
    stdout = slurm_output.expected_stdout(script, directory, job_id, sbatch_args)
    run.record = RunRecord(
        experiment_id=reservation["experiment_id"], content_hash=reservation["content_hash"],
        profile=reservation["profile"], job_id=job_id, backend=reservation["backend"],
        stdout=stdout.name if stdout.parent == directory else str(stdout),
        submitted_at=datetime.fromtimestamp(reservation["reserved_at"], timezone.utc).isoformat(timespec="seconds"),
        job_name=request.get("job-name") or SCRIPT_NAME)
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
    while (run.directory / ATTEMPTS_DIR / candidate).exists():
        suffix += 1
        candidate = f"{name}-{suffix}"
    return candidate


def _archive_attempt(run: Run, name: str | None) -> Path | None:
    """Move the previous attempt's files to attempts/<name>/ so that no result is lost (resumable: a folder
    half filled by a stopped submitter takes the rest)."""
    entries = [entry for entry in run.directory.iterdir() if entry.name not in _BOOKKEEPING]
    if not entries:
        return None
    target = run.directory / ATTEMPTS_DIR / (name or _attempt_name(run))
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


def _first_line(text) -> str:
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


def wait_for_runs(runs: Iterable[Run], timeout: float | None = None, progress: bool = True,
                  poll_interval: float | None = None,
                  on_poll: Callable[[list[tuple[Run, JobInfo]]], None] | None = None) -> list[JobInfo]:
    """Wait until every submitted run has ended; records final states in job.json.
    `on_poll` gets every run with its state after each poll (a job monitor shows them)."""
    runs = [run for run in runs if run.record is not None]
    waiting = [run for run in runs if not run.record.final_state]
    recorded = {id(run): run.info() for run in runs if run.record.final_state}  # from job.json: no scheduler call

    def report(infos: list[JobInfo]) -> None:
        latest = {id(run): info for run, info in zip(waiting, infos)}
        on_poll([(run, latest.get(id(run)) or recorded[id(run)]) for run in runs])

    infos = cluster.wait_for([run.job for run in waiting], timeout=timeout, progress=progress,
                             poll_interval=poll_interval, on_poll=report if on_poll else None) if waiting else []
    if on_poll is not None and not waiting:
        report([])
    for run, info in zip(waiting, infos):
        run.remember(info)
    latest = {id(run): info for run, info in zip(waiting, infos)}
    return [latest.get(id(run)) or run.info() for run in runs]


def explain_run(run: Run, info: JobInfo, attempts: tuple[str, ...] | None = None) -> Explanation:
    """The failure explanation of a run that did not complete (failures.explain with the run's log, the
    estimator's prediction, and the earlier attempts of a requeued job). A view of several runs passes
    `attempts` from its one `earlier_attempts_of` call; without it, sacct is asked for this run alone."""
    from workshop_lib.failures import explain

    return explain(info, run.stdout_path, predicted=_predicted_memory(run.experiment),
                   earlier_attempts=earlier_attempts(run) if attempts is None else attempts)


def explain_runs(pairs: Sequence[tuple[Run, JobInfo]]) -> list[Explanation]:
    """`explain_run` of several ended runs, with one sacct call for all their earlier attempts."""
    requeued = earlier_attempts_of([run for run, _ in pairs])
    return [explain_run(run, info, requeued.get(id(run), ())) for run, info in pairs]


def earlier_attempts(run: Run) -> tuple[str, ...]:
    """Attempts SLURM requeued before the last one (e.g. after NODE_FAIL), from sacct; () where unknown."""
    return earlier_attempts_of([run]).get(id(run), ())


def earlier_attempts_of(runs: Sequence[Run]) -> dict[int, tuple[str, ...]]:
    """`earlier_attempts` of several runs with one sacct call, keyed by id(run)."""
    recorded = {run.record.job_id: run for run in runs if run.record is not None and run.record.backend == "slurm"}
    if not recorded:
        return {}
    origin = {job_id: (str(run.directory), _epoch(run.record.submitted_at)) for job_id, run in recorded.items()}
    try:
        records = get_backend("slurm").accounting(list(recorded), duplicates=True, origin=origin) or {}
    except ClusterError:
        return {}
    found: dict[int, tuple[str, ...]] = {}
    for job_id, run in recorded.items():
        attempts = [records[key] for key in sorted(records, key=lambda k: int(k.split("#")[1]))
                    if key.split("#")[0] == job_id and (not run.record.job_name or not records[key].name
                                                        or records[key].name == run.record.job_name)]
        if len(attempts) > 1:
            found[id(run)] = tuple(info.state + (f" on {info.node_list}" if info.node_list else "")
                                   for info in attempts[:-1])
    return found


def _epoch(stamp: str) -> float:
    try:
        return datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return 0.0


def _predicted_memory(experiment: Experiment) -> str | None:
    try:
        from workshop_lib.estimate.memory import estimate_memory
        from workshop_lib.estimate.report import setup_from_experiment

        estimate = estimate_memory(experiment.model, setup_from_experiment(experiment))
    except Exception:  # noqa: BLE001 - a model the estimator does not know: no prediction, no failure
        return None
    return f"{estimate.total / 2**30:.1f} GiB per GPU (`workshop estimate {experiment.id}`)"


# ---- stopping ----------------------------------------------------------------------------------
def cancel_runs(experiments: Iterable[Experiment], root: Path | str | None = None) -> list[str]:
    """Cancel the queued or running job of each experiment's run (`workshop cancel`, a notebook's
    `nb.cancel_experiments`); one line per run says what was done. The run folders stay: re-running the
    chapter submits the cancelled runs again and reuses the completed ones."""
    runs = [load_run(experiment, root) for experiment in experiments]
    lines = []
    for run, info in zip(runs, query_runs(runs)):
        name = run.experiment.id
        if run.record is None:
            lines.append(f"{name}: nothing to cancel ({run.damage and 'job.json is damaged' or 'not submitted'})")
        elif info.state == UNKNOWN:
            lines.append(f"{name}: job {run.record.job_id} not cancelled: the scheduler does not answer "
                         f"({_first_line(info.reason)}); try again later")
        elif info.finished:
            lines.append(f"{name}: job {run.record.job_id} already ended ({info.state}): nothing to cancel")
        else:
            get_backend(run.record.backend).cancel(run.record.job_id)
            lines.append(f"{name}: cancelled job {run.record.job_id} (it was {info.state})")
    return lines


def read_only_info(run: Run) -> JobInfo:
    """What the run folder alone says, asking no scheduler (the book's read-only view): the recorded final
    state, else the end the job's log footer gives, else UNKNOWN (it may still run)."""
    if run.damage:
        return JobInfo(job_id="", state=DAMAGED, reason=run.damage)
    if run.record is None:
        return JobInfo(job_id="", state=NOT_SUBMITTED)
    if run.record.final_state:
        return query_runs([run])[0]  # the recorded state: no scheduler call
    ended = cluster.ended_from_log(JobInfo(job_id=run.record.job_id, state=FORGOTTEN,
                                           stdout_path=run.stdout_path, reason="read only: no scheduler asked"))
    return ended if ended.state != "LOST" else JobInfo(job_id=run.record.job_id, state=UNKNOWN,
                                                       stdout_path=run.stdout_path)


# ---- reading: status ----------------------------------------------------------------------------
@dataclass(frozen=True)
class RunStatus:
    """One line of `workshop status`."""

    experiment_id: str
    state: str
    job_id: str
    profile: str
    current: bool  # the recorded run is of this very experiment (same content hash)
    directory: Path
    explanation: str = ""  # why a run did not complete (or why its record cannot be read)


def run_status(experiments: Iterable[Experiment] | None = None, chapter: int | None = None,
               root: Path | str | None = None) -> list[RunStatus]:
    """The state of each experiment's run (NOT SUBMITTED when it has none); asks the scheduler once for
    all active runs and writes nothing."""
    if experiments is None:
        experiments = select_experiments(chapter=chapter) if chapter else _all()
    runs = [load_run(experiment, root) for experiment in experiments]
    infos = query_runs(runs)
    requeued = earlier_attempts_of([run for run, info in zip(runs, infos) if info.state != UNKNOWN])
    statuses = []
    for run, info in zip(runs, infos):
        record = run.record
        explanation = run.damage or ""
        if record is not None and info.finished and info.state != "COMPLETED":
            explanation = explain_run(run, info, requeued.get(id(run), ())).text()
        elif info.state == UNKNOWN:
            explanation = f"the scheduler does not answer: {_first_line(info.reason)}"
        elif requeued.get(id(run)):
            explanation = "\n".join(f"earlier attempt: {attempt} (SLURM requeued the job; its log holds both "
                                     "attempts)" for attempt in requeued[id(run)])
        statuses.append(RunStatus(
            experiment_id=run.experiment.id, state=info.state, job_id=record.job_id if record else "",
            profile=record.profile if record else "",
            current=bool(record and record.content_hash == run.experiment.content_hash), directory=run.directory,
            explanation=explanation))
    return statuses


def _all() -> list[Experiment]:
    from workshop_lib.experiments import all_experiments

    return all_experiments()
