"""Asking about many jobs at once and waiting for them: the process's answer cache (one poller per
notebook), the polling policy, the progress bar.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

from workshop_lib.core.errors import ClusterError
from workshop_lib.jobs.backend import PollPolicy, get_backend
from workshop_lib.jobs.job import Job, UNREACHABLE, query_jobs
from workshop_lib.jobs.slurm_output import JobInfo

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
        from workshop_lib.jobs.backend import longest_poll_override

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
