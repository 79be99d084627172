"""The class day rehearsed, lean: 2 participants follow the class plan's chapter 1 on a local cluster shaped like
a reservation (4-GPU and 8-GPU nodes), reading the reservation back from `scontrol` as on Ibex.

benchmarks/class_rehearsal/class_day.py runs the whole day for 30 participants (figures in benchmarks/NOTES.md);
this test keeps what must hold at any size: the plan is made from the real `scontrol show reservation` and
`scontrol show node` of the cluster, every job ends, none lands on a node of another shape than the plan's, and
the chapter lasts about what the plan predicts (it cannot be shorter: every job sleeps its planned time).
"""

from __future__ import annotations

import os
import sys

import pytest
from repo_paths import REPO

sys.path.insert(0, str(REPO / "benchmarks" / "class_rehearsal"))

pytestmark = [pytest.mark.slow, pytest.mark.cluster]


@pytest.fixture(scope="module")
def rehearsal():
    if os.geteuid() != 0:
        pytest.skip("the rehearsal creates Linux users and a reservation: it needs root (CI runs as root)")
    from class_day import rehearse_day

    saved = os.environ.pop("SLURM_CONF", None)  # the rehearsal starts its own cluster, reachable by its users
    try:
        return rehearse_day(participants=2, nodes_4gpu=3, nodes_8gpu=1, seconds_per_hour=30.0, chapters=(1,),
                            timeout_s=300)
    finally:
        os.environ.pop("SLURM_CONF", None)
        if saved is not None:
            os.environ["SLURM_CONF"] = saved


def test_the_plan_is_read_from_the_reservation_and_every_job_ends_on_its_shape(rehearsal):
    assert "3 four-GPU + 1 eight-GPU nodes (20 GPUs)" in rehearsal["setup"]["reservation"]
    assert rehearsal["setup"]["reservation_users"] == 2
    [chapter] = rehearsal["chapters"]
    assert chapter["jobs"] == 2 + 8  # the core run twice, four split runs by two participants each
    assert chapter["states"] == ["COMPLETED"] and chapter["on_another_shape"] == []


def test_the_chapter_lasts_about_what_the_plan_predicts(rehearsal):
    [chapter] = rehearsal["chapters"]
    assert chapter["measured_s"] >= 0.9 * chapter["predicted_s"]  # sleeps are the plan's: never much shorter
    assert chapter["measured_s"] <= chapter["predicted_s"] + 20  # start-up and clean-up of a few jobs in a row
