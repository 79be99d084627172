"""The validator and the linter: each rule trips on a bad script and stays quiet on a good one."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from workshop_lib.cli import main
from workshop_lib.experiments import get_experiment
from workshop_lib.profiles import load_profile, profile_from_dict
from workshop_lib.validate import ValidationError, lint_file, lint_script, raise_for_experiment, validate_experiment

SAMPLES = Path(__file__).parent / "lint_samples"
RULES = sorted(path.name for path in SAMPLES.iterdir() if path.is_dir())
WARNING_RULES = {"fixed-rendezvous-port", "several-options-per-line"}


def test_every_rule_has_samples():
    assert len(RULES) >= 15
    for rule in RULES:
        assert (SAMPLES / rule / "bad.sbatch").is_file() and (SAMPLES / rule / "good.sbatch").is_file()


@pytest.mark.parametrize("rule", RULES)
def test_bad_sample_trips_its_rule(rule):
    findings = [finding for finding in lint_file(SAMPLES / rule / "bad.sbatch") if finding.rule == rule]
    assert findings, f"{rule} did not trip"
    finding = findings[0]
    assert finding.line and finding.message and finding.fix
    assert finding.severity == ("warning" if rule in WARNING_RULES else "error")


@pytest.mark.parametrize("rule", RULES)
def test_good_sample_is_clean(rule):
    assert lint_file(SAMPLES / rule / "good.sbatch") == []


def test_check_command_exit_status_follows_errors_not_warnings(capsys):
    assert main(["check", str(SAMPLES / "kill-unset-pid" / "bad.sbatch")]) == 1
    out = capsys.readouterr().out
    assert "bad.sbatch:" in out and "[kill-unset-pid]" in out and "Fix:" in out
    assert main(["check", str(SAMPLES / "fixed-rendezvous-port" / "bad.sbatch")]) == 0
    assert main(["check", *(str(SAMPLES / rule / "good.sbatch") for rule in RULES)]) == 0


def test_kill_in_the_shell_that_set_the_pid_is_fine_across_scopes():
    script = "\n".join([
        "#!/bin/bash", "#SBATCH --nodes=2", "sleep 100 &", "OUTER=$!",
        "srun bash -c 'sleep 5 & inner=$!; kill \"$OUTER\"; kill \"$inner\"'", "kill \"$OUTER\""])
    findings = lint_script(script)
    assert [(f.rule, f.line) for f in findings] == [("kill-unset-pid", 5)]


def _broken(experiment_id: str, **changes):
    return dataclasses.replace(get_experiment(experiment_id), **changes)


@pytest.mark.parametrize("rule, experiment", [
    ("parallel-sizes-mismatch", _broken("model-parallel/llama/tp4", tensor_parallel=3)),
    ("mixtral-without-ep", _broken("lora/mixtral/4-gpus", expert_parallel=None)),
    ("model-parallel-with-lora", _broken("model-parallel/llama/tp2", peft="lora")),
    ("offload-with-zero0", _broken("zero/single-gpu/zero0", offload=True)),
    ("offload-without-sharding", _broken("zero/baseline", offload=True)),
    ("pinned-without-offload", _broken("zero/single-gpu/zero2", pin_memory=True)),
    ("hybrid-shard-single-node", _broken("fsdp/single-gpu/full-shard", fsdp="HYBRID_SHARD")),
    ("fsdp-and-deepspeed", _broken("fsdp/multi-gpu/2-gpus", zero_stage=2)),
    ("sequence-parallel-without-tp", _broken("lora/mixtral/2-gpus", sequence_parallel=True)),
    ("two-dataset-sizes", _broken("zero/multi-gpu/2-gpus", samples=500)),
])
def test_experiment_rules(rule, experiment):
    assert rule in {finding.rule for finding in validate_experiment(experiment)}
    with pytest.raises(ValidationError, match=rule):
        raise_for_experiment(experiment)


def test_nemo_needs_an_a100_profile():
    data = {"name": "v100-site", "scheduler": {"constraint": "v100"}, "python": {}, "training": {},
            "nemo": {"enabled": True, "factories": {"llama-3.1-8b": "llama31_8b"}}}
    profile = profile_from_dict(data)
    rules = {finding.rule for finding in validate_experiment(get_experiment("lora/llama/1-gpu"), profile)}
    assert rules == {"nemo-needs-a100"}
    assert validate_experiment(get_experiment("lora/llama/1-gpu"), load_profile("ibex")) == []
