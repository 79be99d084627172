"""Job control: submit a script, follow its state, wait for many jobs, cancel.

The calls go to a Backend (`backend.py`): `slurm` (Ibex, or the project's local cluster) or `local`
(bash on this machine, SLURM-like, where no scheduler exists). Choose with `backend=` or
$WORKSHOP_BACKEND (slurm | local | auto); auto prefers SLURM.

A waiter asks once per poll for all of its jobs (one `squeue`), and polls less often as it waits
(the backend's PollPolicy). A job the scheduler has forgotten is settled from what it wrote when it
ended (the footer of its log), never from its absence.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from workshop_lib import slurm_output
from workshop_lib.backend import FORGOTTEN, PollPolicy, get_backend, resolve_backend
from workshop_lib.core.errors import ClusterError, JobFailed, SubmitError
from workshop_lib.parse.footer import parse_footer
from workshop_lib.slurm_output import FINAL_STATES, JobInfo  # noqa: F401  (re-exported: part of this module's API)

# The job footer's last lines (slurm/templates/blocks/footer.j2); a job that printed them has ended.
UNREACHABLE = "UNKNOWN"  # the scheduler could not be asked: the job may still run


# ---- the Job ------------------------------------------------------------------------------
@dataclass
class Job:
    """A submitted job. `info()` asks the scheduler each time it is called (until it has ended)."""

    job_id: str
    backend: str
    stdout_path: Path | None = None
    name: str | None = None
    _last: JobInfo | None = field(default=None, repr=False)

    def info(self) -> JobInfo:
        return query_jobs([self])[0]

    @property
    def state(self) -> str:
        return self.info().state

    @property
    def finished(self) -> bool:
        return self.info().finished

    def cancel(self) -> None:
        get_backend(self.backend).cancel(self.job_id)

    def release(self) -> None:
        """Let a job submitted with `hold=True` start."""
        get_backend(self.backend).release(self.job_id)

    def log_tail(self, lines: int = 20) -> str:
        return slurm_output.tail(self.info().stdout_path, lines)

    def accounting(self, timeout: float = 20.0) -> JobInfo:
        """The job's record in `sacct`, once accounting has caught up with the controller.

        sacct lags the controller by a second or more and may first show a provisional record:
        accept a final record only when it matches what the controller says, or, if the controller
        has forgotten the job, when it is stable across two reads.
        """
        if self.backend == "local":
            return self.info()
        slurm = get_backend("slurm")
        controller = self.info()
        deadline = time.monotonic() + timeout
        previous = None
        while True:
            records = slurm.accounting([self.job_id])
            if records is None:
                raise ClusterError("this cluster keeps no accounting (sacct is disabled): start the local "
                                   "cluster without --no-accounting, or read the job's state with `squeue`")
            record = records.get(self.job_id)
            if record is not None and record.finished:
                if controller.finished and controller.state != FORGOTTEN:
                    agrees = (record.state, record.exit_code, record.name) == (
                        controller.state, controller.exit_code, controller.name)
                else:
                    agrees = record == previous
                if agrees:
                    return record.with_stdout(self.stdout_path)
            if time.monotonic() > deadline:
                if record is not None:
                    return record.with_stdout(self.stdout_path)
                raise ClusterError(f"job {self.job_id} has no sacct record after {timeout:.0f} s: is slurmdbd "
                                   "running? (`workshop cluster status`; start without --no-accounting)")
            previous = record
            time.sleep(0.75)

    def raise_for_state(self) -> None:
        from workshop_lib.failures import explain

        info = self.info()
        if info.state != "COMPLETED":
            raise JobFailed(explain(info).text())

    def __repr__(self) -> str:  # short: shows up in notebooks
        return f"Job({self.job_id!r}, backend={self.backend!r})"


def submit(script: Path | str, workdir: Path | str | None = None, sbatch_args: Sequence[str] = (),
           backend: str | None = None, hold: bool = False) -> Job:
    """Submit a job script; returns its Job. Raises SubmitError with the scheduler's message if refused.
    With `hold`, the job waits until `Job.release()` (time to make its folder ready)."""
    script = Path(script).resolve()
    if not script.is_file():
        raise SubmitError(f"job script {script} does not exist; render it first (`workshop render ID -o FILE`)")
    workdir = Path(workdir).resolve() if workdir else script.parent
    chosen = resolve_backend(backend)
    submission = get_backend(chosen).submit(script, workdir, sbatch_args, hold=hold)
    with _ANSWERS_LOCK:  # a reset scheduler reuses ids: an answer about the id's earlier job is not this job's
        _ANSWERS.pop((chosen, submission.job_id), None)
    return Job(submission.job_id, chosen, stdout_path=submission.stdout_path, name=submission.name)


def job_from_id(job_id: str, backend: str | None = None, stdout_path: Path | None = None,
                name: str | None = None) -> Job:
    """A Job for an id submitted earlier (by this process or another)."""
    job_id = str(job_id)
    chosen = backend or ("local" if job_id.startswith("local-") else resolve_backend(None))
    return Job(job_id, chosen, stdout_path=stdout_path, name=name)


def test_only(script: Path | str, sbatch_args: Sequence[str] = ()) -> str:
    """Ask SLURM whether it would accept the script (`sbatch --test-only`); returns its answer."""
    from workshop_lib.slurm_backend import test_only as slurm_test_only

    return slurm_test_only(script, sbatch_args)


# ---- asking about many jobs at once ---------------------------------------------------------
# The process's latest answer per job, with when it came: a job monitor refreshing beside a waiter (or two
# waiters) reuses a fresh answer instead of asking the scheduler again, so one notebook stays one poller.
_ANSWERS: dict[tuple[str, str], tuple[float, JobInfo]] = {}
_ANSWERS_LOCK = threading.Lock()


def query_jobs(jobs: Sequence[Job], max_age_s: float = 0.0) -> list[JobInfo]:
    """Every job's state, with one backend call per backend for the jobs that have not ended.

    An answer this process got less than `max_age_s` seconds ago is reused (0: always ask).
    Raises ClusterError when a scheduler cannot be asked (the jobs may still run)."""
    asking: dict[str, list[Job]] = {}
    now = time.monotonic()
    for job in jobs:
        if job._last is not None and job._last.finished:  # an ended job does not change again
            continue
        with _ANSWERS_LOCK:
            cached = _ANSWERS.get((job.backend, job.job_id))
        if cached is not None and now - cached[0] <= max_age_s:
            job._last = _settle(job, cached[1])
        else:
            asking.setdefault(job.backend, []).append(job)
    for backend, group in asking.items():
        answers = get_backend(backend).query([job.job_id for job in group])
        stamp = time.monotonic()
        with _ANSWERS_LOCK:
            _ANSWERS.update({(backend, job.job_id): (stamp, answers[job.job_id]) for job in group})
        for job in group:
            job._last = _settle(job, answers[job.job_id])
    return [job._last for job in jobs]


def _settle(job: Job, info: JobInfo) -> JobInfo:
    """The answer as this job sees it: its log path, and an id the scheduler now gives another job
    (a fresh cluster state restarts ids) or one it forgot, settled from the job's own log."""
    if job.stdout_path is not None:
        info = info.with_stdout(job.stdout_path)
    elif info.stdout_path is not None:
        job.stdout_path = info.stdout_path
    if job.name and info.name and info.name != job.name and info.state != FORGOTTEN:
        info = JobInfo(job_id=job.job_id, state=FORGOTTEN, stdout_path=job.stdout_path,
                       reason=f"id {job.job_id} now belongs to job {info.name!r} (the scheduler's state was reset)")
    if info.state == FORGOTTEN:
        info = ended_from_log(info)
    return info


