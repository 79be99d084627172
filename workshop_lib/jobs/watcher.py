"""The process's one watcher: it asks the schedulers about every job someone in this process waits for or shows,
all of them in one poll per interval, and hands each the answers; it also keeps the latest answer per job.

A notebook's waiters (`wait_for`) and its job monitor register here: two waiters and a monitor are still one
poller. The watcher's thread starts with the first registration and ends when the last one leaves. Each
registration brings its polling policy (the backend's, `backend.poll_policy()`, capped by WORKSHOP_POLL_MAX_S);
a poll is due when some registration's pause since its last answer is over, and then answers every
registration, so the scheduler is asked at the pace of the fastest one, never once per registration.

This module knows a job only by what it asks of it (`backend`, `job_id`, `stdout_path`, `_last` and `settle`),
so `job.py` can ask through it without a loop.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from workshop_lib.core.errors import ClusterError, WorkshopError
from workshop_lib.jobs.backend import PollPolicy, get_backend, longest_poll_override
from workshop_lib.jobs.states import UNKNOWN, JobInfo

if TYPE_CHECKING:
    from workshop_lib.jobs.job import Job

UNREACHABLE = UNKNOWN  # the scheduler could not be asked: the job may still run


@dataclass(frozen=True)
class Poll:
    """What one poll brought a registration: its jobs' answers (in its order), or why there are none.
    The answers of this poll (a failure to answer included) are in the watcher's cache, none older than
    `fresh_since` (monotonic seconds): `query_jobs(..., max_age_s=time.monotonic() - fresh_since)` reads them."""

    infos: list[JobInfo] | None
    failure: Exception | None
    fresh_since: float
    polled_at: float


class Watch:
    """One registration on the watcher: which jobs to ask about, who gets the answers, how often."""

    def __init__(self, watcher: Watcher, jobs_of: Callable[[], Sequence[Job]], on_poll: Callable[[Poll], None],
                 policy: PollPolicy, until: float | None):
        self._watcher = watcher
        self.jobs_of = jobs_of
        self.on_poll = on_poll
        self.max_age_s = policy.first / 2  # an answer someone got this recently is as good as a new one
        self.until = until  # a waiter's deadline: it gets a poll then, whatever its pause
        self.due_at = 0.0  # the first poll comes at once
        self.active = True
        self.error: Exception | None = None  # what `on_poll` raised (the watch then ended)
        self._intervals = policy.intervals()
        self._delivering = threading.Lock()

    def _schedule(self, polled_at: float) -> None:
        if self.until is not None and polled_at >= self.until:
            self.until = None  # the deadline's poll is done: back to the policy's pace
        due = polled_at + next(self._intervals)
        self.due_at = due if self.until is None else min(due, self.until)

    def cancel(self, timeout: float = 10.0) -> None:
        """Leave the watcher; returns once an answer being handed over has been handled (up to `timeout`)."""
        self.active = False
        self._watcher._leave(self)
        if threading.current_thread() is not self._watcher._thread and self._delivering.acquire(timeout=timeout):
            self._delivering.release()


class Watcher:
    """Holds the process's latest answer per job and polls for every registration (see the module docstring)."""

    def __init__(self):
        self._answers: dict[tuple[str, str], tuple[float, JobInfo]] = {}
        self._failures: dict[str, tuple[float, ClusterError]] = {}  # a backend that did not answer, and when
        self._cache_lock = threading.Lock()
        self._changed = threading.Condition()
        self._watches: list[Watch] = []
        self._thread: threading.Thread | None = None

    # ---- the answer cache --------------------------------------------------------------------------
    def ask(self, jobs: Sequence[Job], max_age_s: float = 0.0) -> list[JobInfo]:
        """Every job's state, with one backend call per backend for the jobs that have not ended (each id once).

        An answer this process got less than `max_age_s` seconds ago is reused (0: always ask), and so is a
        backend's failure to answer. Raises ClusterError when a scheduler cannot be asked (the jobs may still run)."""
        asking: dict[str, dict[str, list[Job]]] = {}
        now = time.monotonic()
        for job in jobs:
            if job._last is not None and job._last.finished:  # an ended job does not change again
                continue
            with self._cache_lock:
                cached = self._answers.get((job.backend, job.job_id))
            if cached is not None and now - cached[0] <= max_age_s:
                job._last = job.settle(cached[1])
            else:
                asking.setdefault(job.backend, {}).setdefault(job.job_id, []).append(job)
        for backend, by_id in asking.items():
            with self._cache_lock:
                failed = self._failures.get(backend)
            if failed is not None and now - failed[0] <= max_age_s:
                raise failed[1]
            try:
                answers = get_backend(backend).query(list(by_id))
            except ClusterError as error:
                with self._cache_lock:
                    self._failures[backend] = (time.monotonic(), error)
                raise
            stamp = time.monotonic()
            with self._cache_lock:
                self._answers.update({(backend, job_id): (stamp, answers[job_id]) for job_id in by_id})
                self._failures.pop(backend, None)
            for job_id, group in by_id.items():
                for job in group:
                    job._last = job.settle(answers[job_id])
        return [job._last for job in jobs]

    def forget(self, backend: str, job_id: str) -> None:
        """Drop the answer about an id (a reset scheduler reuses ids: an answer about its earlier job is not
        the new job's)."""
        with self._cache_lock:
            self._answers.pop((backend, job_id), None)

    # ---- registrations -------------------------------------------------------------------------------
    def watch(self, jobs_of: Callable[[], Sequence[Job]], on_poll: Callable[[Poll], None], policy: PollPolicy,
              until: float | None = None) -> Watch:
        """Ask about `jobs_of()` at every poll from now on and hand `on_poll` the answers (on the watcher's
        thread), at least every pause of `policy`, and once at `until` (monotonic seconds), until cancelled."""
        watch = Watch(self, jobs_of, on_poll, policy, until)
        with self._changed:
            self._watches.append(watch)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="workshop-job-watcher", daemon=True)
                self._thread.start()
            self._changed.notify_all()
        return watch

    def _leave(self, watch: Watch) -> None:
        with self._changed:
            if watch in self._watches:
                self._watches.remove(watch)
            self._changed.notify_all()

    def _run(self) -> None:
        while True:
            with self._changed:
                while True:
                    if not self._watches:  # nobody left: the thread ends, the next registration starts another
                        self._thread = None
                        return
                    pause = min(watch.due_at for watch in self._watches) - time.monotonic()
                    if pause <= 0:
                        break
                    self._changed.wait(pause)
                watches = list(self._watches)
            self._poll(watches)

    def _poll(self, watches: list[Watch]) -> None:
        """One poll: every registration's jobs in one `ask`, the answers handed to each."""
        max_age_s = min(watch.max_age_s for watch in watches)
        fresh_since = time.monotonic() - max_age_s
        asked: list[tuple[Watch, list[Job] | None, Exception | None]] = []
        for watch in watches:
            try:
                asked.append((watch, list(watch.jobs_of()), None))
            except Exception as error:  # noqa: BLE001 - that registration's own trouble: handed to it below
                asked.append((watch, None, error))
        failure: Exception | None = None
        try:
            self.ask([job for _, jobs, _ in asked for job in jobs or ()], max_age_s)
        except Exception as error:  # noqa: BLE001 - handed to every registration: a waiter decides what it means
            failure = error
        polled_at = time.monotonic()
        for watch, jobs, own_failure in asked:
            trouble = own_failure or failure
            poll = Poll(infos=None if trouble else [job._last for job in jobs], failure=trouble,
                        fresh_since=fresh_since, polled_at=polled_at)
            watch._schedule(polled_at)
            with watch._delivering:
                if not watch.active:
                    continue
                try:
                    watch.on_poll(poll)
                except Exception as error:  # noqa: BLE001 - a registration's handler failed: it ends, others go on
                    watch.error = error
                    watch.active = False
                    self._leave(watch)


