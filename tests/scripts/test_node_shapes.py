"""Node shapes: a job asks for the smallest node shape that holds its GPUs per node (Ibex: `a100,4gpus` up to
4 GPUs, `a100,8gpus` for 8), so small jobs never take the scarce 8-GPU nodes."""

from __future__ import annotations

import pytest

from workshop_lib.experiments import all_experiments, get_experiment
from workshop_lib.scripts import render_script
from workshop_lib.sites.profiles import ProfileError, load_profile, profile_from_dict


@pytest.mark.parametrize("experiment_id, constraint", [
    ("lora/llama/1-gpu", "a100,4gpus"), ("lora/mixtral/4-gpus", "a100,4gpus"), ("lora/llama/8-gpus", "a100,8gpus"),
    ("zero/multi-node/8-nodes", "a100,4gpus"),  # 8 nodes x 2 GPUs: 2 per node fit the 4-GPU nodes
    ("model-parallel/mixtral/tp2-pp4-ep2-sp", "a100,8gpus"),
])
def test_ibex_jobs_ask_for_the_smallest_node_shape_that_holds_them(experiment_id, constraint):
    script = render_script(get_experiment(experiment_id), "ibex")
    assert f"#SBATCH --constraint={constraint}\n" in script


def test_every_ibex_job_names_a_node_shape():
    ibex = load_profile("ibex")
    for experiment in all_experiments():
        assert ibex.scheduler.constraint_for(experiment.gpus_per_node) in ("a100,4gpus", "a100,8gpus"), experiment.id


def test_a_profile_without_shapes_keeps_its_constraint_alone():
    workstation = load_profile("gpu-workstation")
    assert workstation.scheduler.constraint_for(1) is None
    base = {"name": "site", "scheduler": {"constraint": "v100", "gpu_node_features": {4: "quad"}}, "python": {},
            "training": {}}
    site = profile_from_dict(base)
    assert site.scheduler.constraint_for(2) == "v100,quad"
    assert site.scheduler.constraint_for(8) == "v100"  # no shape large enough: SLURM says if no node fits


def test_a_bad_node_feature_is_refused_with_the_key():
    bad = {"name": "site", "scheduler": {"gpu_node_features": {4: "4gpus; rm"}}, "python": {}, "training": {}}
    with pytest.raises(ProfileError, match=r"scheduler\.gpu_node_features\[\]: expected a SLURM node feature"):
        profile_from_dict(bad)
    with pytest.raises(ProfileError, match=r"GPUs per node of that node shape"):
        profile_from_dict({**bad, "scheduler": {"gpu_node_features": {0: "none"}}})
