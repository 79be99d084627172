"""The `metrics.jsonl` schema: the one statement of the records every training entry point writes
(workshop_lib.train.metrics) and the results side reads (workshop_lib.results.parse.metrics).

Records, one JSON object per line:

* ``step``    — step, loss, lr, step_time_s, samples_per_s, epoch
* ``eval``    — step, eval_loss, eval_em, eval_f1 (EM/F1 may be null)
* ``summary`` — one at the end: engine and its settings, world size, throughput, losses,
  parameter counts and every rank's local parameter count and peak memory, and per rank what
  the tensor census measured on the second optimizer step: the model-state bytes (total and by
  part) and the step's peak of live tensor bytes (null where the run was shorter than two steps).

The writer checks every record strictly (:func:`validate_record`); the reader is lenient (older
runs lack newer fields) but takes each field's type from here. Pure Python: both sides import it.
"""

from __future__ import annotations

import math

ENGINES = ("hf", "deepspeed", "fsdp", "lora", "parallel", "gpt")
MEMORY_KINDS = ("cuda_max_allocated", "cpu_max_rss")
DEVICES = ("cpu", "cuda")

NUMBER = (int, float)
OPTIONAL_NUMBER = (int, float, type(None))
STEP_FIELDS = {"kind": str, "step": int, "loss": NUMBER, "lr": NUMBER, "step_time_s": NUMBER,
               "samples_per_s": NUMBER, "epoch": NUMBER}
EVAL_FIELDS = {"kind": str, "step": int, "eval_loss": NUMBER, "eval_em": OPTIONAL_NUMBER,
               "eval_f1": OPTIONAL_NUMBER}
SUMMARY_FIELDS = {"kind": str, "engine": str, "settings": dict, "model": str, "world_size": int,
                  "nodes": int, "precision": str, "device": str, "samples": int,
                  "train_runtime_s": NUMBER, "samples_per_s": NUMBER, "mean_step_time_s": NUMBER,
                  "final_loss": NUMBER, "eval_loss": OPTIONAL_NUMBER, "eval_em": OPTIONAL_NUMBER,
                  "eval_f1": OPTIONAL_NUMBER, "trainable_params": int, "total_params": int,
                  "local_params_per_rank": list, "peak_memory_mib_per_rank": list,
                  "peak_memory_kind": str, "model_state_bytes_per_rank": list,
                  "model_state_parts_per_rank": list, "step_peak_bytes_per_rank": list,
                  "training_peak_bytes_per_rank": list}
FIELDS_BY_KIND = {"step": STEP_FIELDS, "eval": EVAL_FIELDS, "summary": SUMMARY_FIELDS}
# The per-rank lists of a summary (one entry per rank) and the type of their entries.
PER_RANK_ENTRIES = {"local_params_per_rank": (int,), "peak_memory_mib_per_rank": NUMBER,
                    "model_state_bytes_per_rank": (int, type(None)),
                    "model_state_parts_per_rank": (dict, type(None)),
                    "step_peak_bytes_per_rank": (int, type(None)),
                    "training_peak_bytes_per_rank": (int, type(None))}
# Values a summary field must take from a fixed set.
CHOICES = {"engine": ENGINES, "peak_memory_kind": MEMORY_KINDS, "device": DEVICES}


class SchemaError(ValueError):
    """A metrics record does not follow the schema (a bug in the writer, not a user error)."""


def _is(value: object, types: tuple | type) -> bool:
    return not isinstance(value, bool) and isinstance(value, types)


def validate_record(record: dict) -> None:
    """Raise :class:`SchemaError` unless ``record`` has exactly the fields and types of its kind."""
    fields = FIELDS_BY_KIND.get(record.get("kind"))
    if fields is None:
        raise SchemaError(f"unknown record kind {record.get('kind')!r}")
    missing = set(fields) - set(record)
    extra = set(record) - set(fields)
    if missing or extra:
        raise SchemaError(f"{record['kind']} record: missing {sorted(missing)}, unexpected {sorted(extra)}")
    for name, types in fields.items():
        value = record[name]
        if not _is(value, types):
            raise SchemaError(f"{record['kind']}.{name} = {value!r} is not {types}")
        if isinstance(value, float) and not math.isfinite(value):
            raise SchemaError(f"{record['kind']}.{name} is {value}")
    if record["kind"] != "summary":
        return
    for name, choices in CHOICES.items():
        if record[name] not in choices:
            raise SchemaError(f"summary.{name} {record[name]!r} not in {choices}")
    for name, types in PER_RANK_ENTRIES.items():
        if len(record[name]) != record["world_size"]:
            raise SchemaError(f"summary.{name} has {len(record[name])} entries for world size {record['world_size']}")
        if not all(_is(value, types) for value in record[name]):
            raise SchemaError(f"summary.{name} = {record[name]!r}: entries must be {types}")
