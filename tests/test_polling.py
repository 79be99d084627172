"""How a notebook asks the scheduler: the shared-cluster policy on demand, exit codes from the poll itself, and
one answer shared by everyone in the process who asks within a short time (a monitor beside a waiter)."""

from __future__ import annotations

import pytest

from workshop_lib.jobs import job as job_module, watcher
from workshop_lib.jobs.job import Job, query_jobs
from workshop_lib.jobs.backend import PollPolicy
from workshop_lib.core.errors import ClusterError
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
    name = "counting"

    def __init__(self):
        self.asked: list[list[str]] = []

    def query(self, job_ids):
        self.asked.append(list(job_ids))
        return {job_id: JobInfo(job_id=job_id, state="RUNNING") for job_id in job_ids}

    def poll_policy(self):
        return PollPolicy(first=10.0, longest=15.0)


@pytest.fixture
def counting(monkeypatch):
    backend = CountingBackend()
    monkeypatch.setattr(watcher, "get_backend", lambda name: backend)
    monkeypatch.setattr(job_module, "get_backend", lambda name: backend)
    monkeypatch.setattr(job_module, "_ANSWERS", {})
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
