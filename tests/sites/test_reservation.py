"""The reservation: one name, from the profile or $WORKSHOP_RESERVATION, on every job the workshop renders."""

from __future__ import annotations

import dataclasses
import re
import subprocess

import pytest

from workshop_lib.checks.lint import lint_script
from workshop_lib.checks.sbatch import read_header
from workshop_lib.experiments import get_experiment
from workshop_lib.scripts import render_import_script, render_script, template_for
from workshop_lib.sites.profiles import load_profile
from workshop_lib.sites.reservation import RESERVATION_VARIABLE, ReservationError, describe_reservation, reservation_for

# One experiment per template, and the multi-node one with the bandwidth check in front of the training.
EXPERIMENTS = {
    "nemo_finetune.sbatch.j2": ("lora/llama/2-gpus", "ibex"),
    "torchrun_single_node.sbatch.j2": ("zero/single-gpu/zero3-offload", "ibex"),
    "torchrun_multi_node.sbatch.j2": ("fsdp/multi-node/2-nodes", "ibex"),
}


def every_template_rendered() -> dict[str, str]:
    scripts = {}
    for template, (experiment_id, profile) in EXPERIMENTS.items():
        experiment = get_experiment(experiment_id)
        assert template_for(experiment, load_profile(profile)) == template
        scripts[template] = render_script(experiment, profile)
    scripts["tiny:torchrun_multi_node.sbatch.j2"] = render_script(get_experiment("fsdp/multi-node/2-nodes"), "tiny")
    scripts["nemo_import.sbatch.j2"] = render_import_script("llama-3.1-8b", "ibex")
    return scripts


def reservations(text: str) -> list[str]:
    return re.findall(r"^#SBATCH --reservation=(\S+)$", text, flags=re.MULTILINE)


def test_every_template_carries_the_reservation_from_the_environment(monkeypatch):
    monkeypatch.setenv(RESERVATION_VARIABLE, "dist-ft_day.1")
    for template, text in every_template_rendered().items():
        assert reservations(text) == ["dist-ft_day.1"], template
        assert read_header(text).get("reservation") == "dist-ft_day.1", template  # sbatch reads it
        assert "set by $WORKSHOP_RESERVATION" in text
        assert [finding for finding in lint_script(text) if finding.is_error] == [], template
        subprocess.run(["bash", "-n"], input=text, text=True, check=True)


def test_no_reservation_line_when_none_is_set(monkeypatch):
    monkeypatch.delenv(RESERVATION_VARIABLE, raising=False)
    for template, text in every_template_rendered().items():
        assert "--reservation" not in text, template
    monkeypatch.setenv(RESERVATION_VARIABLE, "  ")  # an empty variable is as good as unset
    assert "--reservation" not in render_import_script("llama-3.1-8b", "ibex")


def test_the_variable_overrides_the_profile(monkeypatch):
    profile = load_profile("ibex")
    reserved = dataclasses.replace(profile, scheduler=dataclasses.replace(profile.scheduler, reservation="from-profile"))
    monkeypatch.delenv(RESERVATION_VARIABLE, raising=False)
    assert reservations(render_import_script("mixtral-8x7b", reserved)) == ["from-profile"]
    assert describe_reservation(reserved) == "jobs carry --reservation=from-profile (set by scheduler.reservation " \
                                             "of profile 'ibex')"
    monkeypatch.setenv(RESERVATION_VARIABLE, "from-variable")
    assert reservations(render_script(get_experiment("lora/llama/1-gpu"), reserved)) == ["from-variable"]
    assert "export WORKSHOP_RESERVATION=NAME" in describe_reservation(profile, environ={})


@pytest.mark.parametrize("value", ["day one", "day1;touch /tmp/x", "$(id)", "a,b", "ws\n#SBATCH --nodes=64", "résa"])
def test_a_bad_name_in_the_variable_is_refused_naming_the_variable_and_the_fix(monkeypatch, value):
    monkeypatch.setenv(RESERVATION_VARIABLE, value)
    message = r"\$WORKSHOP_RESERVATION is .* not a SLURM reservation name \(letters, digits, _ \. - only\).*" \
              r"`scontrol show reservation` lists .*export WORKSHOP_RESERVATION=NAME"
    with pytest.raises(ReservationError, match=message):
        render_script(get_experiment("lora/llama/2-gpus"), "ibex")
    with pytest.raises(ReservationError, match=message):
        render_import_script("llama-3.1-8b", "ibex")


def test_a_bad_name_in_a_profile_built_in_code_is_refused_naming_the_field(monkeypatch):
    monkeypatch.delenv(RESERVATION_VARIABLE, raising=False)
    profile = load_profile("tiny")
    bad = dataclasses.replace(profile, scheduler=dataclasses.replace(profile.scheduler, reservation="day one"))
    with pytest.raises(ReservationError, match=r"scheduler\.reservation of profile 'tiny' is 'day one'.*"
                                               r"set scheduler\.reservation in the profile"):
        reservation_for(bad)
