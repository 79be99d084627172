"""NeMo / Lightning job logs: the per-step training lines, the "resolved arguments" table,
and the model summaries Lightning prints before and after LoRA is applied."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .text import split_lines

STEP_MARKER = "Training epoch"
_STEP_HEAD = re.compile(r"Training epoch (?P<epoch>\d+), iteration (?P<iteration>\d+)/(?P<last_iteration>\d+)\s*$")
_FIELD = re.compile(r"^\s*(?P<key>[A-Za-z_][A-Za-z_ ]*?)\s*:\s*(?P<value>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf)\s*$")
# The names in the line, mapped to the attribute names of NemoStep.
_STEP_FIELDS = {
    "lr": "lr",
    "global_batch_size": "global_batch_size",
    "global_step": "global_step",
    "reduced_train_loss": "reduced_train_loss",
    "train_step_timing in s": "train_step_timing_s",
    "consumed_samples": "consumed_samples",
    "val_loss": "val_loss",
}
_REQUIRED = ("global_step", "reduced_train_loss", "train_step_timing_s")
_INTEGER_FIELDS = {"global_batch_size", "global_step", "consumed_samples"}


@dataclass(frozen=True)
class NemoStep:
    """One `Training epoch E, iteration i/N | …` line."""

    epoch: int
    iteration: int
    last_iteration: int  # N in "i/N": the index of the last iteration (249 for 250 steps)
    global_step: int
    reduced_train_loss: float
    train_step_timing_s: float
    lr: float | None = None
    global_batch_size: int | None = None
    consumed_samples: int | None = None  # NeMo leaves it out of the very first line
    val_loss: float | None = None  # only on lines right after a validation


@dataclass(frozen=True)
class ParameterSummary:
    """The totals Lightning prints under its model summary table."""

    trainable_params: int | None = None
    non_trainable_params: int | None = None
    total_params: int | None = None
    estimated_size_mb: float | None = None
    modules_in_train_mode: int | None = None
    modules_in_eval_mode: int | None = None

    @property
    def trainable_fraction(self) -> float | None:
        if self.trainable_params is None or not self.total_params:
            return None
        return self.trainable_params / self.total_params


@dataclass(frozen=True)
class NemoLog:
    """Everything read from one NeMo log. `skipped_lines` counts lines that looked like step lines
    or summary totals but could not be read (cut, garbled, or mixed with another rank's output)."""

    steps: list[NemoStep] = field(default_factory=list)
    resolved_arguments: dict[str, str] = field(default_factory=dict)
    parameter_summaries: list[ParameterSummary] = field(default_factory=list)
    skipped_lines: int = 0

    @property
    def last_step(self) -> NemoStep | None:
        return self.steps[-1] if self.steps else None

    @property
    def before_lora(self) -> ParameterSummary | None:
        """The first summary: the model as loaded (every weight trainable)."""
        return self.parameter_summaries[0] if self.parameter_summaries else None

    @property
    def after_lora(self) -> ParameterSummary | None:
        """The summary printed after the model transform, when there are two or more."""
        return self.parameter_summaries[-1] if len(self.parameter_summaries) > 1 else None


def parse_step(segment: str) -> NemoStep | None:
    """One step line (or a piece of a line starting at `Training epoch`); None if it is incomplete."""
    parts = segment.split("|")
    head = _STEP_HEAD.search(parts[0])
    if head is None:
        return None
    values: dict[str, float | int] = {}
    for part in parts[1:]:
        match = _FIELD.match(part)
        if match is None:
            continue  # a field cut by another rank's output; the required check decides
        name = _STEP_FIELDS.get(match["key"].strip())
        if name is None:
            continue
        number = float(match["value"])
        values[name] = int(number) if name in _INTEGER_FIELDS else number
    if any(name not in values for name in _REQUIRED):
        return None
    return NemoStep(
        epoch=int(head["epoch"]),
        iteration=int(head["iteration"]),
        last_iteration=int(head["last_iteration"]),
        **values,
    )


def _step_segments(line: str) -> list[str]:
    """The pieces of a line that each start at a step marker (several ranks may share a line)."""
    starts = [match.start() for match in re.finditer(STEP_MARKER, line)]
    ends = starts[1:] + [len(line)]
    segments = []
    for start, end in zip(starts, ends):
        segment = line[start:end]
        # Cut where a NeMo log prefix or a fresh bracketed message from another process begins.
        segment = re.split(r"\[(?:NeMo [IWE]|rank: ?\d+|Gloo|default\d*)", segment)[0]
        segments.append(segment)
    return segments


_SUMMARY_LINE = re.compile(
    r"^\s*(?P<number>[\d][\d,]*(?:\.\d+)?)\s*(?P<unit>[KMBT])?\s*"
    r"(?P<label>Trainable params|Non-trainable params|Total params|"
    r"Total estimated model params size \(MB\)|Modules in train mode|Modules in eval mode)\s*$"
)
_SUMMARY_KEYS = {
    "Trainable params": "trainable_params",
    "Non-trainable params": "non_trainable_params",
    "Total params": "total_params",
    "Total estimated model params size (MB)": "estimated_size_mb",
    "Modules in train mode": "modules_in_train_mode",
    "Modules in eval mode": "modules_in_eval_mode",
}
_UNIT_FACTOR = {None: 1, "K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}
_SUMMARY_HINT = re.compile(r"(Trainable params|Total params|Modules in (train|eval) mode|params size \(MB\))")


def _summary_value(match: re.Match) -> tuple[str, float | int]:
    key = _SUMMARY_KEYS[match["label"]]
    number = float(match["number"].replace(",", ""))
    if key == "estimated_size_mb":
        return key, number
    # Lightning rounds counts to 3 significant digits ("24.2 B"): the integer is that rounding.
    return key, int(round(number * _UNIT_FACTOR[match["unit"]]))


_TABLE_BORDERS = "│|┃"
_TABLE_RULE_CHARS = set("━─┏┓┗┛┡┩┢┪╇┳┻╋┼├┤└┘┌┐═╞╡╪ ")


def parse_resolved_arguments(lines: list[str]) -> dict[str, str]:
    """The "Argument Name │ Resolved Value" table NeMo prints first; wrapped values are joined."""
    arguments: dict[str, str] = {}
    inside = False
    last_name: str | None = None
    for line in lines:
        if not inside:
            inside = "Argument Name" in line and "Resolved Value" in line
            continue
        stripped = line.strip()
        if not stripped or set(stripped) <= _TABLE_RULE_CHARS:
            if stripped.startswith(("└", "┗")) or (not stripped and arguments):
                break  # the bottom border, or the blank line after the table
            continue
        if stripped[0] not in _TABLE_BORDERS:
            break
        cells = [cell.strip() for cell in re.split(f"[{_TABLE_BORDERS}]", stripped)[1:-1]]
        if len(cells) < 2:
            continue
        name, value = cells[0], " ".join(cell for cell in cells[1:] if cell)
        if name:
            arguments[name] = value
            last_name = name
        elif last_name is not None and value:
            arguments[last_name] = f"{arguments[last_name]} {value}"
    return arguments


def parse_nemo_log(text: str) -> NemoLog:
    """Read the step lines, resolved arguments and parameter summaries of a NeMo job log."""
    lines = split_lines(text)
    steps_by_key: dict[tuple[int, int], NemoStep] = {}
    summaries: list[dict[str, float | int]] = []
    skipped = 0
    for line in lines:
        if STEP_MARKER in line:
            parsed = [parse_step(segment) for segment in _step_segments(line)]
            good = [step for step in parsed if step is not None]
            skipped += len(parsed) - len(good)
            for step in good:
                # Several ranks may print the same step: the first complete copy wins.
                steps_by_key.setdefault((step.epoch, step.global_step), step)
            continue
        match = _SUMMARY_LINE.match(line)
        if match is not None:
            key, value = _summary_value(match)
            if key == "trainable_params" or not summaries or key in summaries[-1]:
                summaries.append({})
            summaries[-1][key] = value
        elif _SUMMARY_HINT.search(line):
            skipped += 1
    steps = sorted(steps_by_key.values(), key=lambda step: (step.epoch, step.global_step))
    return NemoLog(
        steps=steps,
        resolved_arguments=parse_resolved_arguments(lines),
        parameter_summaries=[ParameterSummary(**values) for values in summaries],
        skipped_lines=skipped,
    )
