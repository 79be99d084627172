"""How a notebook asks the scheduler: the shared-cluster policy on demand, exit codes from the poll itself,
one answer shared by everyone in the process who asks within a short time, and one watcher that polls for all
of a process's waiters and its job monitor; a job's backend known by its id, accounting where a backend has it."""

from __future__ import annotations

import threading
import time

import pytest

from workshop_lib.core.errors import ClusterError
from workshop_lib.jobs import job as job_module
from workshop_lib.jobs import watcher
from workshop_lib.jobs.backend import BACKENDS, PollPolicy
from workshop_lib.jobs.job import Job, job_from_id, query_jobs
from workshop_lib.jobs.slurm_output import JobInfo, parse_wait_status


def test_ended_jobs_exit_code_and_signal_come_from_squeues_wait_status():
    assert parse_wait_status("768") == (3, None)  # exit 3
    assert parse_wait_status("0") == (0, None)
    assert parse_wait_status("9") == (0, 9)  # killed by SIGKILL, as scontrol's ExitCode=0:9
    assert parse_wait_status("") == (None, None)


def test_the_shared_policy_is_chosen_by_name_even_on_the_projects_cluster(monkeypatch):
    from workshop_lib.jobs import slurm as slurm_backend

    monkeypatch.setattr(slurm_backend, "_is_project_cluster", lambda: True)
    monkeypatch.delenv("WORKSHOP_POLL_POLICY", raising=False)
    assert slurm_backend.BACKEND.poll_policy() == slurm_backend.LOCAL_CLUSTER_POLLING
    monkeypatch.setenv("WORKSHOP_POLL_POLICY", "shared")
    assert slurm_backend.BACKEND.poll_policy() == slurm_backend.CLUSTER_POLLING
    monkeypatch.setenv("WORKSHOP_POLL_POLICY", "sometimes")
    with pytest.raises(ClusterError, match="WORKSHOP_POLL_POLICY='sometimes': use one of auto, shared, local"):
        slurm_backend.BACKEND.poll_policy()


class CountingBackend:
    """A scheduler that counts its queries; its jobs run until it has answered `running_for` queries."""

    name = "counting"

    def __init__(self, running_for: int | None = None):
        self.asked: list[list[str]] = []
        self.asked_at: list[float] = []
        self.running_for = running_for

    def query(self, job_ids):
        self.asked.append(list(job_ids))
        self.asked_at.append(time.monotonic())
        state = "COMPLETED" if self.running_for is not None and len(self.asked) > self.running_for else "RUNNING"
        return {job_id: JobInfo(job_id=job_id, state=state, exit_code=0 if state == "COMPLETED" else None,
                                elapsed_s=1.0) for job_id in job_ids}

    def poll_policy(self):
        return PollPolicy(first=10.0, longest=15.0)


@pytest.fixture
def counting(monkeypatch):
    backend = CountingBackend()
    monkeypatch.setitem(BACKENDS, "counting", __name__)  # a known backend: job.json may name it
    monkeypatch.setattr(watcher, "get_backend", lambda name: backend)
    monkeypatch.setattr(job_module, "get_backend", lambda name: backend)
    monkeypatch.setattr(watcher, "WATCHER", watcher.Watcher())  # a fresh answer cache, no registration
    return backend


def test_a_fresh_answer_is_reused_by_the_next_asker_within_its_age(counting):
    jobs = [Job("11", "counting"), Job("12", "counting")]
    query_jobs(jobs)
    monitor_view = [Job("11", "counting"), Job("12", "counting")]
    assert [info.state for info in query_jobs(monitor_view, max_age_s=5.0)] == ["RUNNING", "RUNNING"]
    assert counting.asked == [["11", "12"]], "a monitor asked again right after the waiter's poll"
    query_jobs(monitor_view)  # max_age 0: Job.info() and friends always ask
    assert len(counting.asked) == 2


def test_the_waiter_hands_each_poll_to_its_listener(counting):
    seen = []
    infos = watcher.wait_for([Job("21", "counting")], timeout=0.0, progress=False, on_poll=seen.append)
    assert seen == [infos] and infos[0].state == "RUNNING" and len(counting.asked) == 1


