"""The hash rule (workshop_lib.experiments.experiment): a field added to Experiment, at its default, changes no
existing content hash, so no finished run is taken for a new experiment; set to another value, it does."""

from __future__ import annotations

from dataclasses import MISSING, field, fields, make_dataclass, replace

import pytest

from workshop_lib.core.vocabulary import HF, RECIPES
from workshop_lib.experiments import (
    Experiment,
    all_experiments,
    engine_scaling_experiments,
    large_gpu_experiments,
    nemo_lesson_experiments,
    with_recipe,
)
from workshop_lib.experiments.experiment import FIELDS_OF_FIRST_RUNS, HASH_OMITS_AT_DEFAULT


def _every_experiment() -> list[Experiment]:
    rows = all_experiments() + large_gpu_experiments() + engine_scaling_experiments() + nemo_lesson_experiments()
    return [with_recipe(row, recipe) for row in rows for recipe in (RECIPES if row.engine == HF else (row.recipe,))]


# Throwaway fields as a later issue might add them: a number, an optional, a flag and a list (default_factory).
NEW_FIELDS = [("retries", int, field(default=0), 3), ("scheduler_hint", str | None, field(default=None), "fast"),
              ("profile_memory", bool, field(default=False), True),
              ("extra_env", list, field(default_factory=list), ["NCCL_DEBUG=INFO"])]


@pytest.mark.parametrize("name, kind, default, other", NEW_FIELDS, ids=[spec[0] for spec in NEW_FIELDS])
def test_a_new_field_at_its_default_keeps_every_hash_and_another_value_changes_it(name, kind, default, other):
    later = make_dataclass("LaterExperiment", [(name, kind, default)], bases=(Experiment,), frozen=True)
    rows = _every_experiment()
    assert len(rows) > 100
    for row in rows:
        same = later(**{item.name: getattr(row, item.name) for item in fields(row)})
        assert same.content_hash == row.content_hash, f"{row.id}: the new field {name} at its default moved the hash"
        assert replace(same, **{name: other}).content_hash != row.content_hash, f"{row.id}: {name}={other!r} ignored"


def test_the_fields_of_the_first_runs_are_always_hashed_and_the_later_ones_have_defaults():
    row = all_experiments()[0]
    assert set(HASH_OMITS_AT_DEFAULT) == {item.name for item in fields(Experiment)} - FIELDS_OF_FIRST_RUNS
    assert set(HASH_OMITS_AT_DEFAULT) >= {"recipe", "packed_sequence", "num_layers"}
    assert FIELDS_OF_FIRST_RUNS <= {item.name for item in fields(Experiment)}, "a field of the first runs was removed"
    later = [item for item in fields(Experiment) if item.name in HASH_OMITS_AT_DEFAULT]
    assert all(item.default is not MISSING or item.default_factory is not MISSING for item in later), \
        "a field added after the first runs needs a default, or every existing hash changes"
    assert replace(row, cpus_per_task=row.cpus_per_task + 1).content_hash != row.content_hash
    assert replace(row, packed_sequence=True).content_hash != row.content_hash
