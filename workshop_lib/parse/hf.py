"""Hugging Face Trainer output: the metric dicts it prints ({'loss': …}, {'eval_loss': …},
{'train_runtime': …}) and the `trainer_state.json` it saves."""

from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass, field

from .text import split_lines, to_float

# A flat dict literal: HF prints one per log call; two ranks may put two on a line.
_DICT = re.compile(r"\{[^{}]*\}")


@dataclass(frozen=True)
class TrainLogEntry:
    """A `{'loss': …}` record, printed every `logging_steps`."""

    loss: float
    epoch: float | None = None
    step: int | None = None  # only trainer_state.json knows the step
    learning_rate: float | None = None
    grad_norm: float | None = None


@dataclass(frozen=True)
class EvalEntry:
    """A `{'eval_loss': …}` record, printed after each evaluation."""

    eval_loss: float
    epoch: float | None = None
    step: int | None = None
    eval_runtime: float | None = None
    eval_samples_per_second: float | None = None
    extra: dict[str, float] = field(default_factory=dict)  # eval_em, eval_f1, … when computed


@dataclass(frozen=True)
class TrainSummary:
    """The `{'train_runtime': …}` record printed once at the end of training."""

    train_runtime: float
    train_samples_per_second: float | None = None
    train_steps_per_second: float | None = None
    train_loss: float | None = None
    epoch: float | None = None


@dataclass(frozen=True)
class TrainerLog:
    """What the Trainer reported. `skipped_lines` counts lines that held a dict-like record that
    could not be read (cut off, mixed with another process's output)."""

    train: list[TrainLogEntry] = field(default_factory=list)
    evals: list[EvalEntry] = field(default_factory=list)
    summary: TrainSummary | None = None
    skipped_lines: int = 0

    @property
    def final_eval(self) -> EvalEntry | None:
        return self.evals[-1] if self.evals else None

    def eval_at_epoch(self, epoch: float, tolerance: float = 0.05) -> EvalEntry | None:
        """The evaluation logged at (about) the given epoch, e.g. 1.0 or 2.0."""
        for entry in self.evals:
            if entry.epoch is not None and abs(entry.epoch - epoch) <= tolerance:
                return entry
        return None


@dataclass(frozen=True)
class TrainerState:
    """The parts of `trainer_state.json` the tables use."""

    global_step: int
    max_steps: int | None
    num_train_epochs: float | None
    epoch: float | None
    train_batch_size: int | None
    log: TrainerLog

    @property
    def steps_per_epoch(self) -> int | None:
        """Optimizer steps per epoch (the total of the training progress bar divided by epochs)."""
        if not self.max_steps or not self.num_train_epochs:
            return None
        return math.ceil(self.max_steps / self.num_train_epochs)


def _numbers(record: dict) -> dict[str, float]:
    """The numeric values of a record; recent Trainers print floats as strings ('1.234')."""
    numbers = {}
    for key, value in record.items():
        number = to_float(value)
        if number is not None:
            numbers[str(key)] = number
    return numbers


def _step(numbers: dict[str, float]) -> int | None:
    return int(numbers["step"]) if "step" in numbers else None


def classify_record(record: dict) -> TrainLogEntry | EvalEntry | TrainSummary | None:
    """Turn one logged dict into the entry it is, or None for records the tables do not use."""
    numbers = _numbers(record)
    if "train_runtime" in numbers:
        return TrainSummary(
            train_runtime=numbers["train_runtime"],
            train_samples_per_second=numbers.get("train_samples_per_second"),
            train_steps_per_second=numbers.get("train_steps_per_second"),
            train_loss=numbers.get("train_loss"),
            epoch=numbers.get("epoch"),
        )
    if "eval_loss" in numbers:
        known = {"eval_loss", "epoch", "step", "eval_runtime", "eval_samples_per_second"}
        return EvalEntry(
            eval_loss=numbers["eval_loss"],
            epoch=numbers.get("epoch"),
            step=_step(numbers),
            eval_runtime=numbers.get("eval_runtime"),
            eval_samples_per_second=numbers.get("eval_samples_per_second"),
            extra={key: value for key, value in numbers.items() if key not in known},
        )
    if "loss" in numbers:
        return TrainLogEntry(
            loss=numbers["loss"],
            epoch=numbers.get("epoch"),
            step=_step(numbers),
            learning_rate=numbers.get("learning_rate"),
            grad_norm=numbers.get("grad_norm"),
        )
    return None


def _collect(records: list[dict], skipped: int) -> TrainerLog:
    train, evals, summary = [], [], None
    for record in records:
        entry = classify_record(record)
        if isinstance(entry, TrainSummary):
            summary = entry
        elif isinstance(entry, EvalEntry):
            evals.append(entry)
        elif isinstance(entry, TrainLogEntry):
            train.append(entry)
    return TrainerLog(train=train, evals=evals, summary=summary, skipped_lines=skipped)


def parse_trainer_output(text: str) -> TrainerLog:
    """The metric dicts a Trainer printed into a job's stdout."""
    records: list[dict] = []
    skipped = 0
    for line in split_lines(text):
        if "{'" not in line and '{"' not in line:
            continue
        found = _DICT.findall(line)
        readable = []
        for literal in found:
            try:
                value = ast.literal_eval(literal)
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                continue
            if isinstance(value, dict):
                readable.append(value)
        # A line whose record is cut (no closing brace) or garbled is one we could not read.
        if not readable or line.count("{'") + line.count('{"') > len(readable):
            skipped += 1
        records.extend(readable)
    return _collect(records, skipped)


def parse_trainer_state(text: str) -> TrainerState:
    """`trainer_state.json` as saved by `trainer.save_state()`; raises ValueError if it is not JSON."""
    state = json.loads(text)
    if not isinstance(state, dict):
        raise ValueError("trainer_state.json does not hold a JSON object")
    history = [record for record in state.get("log_history", []) if isinstance(record, dict)]
    return TrainerState(
        global_step=int(state.get("global_step", 0)),
        max_steps=state.get("max_steps"),
        num_train_epochs=to_float(state.get("num_train_epochs")),
        epoch=to_float(state.get("epoch")),
        train_batch_size=state.get("train_batch_size"),
        log=_collect(history, skipped=0),
    )
