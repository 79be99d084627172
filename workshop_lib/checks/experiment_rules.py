"""Rules on experiments: an Experiment (and the Profile that will realise it) checked before its script is rendered.

``validate_experiment`` returns every Finding; ``raise_for_experiment`` refuses an experiment with an error.
``EXPERIMENT_RULES`` lists the rules in the order they run: each is a function (experiment, profile or None)
-> findings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable

from workshop_lib.checks.findings import ERROR, Finding, ValidationError, errors_in
from workshop_lib.checks.fit import fit_findings
from workshop_lib.checks.layout import experiment_layout
from workshop_lib.checks.pitfalls import (
    MEGATRON_LAYOUT,
    findings,
    hybrid_shard_single_node,
    nemo_needs_a100,
    offload_with_zero0,
)
from workshop_lib.core.vocabulary import ENGINES, FSDP_STRATEGIES, NEMO

if TYPE_CHECKING:  # imported for annotations only: profiles imports experiments, not the other way
    from workshop_lib.experiments import Experiment
    from workshop_lib.sites.profiles import Profile


def validate_experiment(experiment: "Experiment", profile: "Profile | None" = None) -> list[Finding]:
    """Every rule an experiment breaks, on its own and as realised by ``profile``."""
    return [finding for rule in EXPERIMENT_RULES for finding in rule(experiment, profile)]


def _error(rule: str, message: str, fix: str) -> Finding:
    return Finding(rule, ERROR, message, fix)


def _engine_and_resources(experiment, profile):
    if experiment.engine not in ENGINES:
        yield _error("unknown-engine", f"engine={experiment.engine!r} is not one of {ENGINES}.", "use nemo, hf or gpt.")
    if experiment.nodes < 1 or experiment.gpus_per_node < 1:
        yield _error("no-resources", f"nodes={experiment.nodes}, gpus_per_node={experiment.gpus_per_node}.",
                     "ask for at least one node and one GPU per node.")


def _nemo_layout(experiment, profile):
    if experiment.engine != NEMO:
        return
    yield from findings(experiment_layout(experiment, profile), (*MEGATRON_LAYOUT, nemo_needs_a100))


def _sharding_and_offload(experiment, profile):
    if experiment.zero_stage is not None and experiment.zero_stage not in (0, 1, 2, 3):
        yield _error("unknown-zero-stage", f"zero_stage={experiment.zero_stage}.", "use a ZeRO stage 0, 1, 2 or 3.")
    layout = experiment_layout(experiment, profile)
    yield from findings(layout, [offload_with_zero0])
    if experiment.offload and experiment.zero_stage is None and experiment.fsdp is None:
        yield _error("offload-without-sharding", "offload is on but neither DeepSpeed ZeRO nor FSDP is used.",
                     "set zero_stage >= 1 or an FSDP strategy, or turn offload off.")
    if experiment.pin_memory and not experiment.offload:
        yield _error("pinned-without-offload", "pinned memory only applies to offloaded states.",
                     "turn offload on, or pin_memory off.")
    if experiment.fsdp is not None:
        if experiment.fsdp not in FSDP_STRATEGIES:
            yield _error("unknown-fsdp-strategy", f"fsdp={experiment.fsdp!r}.", f"use one of {FSDP_STRATEGIES}.")
        if experiment.zero_stage is not None:
            yield _error("fsdp-and-deepspeed", "FSDP and DeepSpeed both shard the model; the Trainer takes one.",
                         "choose either fsdp or zero_stage.")
        yield from findings(layout, [hybrid_shard_single_node])


def _dataset_and_profile(experiment, profile):
    if experiment.samples is not None and experiment.samples_per_gpu is not None:
        yield _error("two-dataset-sizes", "both samples (fixed) and samples_per_gpu (weak scaling) are set.",
                     "keep one of them.")
    if profile is not None:
        reason = profile.unsupported_reason(experiment)
        if reason:
            yield _error("outside-profile-grid", reason + ".", "pick a profile with larger limits (e.g. ibex).")
        yield from fit_findings(experiment, profile)  # the fit rule (predicted memory per GPU): checks.fit


ExperimentRule = Callable[["Experiment", "Profile | None"], Iterable[Finding]]
EXPERIMENT_RULES: list[ExperimentRule] = [_engine_and_resources, _nemo_layout, _sharding_and_offload,
                                          _dataset_and_profile]


def raise_for_experiment(experiment: "Experiment", profile: "Profile | None" = None) -> list[Finding]:
    """Raise ValidationError when the experiment breaks a rule; return the warnings otherwise."""
    findings = validate_experiment(experiment, profile)
    errors = errors_in(findings)
    if errors:
        raise ValidationError(f"experiment {experiment.id}", errors)
    return findings