WATCHER = Watcher()


def query_jobs(jobs: Sequence[Job], max_age_s: float = 0.0) -> list[JobInfo]:
    """Every job's state, with one backend call per backend for the jobs that have not ended.

    An answer this process got less than `max_age_s` seconds ago is reused (0: always ask).
    Raises ClusterError when a scheduler cannot be asked (the jobs may still run)."""
    return WATCHER.ask(jobs, max_age_s)


def poll_policy_for(backend: str) -> PollPolicy:
    """How often to ask `backend`: its own policy (`poll_policy()`, WORKSHOP_POLL_POLICY), its longest pause
    capped by WORKSHOP_POLL_MAX_S."""
    policy = get_backend(backend).poll_policy()
    longest = longest_poll_override()
    if longest is not None:
        policy = PollPolicy(min(policy.first, longest), longest, policy.factor)
    return policy


# ---- waiting ------------------------------------------------------------------------------
class _Inbox:
    """The latest poll handed to a waiter, which takes it on its own thread (its progress bar, its `on_poll`)."""

    def __init__(self):
        self._arrived = threading.Condition()
        self._poll: Poll | None = None

    def put(self, poll: Poll) -> None:
        with self._arrived:
            self._poll = poll
            self._arrived.notify_all()

    def take(self) -> Poll:
        with self._arrived:
            while self._poll is None:
                self._arrived.wait()
            poll, self._poll = self._poll, None
            return poll


