"""Site profiles: loaded into dataclasses, strict about keys, clear about what they cannot run."""

from __future__ import annotations

import pytest
import yaml

from workshop_lib.experiments import all_experiments, get_experiment
from workshop_lib.sites.profiles import PROFILES_DIR, ProfileError, available_profiles, load_profile


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
    with pytest.raises(ProfileError, match=r"mysite\.yml: unknown key.*'scheduler\.constraints'.*known keys of scheduler.*constraint"):
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


def _write(tmp_path, data, name="site.yml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("key_path, value, expected", [
    # the two injections the audit ran on a cluster (issue 18)
    ("cpu_monitor_interval_s", "1 --log /dev/null & touch /tmp/pwned", r"cpu_monitor_interval_s: expected .*integer"),
    ("cache_root", "/scratch/$(touch /tmp/pwned)", r"cache_root: expected a path .*no quotes.*\$\( \)"),
    ("python.modules", "cuda/12.4.1", r"python\.modules: expected a list"),  # a string rendered one letter per line
    ("python.modules", ["cuda; touch /tmp/pwned"], r"python\.modules\[\]: expected an environment module name"),
    ("scheduler.reservation", "day one", r"scheduler\.reservation: expected a SLURM reservation name"),
    ("scheduler.time_limits", {1: 3600}, r"scheduler\.time_limits\[\]: expected a time limit in quotes"),
    ("scheduler.time_limits", {7: "01:00:00"}, r"scheduler\.time_limits \(a key\): expected a chapter number"),
    ("has_nvidia_smi", "yes please", r"has_nvidia_smi: expected true or false"),
    ("gpu_monitor_interval_s", 0, r"gpu_monitor_interval_s: expected seconds between samples, 1 to 3600"),
    ("training.precision", "fp8", r"training\.precision: expected one of fp32, fp16, bf16"),
    ("training.max_steps", True, r"training\.max_steps: expected .*integer"),
    ("nemo.hub_ids", {"llama": "not a repo id"}, r"nemo\.hub_ids\[\]: expected a Hugging Face repository id"),
    ("nemo.hf_token_variable", "HF TOKEN", r"nemo\.hf_token_variable: expected an environment variable name"),
    ("nemo.image", '/images/nemo.sif"; touch /tmp/pwned; "', r"nemo\.image: expected a path"),
    ("python.torchrun", "torchrun\nrm -rf ~", r"python\.torchrun: expected text on one line"),
    ("bandwidth_check.tool", "mpi", r"bandwidth_check\.tool: expected torch or nccl-tests"),
    ("bandwidth_check.environment", {"NCCL IB": "1"}, r"environment \(a key\): expected an environment variable"),
    ("limits", ["max_gpus"], r"limits must be a mapping"),
])
def test_schema_errors_name_the_file_the_key_and_the_expected_type(tmp_path, key_path, value, expected):
    data = yaml.safe_load((PROFILES_DIR / "ibex.yml").read_text())
    *parents, last = key_path.split(".")
    target = data
    for parent in parents:
        target = target.setdefault(parent, {}) if target.get(parent) is not None else target.setdefault(parent, {})
    target[last] = value
    path = _write(tmp_path, data, "mysite.yml")
    with pytest.raises(ProfileError, match=expected) as raised:
        load_profile(path)
    assert str(raised.value).startswith(f"{path}: ")


def test_every_shipped_profile_passes_the_schema_and_keeps_its_types():
    for name in available_profiles():
        profile = load_profile(name)
        assert isinstance(profile.gpu_monitor_interval_s, int) and isinstance(profile.python.modules, tuple)
        assert all(isinstance(chapter, int) for chapter in profile.scheduler.time_limits)
    ibex = load_profile("ibex")
    assert ibex.offline and ibex.python.conda_root.startswith("/ibex/user/$USER/")
    assert "$HOME" not in ibex.python.conda_root and ibex.nemo.image_source == "docker://nvcr.io/nvidia/nemo:25.07"
    assert ibex.bandwidth_check.tool == "torch" and ibex.bandwidth_check.min_bus_bandwidth_gbps == 5.0
