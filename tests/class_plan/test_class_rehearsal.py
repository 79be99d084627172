"""The class rehearsal, lean: 5 participants (Linux users) run chapter 1 at once against one controller.

benchmarks/class_rehearsal/class_rehearsal.py does the whole day in small: users, a real reservation, a
read-only staged folder every job reads, one papermill process per participant on the rehearsal profile
(jobs sleep and write a run's files). The 30-user figures are in benchmarks/NOTES.md; this test keeps the
properties that must hold for any class size: every table filled, one job per experiment and participant
(none doubled, none lost, all in the reservation), and the polling inside the controller's budget.
"""

from __future__ import annotations

import os
import sys

import pytest
from repo_paths import REPO

sys.path.insert(0, str(REPO / "benchmarks" / "class_rehearsal"))

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

RPC_BUDGET_PER_MINUTE = 12


@pytest.fixture(scope="module")
def rehearsal():
    if os.geteuid() != 0:
        pytest.skip("the rehearsal creates Linux users and a reservation: it needs root (CI runs as root)")
    from class_rehearsal import rehearse

    saved = os.environ.pop("SLURM_CONF", None)  # the rehearsal starts its own cluster, reachable by its users
    try:
        return rehearse(users=5, chapter=1, nodes=4, sleep_s=2.0, sample_s=5.0)
    finally:
        if saved is not None:
            os.environ["SLURM_CONF"] = saved


def test_every_participant_gets_every_table_filled(rehearsal):
    failed = [(n["user"], n["error"], n["table_problems"]) for n in rehearsal["notebooks"]
              if n["error"] or n["table_problems"]]
    assert not failed, failed
    assert all(n["tables"] >= 2 for n in rehearsal["notebooks"])  # chapter 1: Llama and Mixtral


def test_one_job_per_experiment_and_participant_all_in_the_reservation(rehearsal):
    assert rehearsal["experiments"] == 5 * rehearsal["setup"]["experiments_per_notebook"] > 0
    assert rehearsal["jobs_submitted"] == rehearsal["experiments"]
    assert rehearsal["duplicates"] == [] and rehearsal["lost"] == [] and rehearsal["not_completed"] == []
    assert rehearsal["outside_reservation"] == []


def test_polling_stays_inside_the_controllers_budget(rehearsal):
    # One squeue per poll for all of a notebook's jobs (2 RPCs: no federation lookup, no scontrol per ended job),
    # at the shared-cluster back-off; submitting costs 2 RPCs per job on top (sbatch --hold, scontrol release).
    by_type = rehearsal["rpcs_by_type"]
    assert "REQUEST_JOB_INFO_SINGLE" not in by_type and "REQUEST_FED_INFO" not in by_type, by_type
    assert by_type["REQUEST_JOB_USER_INFO"] == by_type["REQUEST_PARTITION_INFO"]
    from workshop_lib.jobs.slurm import CLUSTER_POLLING

    assert 2 * 60 / CLUSTER_POLLING.first <= RPC_BUDGET_PER_MINUTE
    for notebook in rehearsal["notebooks"]:
        polls = 1 + int(notebook["seconds"] / CLUSTER_POLLING.first)  # one at the start, then one per interval
        assert notebook["polling_rpcs"] <= 2 * polls, notebook
