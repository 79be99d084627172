"""Reading log files the way the parsers need them: never failing on bad bytes or progress bars,
and seeing through the prefixes launchers put in front of every line."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from workshop_lib.core.errors import WorkshopError

# tqdm redraws its bar with carriage returns; each redraw is a line of its own for us.
_LINE_BREAKS = re.compile(r"\r\n|\r|\n")

# What launchers put in front of a process's lines, outermost first; several may stack
# (`srun -l` around torchrun around NeMo-Run):
#   NeMo-Run:        `finetune/0 [default0]:` (the task name may be cut: `ining-demo/0 [default3]:`),
#                    `i.finetune/0 ` alone when it started one process
#   torchrun --tee:  `[default0]:`, newer torch `[rank0]:`
#   srun -l:         `0: ` (and `  3: ` when right-aligned)
#   mpirun --tag-output: `[1,0]<stdout>:`
_LAUNCHER_PREFIX = re.compile(
    r"^(?:"
    r"\S+/\d+ (?=\[default\d+\]:|[IWEF]\d{4} )"  # NeMo-Run's task name, before a rank label or a glog line
    # ... or alone (one process, no torchrun: `i.finetune/0 335 M Trainable params`), taken only before
    # what NeMo prints (so `logs/0 written` or a date `2023/06/22 18:56` keep their first word)
    r"|[^\s/]{1,40}/\d+ (?=\[NeMo |Training epoch |[\d,.]+\s*[KMBT]?\s+(?:Trainable|Non-trainable|Total|Modules) )"
    r"|\[(?:default|rank)\d+\]: ?"
    r"|\s*\d+: "
    r"|\[\d+,\d+\]<(?:stdout|stderr)>:"
    r")"
)


class UnreadableLog(WorkshopError):
    """A log of a known format in which nothing could be read."""

    def __init__(self, source: str, expected: str, problem: "LogProblem | None" = None):
        self.source, self.expected, self.problem = source, expected, problem
        where = f"{source}:{problem.line}" if problem else source
        found = f" Line {problem.line} reads {problem.text!r}: {problem.reason}." if problem else ""
        super().__init__(f"{where}: nothing readable in this log; expected {expected}.{found} "
                         "Check that the file is the right one and was written completely.")


@dataclass(frozen=True)
class LogProblem:
    """A line that looked like data but could not be read: where, what it said, and why."""

    line: int
    text: str
    reason: str

    def format(self, source: str = "") -> str:
        return f"{source}:{self.line}: {self.reason}: {self.text[:120]!r}"


class SkippedLines:
    """The one rule for a parsed log (and a run's file, `results.UnreadableLines`) on the lines it could
    not read: each is in ``problems`` (a field of its dataclass), ``skipped_lines`` counts them."""

    problems: Sequence[LogProblem]  # declared by each dataclass, not here

    @property
    def skipped_lines(self) -> int:
        return len(self.problems)


def read_text(path: str | Path) -> str:
    """The file's text; undecodable bytes (a log cut mid-character, binary junk) become U+FFFD."""
    return Path(path).read_bytes().decode("utf-8", errors="replace")


def strip_launcher_prefix(line: str) -> str:
    """The line as the process printed it, without the prefixes its launchers added."""
    while match := _LAUNCHER_PREFIX.match(line):
        if not match.end():
            break
        line = line[match.end():]
    return line


def log_lines(text: str) -> list[tuple[int, str]]:
    """(line number, text without launcher prefixes) for every line of a log.

    Numbers count newline-separated lines as an editor shows them; the pieces of a line that a
    progress bar split with carriage returns share its number."""
    numbered = []
    for number, line in enumerate(text.split("\n"), start=1):
        for piece in _LINE_BREAKS.split(line):
            numbered.append((number, strip_launcher_prefix(piece)))
    return numbered


def to_float(value: object) -> float | None:
    """A finite or infinite float from a number or numeric string; None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return None
        return number
    return None


def is_number(value: float | None) -> bool:
    """True for a real, finite number."""
    return value is not None and math.isfinite(value)
