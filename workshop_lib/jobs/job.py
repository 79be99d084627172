"""One job on a scheduler: submit it, find it again by id, ask and settle its state (asked through the
process's watcher, which keeps its latest answer per job), and read its accounting record.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from workshop_lib.core.errors import ClusterError, JobFailed, SubmitError
from workshop_lib.core.log_text import read_tail
from workshop_lib.jobs import slurm_output, watcher
from workshop_lib.jobs.backend import BACKENDS, get_backend, resolve_backend
from workshop_lib.jobs.footer import parse_footer
from workshop_lib.jobs.states import COMPLETED, FAILED, FORGOTTEN, LOST, JobInfo
from workshop_lib.jobs.watcher import query_jobs


# ---- the Job ------------------------------------------------------------------------------
@dataclass
class Job:
    """A submitted job. `info()` asks the scheduler each time it is called (until it has ended)."""

    job_id: str
    backend: str
    stdout_path: Path | None = None
    name: str | None = None
    workdir: Path | None = None  # where it was submitted to run: an id the scheduler now gives a job elsewhere differs
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
        has forgotten the job, when it is stable across two reads. A backend that keeps no accounting
        (no `accounting` method) answers with the job's state.
        """
        accounting = getattr(get_backend(self.backend), "accounting", None)
        if accounting is None:  # a backend without accounting (the local executor): its own record is final
            return self.info()
        controller = self.info()
        deadline = time.monotonic() + timeout
        previous = None
        while True:
            records = accounting([self.job_id])
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

    def settle(self, info: JobInfo) -> JobInfo:
        """A scheduler's answer as this job sees it: its log path, and an id the scheduler now gives another job
        (a fresh cluster state restarts ids) or one it forgot, settled from the job's own log."""
        if self.stdout_path is not None:
            info = info.with_stdout(self.stdout_path)
        elif info.stdout_path is not None:
            self.stdout_path = info.stdout_path
        if self.name and info.name and info.name != self.name and info.state != FORGOTTEN:
            info = JobInfo(job_id=self.job_id, state=FORGOTTEN, stdout_path=self.stdout_path, reason=(
                f"id {self.job_id} now belongs to job {info.name!r} (the scheduler's state was reset)"))
        elif self.workdir and info.workdir and not _same_folder(self.workdir, info.workdir) \
                and info.state != FORGOTTEN:
            # The same name is no proof: every run of one experiment has it, whatever its runs folder.
            info = JobInfo(job_id=self.job_id, state=FORGOTTEN, stdout_path=self.stdout_path, reason=(
                f"id {self.job_id} now belongs to a job in {info.workdir} (the scheduler's state was reset)"))
        if info.state == FORGOTTEN:
            info = ended_from_log(info)
        return info

    def raise_for_state(self) -> None:
        from workshop_lib.jobs.failures import explain

        info = self.info()
        if info.state != COMPLETED:
            raise JobFailed(explain(info).text())

    def __repr__(self) -> str:  # short: shows up in notebooks
        return f"Job({self.job_id!r}, backend={self.backend!r})"


def _same_folder(first: Path, second: Path) -> bool:
    return Path(first).resolve() == Path(second).resolve()


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
    watcher.WATCHER.forget(chosen, submission.job_id)  # a reset scheduler reuses ids: not this job's answer
    return Job(submission.job_id, chosen, stdout_path=submission.stdout_path, name=submission.name, workdir=workdir)


def job_from_id(job_id: str, backend: str | None = None, stdout_path: Path | None = None,
                name: str | None = None, workdir: Path | None = None) -> Job:
    """A Job for an id submitted earlier (by this process or another): on `backend`, else on the backend whose
    ids look like this one (`Backend.owns`), else on the one this process uses."""
    job_id = str(job_id)
    return Job(job_id, backend or _owner(job_id), stdout_path=stdout_path, name=name, workdir=workdir)


def _owner(job_id: str) -> str:
    owners = [candidate for candidate in BACKENDS if get_backend(candidate).owns(job_id)]
    return owners[0] if len(owners) == 1 else resolve_backend(None)


def test_only(script: Path | str, sbatch_args: Sequence[str] = ()) -> str:
    """Ask SLURM whether it would accept the script (`sbatch --test-only`); returns its answer."""
    from workshop_lib.jobs.slurm import test_only as slurm_test_only

    return slurm_test_only(script, sbatch_args)


def ended_from_log(info: JobInfo) -> JobInfo:
    """A forgotten job's end as its log tells it: the footer's exit status when it got there, else LOST
    (it ended, the scheduler cannot say how, and its log has no footer)."""
    # The footer is the log's end (a requeued job's log holds each attempt's: the last one counts).
    code = parse_footer(read_tail(info.stdout_path)).exit_status
    if code is not None:
        return replace(info, state=COMPLETED if code == 0 else FAILED, exit_code=code,
                       reason=f"read from the job's footer ({info.reason})")
    return replace(info, state=LOST, reason=f"{info.reason}; its log has no footer, so it did not finish "
                                              "its script (killed, or its node or scheduler state was lost)")
