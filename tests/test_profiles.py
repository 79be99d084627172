"""Site profiles: loaded into dataclasses, strict about keys, clear about what they cannot run."""

from __future__ import annotations

import pytest
import yaml

from workshop_lib.experiments import all_experiments, get_experiment
from workshop_lib.profiles import PROFILES_DIR, ProfileError, available_profiles, load_profile


def test_both_profiles_load():
    assert {"ibex", "tiny"} <= set(available_profiles())
    ibex, tiny = load_profile("ibex"), load_profile("tiny")
    assert ibex.scheduler.constraint == "a100" and ibex.nemo.enabled and ibex.has_nvidia_smi
    assert ibex.cache_root and "$HOME" not in ibex.cache_root
    assert not tiny.nemo.enabled and not tiny.has_nvidia_smi and tiny.rendezvous_host == "127.0.0.1"
    assert tiny.training.data == "synthetic" and tiny.model_name("mixtral-8x7b") == "tiny-mixtral"
    assert ibex.model_name("bloom-560m") == "bloom-560m"


def test_tiny_grid_is_cut_to_four_gpus_and_two_nodes():
    tiny, ibex = load_profile("tiny"), load_profile("ibex")
    for experiment in all_experiments():
        assert ibex.supports(experiment)
        assert tiny.supports(experiment) == (experiment.gpus <= 4 and experiment.nodes <= 2)
    with pytest.raises(ProfileError, match="16 GPUs.*at most 4"):
        tiny.require(get_experiment("zero/multi-node/8-nodes"))
    with pytest.raises(ProfileError, match="4 nodes.*at most 2"):
        tiny.require(get_experiment("fsdp/multi-node/4-nodes"))


def test_unknown_profile_lists_the_known_ones():
    with pytest.raises(ProfileError, match="unknown profile 'nowhere'.*ibex.*tiny"):
        load_profile("nowhere")


def test_a_copied_profile_with_a_typo_fails_on_that_key(tmp_path):
    data = yaml.safe_load((PROFILES_DIR / "tiny.yml").read_text())
    data["scheduler"]["constraints"] = "a100"
    path = tmp_path / "mysite.yml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError, match="unknown key.*'constraints'.*known keys.*constraint"):
        load_profile(path)


def test_a_copied_and_edited_profile_loads_from_its_path(tmp_path):
    data = yaml.safe_load((PROFILES_DIR / "ibex.yml").read_text())
    data["name"] = "mysite"
    data["scheduler"]["reservation"] = "workshop-day"
    path = tmp_path / "mysite.yml"
    path.write_text(yaml.safe_dump(data))
    profile = load_profile(str(path))
    assert profile.name == "mysite" and profile.scheduler.reservation == "workshop-day"
    assert profile.time_limit(2) == "08:00:00"


def test_missing_required_key_is_named(tmp_path):
    path = tmp_path / "bad.yml"
    path.write_text("name: bad\nscheduler: {}\n")
    with pytest.raises(ProfileError, match="'python' is missing"):
        load_profile(path)