def test_two_waiters_and_a_monitor_in_one_process_are_one_poller(counting, tmp_path):
    from workshop_lib.experiments import get_experiment
    from workshop_lib.runs import RunRecord, load_run
    from workshop_lib.widgets import JobMonitor

    interval = 0.4
    counting.running_for = 7  # the jobs end at the 8th query
    runs = []
    for job_id, experiment_id in (("31", "zero/single-gpu/zero1"), ("32", "zero/single-gpu/zero2")):
        run = load_run(get_experiment(experiment_id), tmp_path)
        run.directory.mkdir(parents=True)
        RunRecord(experiment_id=experiment_id, content_hash="x", profile="tiny", job_id=job_id, backend="counting",
                  submitted_at="2026-01-01T00:00:00+00:00", stdout=f"slurm-{job_id}.out").save(run.directory)
        runs.append(load_run(get_experiment(experiment_id), tmp_path))
    ended: list[list[JobInfo]] = []

    def waiter() -> None:
        jobs = [Job("31", "counting"), Job("32", "counting")]
        ended.append(watcher.wait_for(jobs, timeout=30, poll_interval=interval, progress=False))

    # Out of step on purpose: each comes more than half an interval after the one before (its first answer is
    # then asked at once), so pollers of their own would each keep their own beat.
    waiters = [threading.Thread(target=waiter) for _ in range(2)]
    for thread in waiters:
        thread.start()
        time.sleep(0.6 * interval)
    everyone_in = time.monotonic()
    monitor = JobMonitor(runs=runs, interval_s=interval, interactive=False).start()
    for thread in waiters:
        thread.join(30)
    deadline = time.monotonic() + 5
    while (monitor.running or watcher.WATCHER._thread is not None) and time.monotonic() < deadline:
        time.sleep(0.02)

    assert [[info.state for info in infos] for infos in ended] == [["COMPLETED", "COMPLETED"]] * 2
    assert [row.state for row in monitor.rows] == ["COMPLETED", "COMPLETED"] and not monitor.running
    assert len(counting.asked) == 8 and all(sorted(ids) == ["31", "32"] for ids in counting.asked), counting.asked
    # Once all three are in, one query per interval for all of them: each a whole interval after the one before.
    since = [at for at in counting.asked_at if at >= everyone_in]
    pauses = [later - earlier for earlier, later in zip(since, since[1:])]
    assert len(pauses) >= 3 and min(pauses) >= 0.9 * interval, pauses
    assert watcher.WATCHER._thread is None  # nobody waits or shows: the watcher's thread has ended


def test_a_waiter_reports_an_unreachable_scheduler_and_asks_again(counting, monkeypatch):
    failures = iter([ClusterError("squeue failed: Unable to contact slurm controller")])
    answer = counting.query

    def flaky(job_ids):
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return answer(job_ids)

    monkeypatch.setattr(counting, "query", flaky)
    seen: list[list[str]] = []
    [info] = watcher.wait_for([Job("51", "counting")], timeout=0.3, poll_interval=0.1, progress=False,
                              on_poll=lambda infos: seen.append([i.state for i in infos]))
    assert seen[0] == ["UNKNOWN"] and seen[-1] == ["RUNNING"] and info.state == "RUNNING"


def test_a_job_id_names_its_backend(monkeypatch):
    monkeypatch.setenv("WORKSHOP_BACKEND", "local")
    assert job_from_id("local-7").backend == "local"
    assert job_from_id("1234").backend == "slurm" and job_from_id("1234_5").backend == "slurm"
    assert job_from_id("1234", backend="local").backend == "local"  # said outright: taken as said
    assert job_from_id("my-job").backend == "local"  # nobody's shape: the backend this process uses


def test_accounting_is_what_a_backend_has(counting, monkeypatch):
    assert Job("41", "counting").accounting().state == "RUNNING"  # no accounting: the job's state answers
    monkeypatch.setattr(counting, "accounting", lambda job_ids: None, raising=False)
    with pytest.raises(ClusterError, match="keeps no accounting"):
        Job("42", "counting").accounting()