def ended_from_log(info: JobInfo) -> JobInfo:
    """A forgotten job's end as its log tells it: the footer's exit status when it got there, else LOST
    (it ended, the scheduler cannot say how, and its log has no footer)."""
    text = ""
    if info.stdout_path is not None:
        try:
            text = Path(info.stdout_path).read_text(errors="replace")
        except OSError:
            text = ""
    code = parse_footer(text).exit_status  # a requeued job's log holds each attempt: the last one counts
    if code is not None:
        return replace(info, state="COMPLETED" if code == 0 else "FAILED", exit_code=code,
                       reason=f"read from the job's footer ({info.reason})")
    return replace(info, state="LOST", reason=f"{info.reason}; its log has no footer, so it did not finish "
                                              "its script (killed, or its node or scheduler state was lost)")


# ---- waiting ------------------------------------------------------------------------------
def wait_for(jobs: Iterable[Job], timeout: float | None = None, poll_interval: float | None = None,
             progress: bool = True, policy: PollPolicy | None = None,
             on_poll: Callable[[list[JobInfo]], None] | None = None) -> list[JobInfo]:
    """Poll until every job has ended or `timeout` seconds passed; returns their last known states.

    One backend call per poll for all the jobs, at the backend's growing interval (or every
    `poll_interval` seconds). A scheduler that cannot be asked is reported and asked again: its jobs
    read UNKNOWN (never ended) until it answers. `on_poll` gets the states after each poll (a job
    monitor shows them: it asks the scheduler nothing itself)."""
    jobs = list(jobs)
    if not jobs:
        return []
    if poll_interval is not None:
        policy = PollPolicy(poll_interval, poll_interval)
    elif policy is None:
        policy = get_backend(jobs[0].backend).poll_policy()
        from workshop_lib.backend import longest_poll_override

        longest = longest_poll_override()
        if longest is not None:
            policy = PollPolicy(min(policy.first, longest), longest, policy.factor)
    intervals = policy.intervals()
    started = time.monotonic()
    bar = _progress_bar(len(jobs)) if progress else None
    infos = [job._last or JobInfo(job_id=job.job_id, state=UNREACHABLE) for job in jobs]
    try:
        while True:
            try:
                infos = query_jobs(jobs, max_age_s=policy.first / 2)
                trouble = ""
            except ClusterError as error:
                infos = [job._last if job._last is not None and job._last.finished
                         else JobInfo(job_id=job.job_id, state=UNREACHABLE, reason=str(error),
                                      stdout_path=job.stdout_path) for job in jobs]
                trouble = f"scheduler not answering, asking again: {str(error).splitlines()[0][:120]}"
            elapsed = time.monotonic() - started
            if bar is not None:
                _show(bar, infos, trouble)
            if on_poll is not None:
                on_poll(infos)
            if all(info.finished for info in infos):
                return infos
            if timeout is not None and elapsed >= timeout:
                if bar is not None:
                    bar.set_description("timed out waiting")
                return infos
            pause = next(intervals)
            if timeout is not None:
                pause = max(0.0, min(pause, timeout - elapsed))
            time.sleep(pause)
    finally:
        if bar is not None:
            bar.close()


def _progress_bar(total: int):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="jobs ended", unit="job", file=sys.stderr, dynamic_ncols=True)


def state_counts(infos: Sequence[JobInfo]) -> str:
    """'2 COMPLETED, 1 RUNNING, 1 PENDING' (ended states first)."""
    ended = Counter(info.state for info in infos if info.finished)
    active = Counter(info.state for info in infos if not info.finished)
    return ", ".join(f"{count} {state}" for state, count in [*sorted(ended.items()), *sorted(active.items())])


def _show(bar, infos: Sequence[JobInfo], trouble: str) -> None:
    bar.n = sum(info.finished for info in infos)
    bar.set_postfix_str(trouble or state_counts(infos), refresh=False)
    bar.refresh()
