"""NeMo / Lightning job logs: the per-step training lines, the "Resolved Arguments" table (printed
at start-up and by `nemo llm finetune --dryrun`), and the model summaries Lightning prints before
and after LoRA is applied. Launcher prefixes (`finetune/0 [default0]:`, `srun -l`'s `0: `) are
seen through on every kind of line."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from workshop_lib.core.log_text import LogProblem, SkippedLines, log_lines

STEP_MARKER = "Training epoch"
# Printed by workshop_lib.train.nemo_finetune where NeMo runs without the container (the lent GPU machine):
# the real, unpadded tokens of one optimizer step, so that packed and unpacked runs compare in tokens/s.
_TOKENS_PER_STEP = re.compile(r"== nemo-local: real tokens per optimizer step: (?P<tokens>\d+(?:\.\d+)?)\b")
# Every line parse_nemo_log reads holds one of these (a huge log is streamed, keeping those lines):
# step lines, and the model summary's totals. The resolved-arguments table comes first in the log.
LOG_KEYWORDS = (STEP_MARKER, "params", "Modules in", "== nemo-local: real tokens")
_STEP_HEAD = re.compile(r"Training epoch (?P<epoch>\d+), iteration (?P<iteration>\d+)/(?P<last_iteration>\d+)\s*$")
# A value may be followed by junk another process or a person appended ("1.916 <<< note"), never glued to it.
_FIELD = re.compile(r"^\s*(?P<key>[A-Za-z_][A-Za-z_ ]*?)\s*:\s*"
                    r"(?P<value>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf)(?=\s|$)")
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
# Step timing comes from NeMo's TimingCallback, which a recipe may leave out: not required.
_REQUIRED = ("global_step", "reduced_train_loss")
_INTEGER_FIELDS = {"global_batch_size", "global_step", "consumed_samples"}


@dataclass(frozen=True)
class NemoStep:
    """One `Training epoch E, iteration i/N | …` line."""

    epoch: int
    iteration: int
    last_iteration: int  # N in "i/N": the index of the last iteration (249 for 250 steps)
    global_step: int
    reduced_train_loss: float
    train_step_timing_s: float | None = None  # None when the TimingCallback was off
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
class NemoLog(SkippedLines):
    """Everything read from one NeMo log. `problems` lists the lines that looked like step lines
    or summary totals but could not be read (cut, garbled, or mixed with another rank's output)."""

    steps: list[NemoStep] = field(default_factory=list)
    resolved_arguments: dict[str, str] = field(default_factory=dict)
    parameter_summaries: list[ParameterSummary] = field(default_factory=list)
    problems: list[LogProblem] = field(default_factory=list)
    tokens_per_step: float | None = None  # real tokens of one optimizer step, where the job printed them

    @property
    def last_step(self) -> NemoStep | None:
        return self.steps[-1] if self.steps else None

    @property
    def mean_step_time_s(self) -> float | None:
        """Mean of NeMo's own step timings, the first step left out when there are others (it carries the
        one-off costs: allocation, NCCL set-up), the rule the Hugging Face jobs' metrics follow."""
        timed = [step.train_step_timing_s for step in self.steps if step.train_step_timing_s is not None]
        timed = timed[1:] if len(timed) > 1 else timed
        return sum(timed) / len(timed) if timed else None

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
# The header row of the table (NeMo 2.0-2.2), or the title the dry run prints above it (2.4).
_TABLE_START = re.compile(r"Argument Name.*Resolved Value|^\s*Resolved Arguments\s*$")


def parse_resolved_arguments(lines: list[str]) -> dict[str, str]:
    """The "Argument Name │ Resolved Value" table NeMo prints first; wrapped values are joined.

    Rich draws it with or without a right border and a header row; values longer than the
    column are wrapped onto rows whose name cell is empty (and cut with `…` past 60 characters)."""
    arguments: dict[str, str] = {}
    inside = False
    last_name: str | None = None
    for line in lines:
        if not inside:
            inside = bool(_TABLE_START.search(line))
            continue
        stripped = line.strip()
        if not stripped or set(stripped) <= _TABLE_RULE_CHARS:
            if stripped.startswith(("└", "┗")) or (not stripped and arguments):
                break  # the bottom border, or the blank line after the table
            continue
        if stripped[0] not in _TABLE_BORDERS:
            if arguments:
                break
            continue  # the dry run's title lines before the first row
        cells = [cell.strip() for cell in re.split(f"[{_TABLE_BORDERS}]", stripped)[1:]]
        if cells and not cells[-1] and stripped[-1] in _TABLE_BORDERS:
            cells = cells[:-1]  # the right border
        if len(cells) < 2:
            continue
        name, value = cells[0], " ".join(cell for cell in cells[1:] if cell)
        if name in ("Argument Name",):
            continue
        if name:
            arguments[name] = value
            last_name = name
        elif last_name is not None and value:
            arguments[last_name] = f"{arguments[last_name]} {value}"
    return arguments


def _filled(step: NemoStep) -> int:
    return sum(value is not None for value in vars(step).values())


def parse_nemo_log(text: str) -> NemoLog:
    """Read the step lines, resolved arguments and parameter summaries of a NeMo job log.

    A step printed twice keeps its last copy: after a restart from a checkpoint NeMo prints the
    steps since that checkpoint again, and the resumed run's values are the ones that count. A
    later copy that only lacks fields another rank's output cut off does not replace a fuller one."""
    numbered = log_lines(text)
    steps_by_step: dict[int, NemoStep] = {}
    summaries: list[dict[str, float | int]] = []
    problems: list[LogProblem] = []
    tokens_per_step = None
    for number, line in numbered:
        if (tokens := _TOKENS_PER_STEP.search(line)) is not None:
            tokens_per_step = float(tokens["tokens"])
            continue
        if STEP_MARKER in line:
            for segment in _step_segments(line):
                step = parse_step(segment)
                if step is None:
                    problems.append(LogProblem(number, segment, "a NeMo step line without a readable "
                                               "global_step and reduced_train_loss"))
                    continue
                old = steps_by_step.get(step.global_step)
                if (old is None or old.reduced_train_loss != step.reduced_train_loss
                        or _filled(step) >= _filled(old)):
                    steps_by_step[step.global_step] = step
            continue
        match = _SUMMARY_LINE.match(line)
        if match is not None:
            key, value = _summary_value(match)
            if key == "trainable_params" or not summaries or key in summaries[-1]:
                summaries.append({})
            summaries[-1][key] = value
        elif _SUMMARY_HINT.search(line):
            problems.append(LogProblem(number, line, "a model summary total that is not '<number> [K|M|B] <label>'"))
    return NemoLog(
        steps=[steps_by_step[key] for key in sorted(steps_by_step)],
        resolved_arguments=parse_resolved_arguments([line for _, line in numbered]),
        parameter_summaries=[ParameterSummary(**values) for values in summaries],
        problems=problems,
        tokens_per_step=tokens_per_step,
    )
