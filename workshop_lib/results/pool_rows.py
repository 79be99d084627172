"""What one row of the class pool may hold: a run's measured values, checked field by field.

A published row is the experiment's id and content hash plus the RunResult fields a table reads. Everything that
describes the experiment (GPUs, layout, knobs) is never taken from the row: the reader takes it from its own
matrix, by id, so a row cannot move a run into another table or break a table's arithmetic. The rule for each
field comes from RunResult's own annotations, so a field added there is published and checked without a change
here. The publisher cleans its rows with the same rules the readers check (`publishable_row`), so an honest row
always passes.
"""

from __future__ import annotations

import math
import re
import typing
from dataclasses import fields

from workshop_lib.experiments import Experiment
from workshop_lib.jobs.states import COMPLETED
from workshop_lib.results.read import RunResult

# RunResult fields that stay home: the run's folder is a path of the publisher's machine, the unreadable lines
# are notes about files nobody else can open, and the id is the row's own `id`.
LEFT_OUT = ("experiment_id", "run_dir", "unreadable")
WORD = re.compile(r"[A-Za-z0-9_.:/+-]{1,100}")  # names, states, precisions, job ids: no markup, no spaces
LARGEST = 1e15  # no measurement of a workshop run comes near this; a larger one is made up
MAX_SETTINGS = 64
MAX_EPOCHS = 1000
# Engine settings the book turns into whole numbers (int(value)): a word there would stop a table.
NUMBER_SETTINGS = ("max_steps", "samples_per_gpu", "samples_total", "fsdp_shard_group", "per_device_batch",
                   "grad_accum", "epochs", "max_length", "zero_stage", "layers", "hidden", "heads", "ffn", "vocab",
                   "seq_len")


def _kind(annotation) -> str:
    text = str(annotation)
    for kind, spellings in (("number", ("float | None",)), ("count", ("int | None", "<class 'int'>")),
                            ("word", ("str | None", "<class 'str'>")), ("epochs", ("dict[int, float]",)),
                            ("settings", ("<class 'dict'>",))):
        if text in spellings:
            return kind
    raise TypeError(f"RunResult has a field of type {text}: say in pool_rows how the class pool checks it")


_HINTS = typing.get_type_hints(RunResult)
# field name -> kind (number, count, word, epochs, settings): every RunResult field a table may read
PUBLISHED = {item.name: _kind(_HINTS[item.name]) for item in fields(RunResult) if item.name not in LEFT_OUT}
ROW_KEYS = ("id", "hash", *PUBLISHED)


def _number_problem(value, whole: bool = False) -> str | None:
    """Why `value` is not a measurement: a finite number from 0 to LARGEST (whole: 49 or 49.0, not 49.5)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{_shown(value)} is not a {'whole number' if whole else 'number'}"
    if not math.isfinite(value):
        return f"{_shown(value)} is not a finite number"
    if not 0 <= value <= LARGEST:
        return f"{_shown(value)} is outside 0 to {LARGEST:g}"
    if whole and not float(value).is_integer():
        return f"{_shown(value)} is not a whole number"
    return None


def _word_problem(value) -> str | None:
    if not isinstance(value, str) or not WORD.fullmatch(value):
        return f"{_shown(value)} is not a plain name (letters, digits and _ . : / + - only, at most 100)"
    return None


def setting_problem(key, value) -> str | None:
    """Why one engine setting may not be pooled, or None: plain names, scalar values, numbers where the book
    reads a number."""
    if not isinstance(key, str) or not WORD.fullmatch(key):
        return f"setting name {_shown(key)} is not a plain name"
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, str) and key not in NUMBER_SETTINGS:
        return _word_problem(value)
    return _number_problem(value)


def value_problem(name: str, value) -> str | None:
    """Why `value` cannot be the field `name` of a pooled row, or None when it can."""
    kind = PUBLISHED[name]
    if value is None:
        return None if name != "state" else "state is missing"
    if kind == "number":
        return _number_problem(value)
    if kind == "count":
        return _number_problem(value, whole=True)
    if kind == "word":
        if name == "state" and value != COMPLETED:
            return f"state {_shown(value)}: only completed runs are pooled"
        return _word_problem(value)
    if not isinstance(value, dict):
        return f"{_shown(value)} is not a mapping"
    if kind == "epochs":
        if len(value) > MAX_EPOCHS:
            return f"{len(value)} epochs (at most {MAX_EPOCHS})"
        for epoch, loss in value.items():
            if not (isinstance(epoch, str) and epoch.isdigit() and len(epoch) <= 6):
                return f"epoch {_shown(epoch)} is not a whole number"
            if problem := _number_problem(loss):
                return f"epoch {epoch}: {problem}"
        return None
    if len(value) > MAX_SETTINGS:
        return f"{len(value)} settings (at most {MAX_SETTINGS})"
    return next((problem for key, item in value.items() if (problem := setting_problem(key, item))), None)


def row_problem(row, experiments: dict[str, Experiment]) -> str | None:
    """Why a published row is not one the class tables may show, or None. `experiments`: id -> experiment of
    the table's chapter on this profile; the row must name one of them and carry its content hash."""
    if not isinstance(row, dict):
        return f"a row is {type(row).__name__}, not a mapping"
    unknown = [key for key in row if key not in ROW_KEYS]
    if unknown:
        return f"a row has keys no run records: {', '.join(_shown(key) for key in unknown[:3])}"
    experiment_id = row.get("id")
    if not isinstance(experiment_id, str) or experiment_id not in experiments:
        return f"id {_shown(experiment_id)} is not an experiment of this chapter on this profile"
    if row.get("hash") != experiments[experiment_id].content_hash:
        return (f"{experiment_id}: hash {_shown(row.get('hash'))} is not this experiment's "
                f"({experiments[experiment_id].content_hash}): it ran another version of the chapter")
    for name in PUBLISHED:
        if problem := value_problem(name, row.get(name)):
            return f"{experiment_id}: {name}: {problem}"
    return None


def publishable_row(experiment: Experiment, result: RunResult) -> dict:
    """A completed run's row as it is published: values the pool's rules refuse (a NaN loss, a free-text
    setting) left out, as a missing value, so the row passes every reader's check."""
    row = {"id": experiment.id, "hash": experiment.content_hash}
    for name, kind in PUBLISHED.items():
        value = getattr(result, name)
        if kind == "epochs":
            value = {str(epoch): loss for epoch, loss in value.items() if not _number_problem(loss)}
        elif kind == "settings":
            value = {key: item for key, item in value.items() if not setting_problem(key, item)}
            value = dict(list(value.items())[:MAX_SETTINGS])
        row[name] = None if value_problem(name, value) else value
    return row


def result_of(row: dict) -> RunResult:
    """A checked row (`row_problem` said None) as the RunResult the tables read."""
    values = {name: row.get(name) for name in PUBLISHED if row.get(name) is not None}
    for name in values:
        if PUBLISHED[name] == "count":
            values[name] = int(values[name])  # 49.0 from a tool that widened the column
    if "eval_loss_by_epoch" in values:
        values["eval_loss_by_epoch"] = {int(epoch): loss for epoch, loss in values["eval_loss_by_epoch"].items()}
    return RunResult(experiment_id=row["id"], **values)


def _shown(value) -> str:
    """A value from someone else's file as a message may quote it: short, one line, printable (a page escapes it
    like all text)."""
    text = repr(value)
    text = re.sub(r"[^\x20-\x7e]", "?", text)
    return text if len(text) <= 40 else text[:37] + "..."
