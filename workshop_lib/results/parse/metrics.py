"""`metrics.jsonl`, the one record format every training entry point writes (step, eval, summary).

The records' fields and types come from :mod:`workshop_lib.core.metrics_schema`, the schema the writer
checks against; the dataclasses below hold one attribute per schema field (a test keeps them equal).
The reader is lenient where the writer is strict: a field an older run did not write reads as None."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from workshop_lib.core.log_text import LogProblem, SkippedLines, is_number, log_lines, to_float
from workshop_lib.core.metrics_schema import EVAL_FIELDS, PER_RANK_ENTRIES, STEP_FIELDS, SUMMARY_FIELDS


@dataclass(frozen=True)
class StepRecord:
    step: int
    loss: float
    lr: float | None = None
    step_time_s: float | None = None
    samples_per_s: float | None = None
    epoch: float | None = None


@dataclass(frozen=True)
class EvalRecord:
    step: int
    eval_loss: float | None = None
    eval_em: float | None = None
    eval_f1: float | None = None


@dataclass(frozen=True)
class RunSummary:
    """The final `{"kind": "summary", …}` record. Missing keys read as None (or empty)."""

    engine: str | None = None
    settings: dict = field(default_factory=dict)
    model: str | None = None
    world_size: int | None = None
    nodes: int | None = None
    precision: str | None = None
    device: str | None = None
    samples: int | None = None
    train_runtime_s: float | None = None
    samples_per_s: float | None = None
    mean_step_time_s: float | None = None
    final_loss: float | None = None
    eval_loss: float | None = None
    eval_em: float | None = None
    eval_f1: float | None = None
    trainable_params: int | None = None
    total_params: int | None = None
    local_params_per_rank: list[int] = field(default_factory=list)
    peak_memory_mib_per_rank: list[float] = field(default_factory=list)
    peak_memory_kind: str | None = None
    # What workshop_lib.train.tensor_census measured on the second optimizer step (None: not recorded)
    model_state_bytes_per_rank: list[int | None] = field(default_factory=list)
    model_state_parts_per_rank: list[dict | None] = field(default_factory=list)
    step_peak_bytes_per_rank: list[int | None] = field(default_factory=list)
    # GPU runs: the allocator's peak over the training steps only (evaluation and generation left out)
    training_peak_bytes_per_rank: list[int | None] = field(default_factory=list)

    @property
    def peak_memory_mib(self) -> float | None:
        """The largest per-rank peak of the whole process (evaluation and generation included)."""
        return max(self.peak_memory_mib_per_rank) if self.peak_memory_mib_per_rank else None

    @property
    def training_peak_mib_per_rank(self) -> list[float] | None:
        """Each rank's peak over the training steps (MiB), where every rank recorded one (GPU runs of this
        version); None for CPU runs and for runs from before it was recorded."""
        peaks = self.training_peak_bytes_per_rank
        if not peaks or any(peak is None for peak in peaks):
            return None
        return [peak / 2**20 for peak in peaks]


@dataclass(frozen=True)
class MetricsLog(SkippedLines):
    """A run's metrics. `problems` lists the lines that were not (or not only) readable records."""

    steps: list[StepRecord] = field(default_factory=list)
    evals: list[EvalRecord] = field(default_factory=list)
    summary: RunSummary | None = None
    problems: list[LogProblem] = field(default_factory=list)


def _value(types: tuple | type, value: object) -> object:
    """A value read as the schema's type says: numbers from numbers or numeric strings, None otherwise."""
    types = types if isinstance(types, tuple) else (types,)
    if float in types:
        return to_float(value)
    if int in types:
        number = to_float(value)
        return int(number) if is_number(number) else None
    if dict in types:
        return value if isinstance(value, dict) else None
    if str in types:
        return value if isinstance(value, str) else None
    return value


def _fields(record: dict, schema: dict) -> dict:
    """The record's values for the schema's fields it has (except `kind`), each read as its type."""
    values = {}
    for name, types in schema.items():
        if name == "kind" or name not in record:
            continue
        if name in PER_RANK_ENTRIES:
            entries = record[name] if isinstance(record[name], list) else []
            values[name] = [_value(PER_RANK_ENTRIES[name], entry) for entry in entries]
        else:
            values[name] = _value(types, record[name])
    return values


def _summary(record: dict) -> RunSummary:
    values = _fields(record, SUMMARY_FIELDS)
    if not isinstance(values.get("settings"), dict):
        values["settings"] = {}
    for name, types in PER_RANK_ENTRIES.items():
        if type(None) not in types:  # a list of plain numbers: an unreadable entry is left out
            values[name] = [entry for entry in values.get(name, []) if entry is not None]
    return RunSummary(**values)


def _objects_in(line: str) -> list[object]:
    """Every JSON value that starts at a `{` in the line (two writers may have shared it)."""
    decoder = json.JSONDecoder()
    found, position = [], line.find("{")
    while position != -1:
        try:
            value, end = decoder.raw_decode(line, position)
        except json.JSONDecodeError:
            position = line.find("{", position + 1)
            continue
        found.append(value)
        position = line.find("{", end)
    return found


def _record(value: object) -> StepRecord | EvalRecord | RunSummary | None:
    if not isinstance(value, dict):
        return None
    kind = value.get("kind")
    if kind == "summary":
        return _summary(value)
    schema, record_type = {"step": (STEP_FIELDS, StepRecord), "eval": (EVAL_FIELDS, EvalRecord)}.get(kind, (None, None))
    if schema is None:
        return None
    values = _fields(value, schema)
    required = ("step", "loss") if kind == "step" else ("step",)
    if any(values.get(name) is None for name in required):
        return None
    return record_type(**values)


def _why_not_a_record(value: object) -> str:
    """Why `_record` read nothing from a JSON value."""
    if not isinstance(value, dict):
        return "a JSON value that is not a record"
    kind = value.get("kind")
    if kind not in ("step", "eval", "summary"):
        return f"a record of unknown kind {kind!r} (expected step, eval or summary)"
    return f"a {kind} record without a readable {'step or loss' if kind == 'step' else 'step'}"


def parse_metrics(text: str) -> MetricsLog:
    """Read a metrics.jsonl; unreadable lines are reported with the reason, never fatal. The last summary wins."""
    steps, evals, summary, problems = [], [], None, []
    for number, line in log_lines(text):
        if not line.strip():
            continue
        values = _objects_in(line)
        records = [_record(value) for value in values]
        good = [record for record in records if record is not None]
        if not values:
            problems.append(LogProblem(number, line.strip(), "no JSON record on this line (cut or not JSON)"))
        elif len(good) < len(records):
            bad = next(value for value, record in zip(values, records) if record is None)
            problems.append(LogProblem(number, line.strip(), _why_not_a_record(bad)))
        for record in good:
            if isinstance(record, StepRecord):
                steps.append(record)
            elif isinstance(record, EvalRecord):
                evals.append(record)
            else:
                summary = record
    return MetricsLog(steps=steps, evals=evals, summary=summary, problems=problems)