def wait_for(jobs: Iterable[Job], timeout: float | None = None, poll_interval: float | None = None,
             progress: bool = True, policy: PollPolicy | None = None,
             on_poll: Callable[[list[JobInfo]], None] | None = None) -> list[JobInfo]:
    """Wait until every job has ended or `timeout` seconds passed; returns their last known states.

    The process's watcher asks about these jobs together with everyone else's, one backend call per poll, at
    the backend's growing interval (or every `poll_interval` seconds). A scheduler that cannot be asked is
    reported and asked again: its jobs read UNKNOWN (never ended) until it answers. `on_poll` gets the states
    after each poll (a job monitor shows them: it asks the scheduler nothing itself)."""
    jobs = list(jobs)
    if not jobs:
        return []
    if threading.current_thread() is WATCHER._thread:  # it would wait for the very thread it stops
        raise WorkshopError("wait_for was called from a job monitor's refresh (the watcher's thread): wait in a "
                           "cell or another thread, and show the states the monitor is handed")
    if poll_interval is not None:
        policy = PollPolicy(poll_interval, poll_interval)
    elif policy is None:
        policy = poll_policy_for(jobs[0].backend)
    started = time.monotonic()
    bar = _progress_bar(len(jobs)) if progress else None
    inbox = _Inbox()
    watch = WATCHER.watch(lambda: jobs, inbox.put, policy, until=None if timeout is None else started + timeout)
    try:
        while True:
            poll = inbox.take()
            if poll.failure is None:
                infos, trouble = poll.infos, ""
            elif isinstance(poll.failure, ClusterError):
                infos = [job._last if job._last is not None and job._last.finished
                         else JobInfo(job_id=job.job_id, state=UNREACHABLE, reason=str(poll.failure),
                                      stdout_path=job.stdout_path) for job in jobs]
                trouble = f"scheduler not answering, asking again: {str(poll.failure).splitlines()[0][:120]}"
            else:
                raise poll.failure
            if bar is not None:
                _show(bar, infos, trouble)
            if on_poll is not None:
                on_poll(infos)
            if all(info.finished for info in infos):
                return infos
            if timeout is not None and poll.polled_at - started >= timeout:
                if bar is not None:
                    bar.set_description("timed out waiting")
                return infos
    finally:
        watch.cancel()
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
