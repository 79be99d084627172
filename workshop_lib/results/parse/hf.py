"""Hugging Face Trainer output: the metric dicts it prints ({'loss': …}, {'eval_loss': …},
{'train_runtime': …}) and the `trainer_state.json` it saves.

Printed dicts are often damaged: a tqdm bar or another rank's output cuts a record in the middle.
The values printed whole before the cut are kept (a careful reader reads them too); the line is
reported as a problem. Transformers 5 prints values as strings ('10.95'): they are read as numbers."""

from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass, field

from workshop_lib.core.log_text import LogProblem, SkippedLines, log_lines, to_float

# A flat dict literal: HF prints one per log call; two ranks may put two on a line.
_DICT = re.compile(r"\{[^{}]*\}")
# Where a record starts, and one `'key': value` pair of it followed by the `,` or `}` that shows
# the value was printed whole.
_RECORD_START = re.compile(r"\{['\"]")
LOG_KEYWORDS = ("{'", '{"')  # every line parse_trainer_output reads holds one
_PAIR = re.compile(r"""['"](?P<key>[A-Za-z_][\w.-]*)['"]\s*:\s*(?P<value>'[^']*'|"[^"]*"|[^,{}'"\s]+)\s*(?=[,}])""")
# `eval_loss`, or `eval_<set>_loss` when the Trainer evaluated several sets (metric_key_prefix).
_EVAL_LOSS = re.compile(r"^eval_(?:(?P<dataset>\w+?)_)?loss$")


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
    dataset: str = ""  # the set's name when several were evaluated (`eval_<dataset>_loss`)
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
class TrainerLog(SkippedLines):
    """What the Trainer reported. `skipped_lines` counts lines that held a dict-like record that
    could not be read (cut off, mixed with another process's output)."""

    train: list[TrainLogEntry] = field(default_factory=list)
    evals: list[EvalEntry] = field(default_factory=list)
    summary: TrainSummary | None = None
    problems: list[LogProblem] = field(default_factory=list)

    @property
    def final_eval(self) -> EvalEntry | None:
        """The last evaluation of the main set (the one logged as plain `eval_loss` if there is one)."""
        main = [entry for entry in self.evals if not entry.dataset] or self.evals
        return main[-1] if main else None

    @property
    def datasets(self) -> list[str]:
        """The evaluation sets, in the order they first appear ("" is the unnamed one)."""
        return list(dict.fromkeys(entry.dataset for entry in self.evals))

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
    losses = [match for key in numbers if (match := _EVAL_LOSS.match(key))]
    if losses:
        loss_key = losses[0].group(0)
        prefix = loss_key[: -len("loss")]  # "eval_" or "eval_<dataset>_"
        known = {loss_key, "epoch", "step", prefix + "runtime", prefix + "samples_per_second"}
        return EvalEntry(
            eval_loss=numbers[loss_key],
            epoch=numbers.get("epoch"),
            step=_step(numbers),
            dataset=losses[0]["dataset"] or "",
            eval_runtime=numbers.get(prefix + "runtime"),
            eval_samples_per_second=numbers.get(prefix + "samples_per_second"),
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


def _collect(records: list[dict], problems: list[LogProblem]) -> TrainerLog:
    train, evals, summary = [], [], None
    for record in records:
        entry = classify_record(record)
        if isinstance(entry, TrainSummary):
            summary = entry
        elif isinstance(entry, EvalEntry):
            evals.append(entry)
        elif isinstance(entry, TrainLogEntry):
            train.append(entry)
    return TrainerLog(train=train, evals=evals, summary=summary, problems=problems)


def _whole_pairs(fragment: str) -> dict:
    """The pairs of a cut record whose values were printed whole (followed by `,` or `}`)."""
    record = {}
    for match in _PAIR.finditer(fragment):
        value = match["value"]
        record[match["key"]] = value[1:-1] if value[0] in "'\"" else value
    return record


def _records_in(line: str) -> tuple[list[dict], bool]:
    """The records printed on one line, and whether one of them was cut or garbled."""
    records, damaged = [], False
    starts = [match.start() for match in _RECORD_START.finditer(line)]
    for start, end in zip(starts, starts[1:] + [len(line)]):
        piece = line[start:end]
        whole = _DICT.match(piece)
        if whole:
            try:
                value = ast.literal_eval(whole.group(0))
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                value = None
            if isinstance(value, dict):
                records.append(value)
                continue
        damaged = True
        salvaged = _whole_pairs(piece.split("}")[0])
        if salvaged:
            records.append(salvaged)
    return records, damaged


def parse_trainer_output(text: str) -> TrainerLog:
    """The metric dicts a Trainer printed into a job's stdout."""
    records: list[dict] = []
    problems: list[LogProblem] = []
    for number, line in log_lines(text):
        if "{'" not in line and '{"' not in line:
            continue
        found, damaged = _records_in(line)
        if damaged:
            problems.append(LogProblem(number, line.strip(), "a Trainer record cut by other output "
                                       "(the values printed before the cut were kept)" if found
                                       else "a Trainer record that is not a readable dict"))
        records.extend(found)
    return _collect(records, problems)


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
        log=_collect(history, problems=[]),
    )
