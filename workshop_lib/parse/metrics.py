"""`metrics.jsonl`, the one record format every training entry point writes (step, eval, summary)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields

from .text import is_number, split_lines, to_float


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

    @property
    def peak_memory_mib(self) -> float | None:
        """The largest per-rank peak: the number that decides whether a run fits."""
        return max(self.peak_memory_mib_per_rank) if self.peak_memory_mib_per_rank else None


@dataclass(frozen=True)
class MetricsLog:
    """A run's metrics. `skipped_lines` counts lines that were not a readable record."""

    steps: list[StepRecord] = field(default_factory=list)
    evals: list[EvalRecord] = field(default_factory=list)
    summary: RunSummary | None = None
    skipped_lines: int = 0


_SUMMARY_FIELDS = {item.name for item in fields(RunSummary)}
_INTEGER_SUMMARY_FIELDS = {"world_size", "nodes", "samples", "trainable_params", "total_params"}
_FLOAT_SUMMARY_FIELDS = {
    "train_runtime_s", "samples_per_s", "mean_step_time_s", "final_loss", "eval_loss", "eval_em", "eval_f1",
}


def _summary(record: dict) -> RunSummary:
    values = {key: value for key, value in record.items() if key in _SUMMARY_FIELDS}
    for key in _FLOAT_SUMMARY_FIELDS & values.keys():
        values[key] = to_float(values[key])
    for key in _INTEGER_SUMMARY_FIELDS & values.keys():
        number = to_float(values[key])
        values[key] = int(number) if number is not None else None
    values["local_params_per_rank"] = [int(v) for v in values.get("local_params_per_rank") or []]
    values["peak_memory_mib_per_rank"] = [float(v) for v in values.get("peak_memory_mib_per_rank") or []]
    for key in ("model_state_bytes_per_rank", "step_peak_bytes_per_rank"):
        values[key] = [_int_or_none(v) for v in values.get(key) or []]
    values["model_state_parts_per_rank"] = [v if isinstance(v, dict) else None
                                            for v in values.get("model_state_parts_per_rank") or []]
    if not isinstance(values.get("settings"), dict):
        values["settings"] = {}
    return RunSummary(**values)


def _int_or_none(value) -> int | None:
    number = to_float(value)
    return int(number) if is_number(number) else None


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
    try:
        if kind == "step":
            return StepRecord(
                step=int(value["step"]),
                loss=float(value["loss"]),
                lr=to_float(value.get("lr")),
                step_time_s=to_float(value.get("step_time_s")),
                samples_per_s=to_float(value.get("samples_per_s")),
                epoch=to_float(value.get("epoch")),
            )
        if kind == "eval":
            return EvalRecord(
                step=int(value["step"]),
                eval_loss=to_float(value.get("eval_loss")),
                eval_em=to_float(value.get("eval_em")),
                eval_f1=to_float(value.get("eval_f1")),
            )
        if kind == "summary":
            return _summary(value)
    except (KeyError, TypeError, ValueError):
        return None
    return None


def parse_metrics(text: str) -> MetricsLog:
    """Read a metrics.jsonl; unreadable lines are counted, never fatal. The last summary wins."""
    steps, evals, summary, skipped = [], [], None, 0
    for line in split_lines(text):
        if not line.strip():
            continue
        records = [_record(value) for value in _objects_in(line)]
        good = [record for record in records if record is not None]
        if not good or len(good) < len(records):
            skipped += 1
        for record in good:
            if isinstance(record, StepRecord):
                steps.append(record)
            elif isinstance(record, EvalRecord):
                evals.append(record)
            else:
                summary = record
    return MetricsLog(steps=steps, evals=evals, summary=summary, skipped_lines=skipped)
