"""Reading log files the way the parsers need them: never failing on bad bytes or progress bars,
and seeing through the prefixes launchers put in front of every line."""

from __future__ import annotations

import math
import os
import re
import stat
from collections.abc import Iterable, Sequence
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
    """The file's text; undecodable bytes (a log cut mid-character, binary junk) become U+FFFD. A FIFO or a
    device is refused: reading it would wait for a writer, or never end (/dev/zero)."""
    if Path(path).exists() and _regular_file_size(path) is None:
        raise WorkshopError(f"{path} is not a regular file (a FIFO, a device or a folder): give the path of a "
                            "log file")
    return Path(path).read_bytes().decode("utf-8", errors="replace")


# ---- logs too big to read whole (a job that printed a warning per step for a day) ---------------------------
# Where only a log's end matters (why a job failed, its footer), its last TAIL_BYTES are read: a traceback, the
# footer and SLURM's kill notices are there. A log up to WHOLE_BYTES is read whole; a longer one is streamed,
# its first HEAD_BYTES whole (the tables a program prints as it starts).
TAIL_BYTES = 2**20
HEAD_BYTES = 2**20
WHOLE_BYTES = 32 * 2**20
_CHUNK_BYTES = 8 * 2**20


@dataclass(frozen=True)
class LogExcerpt:
    """Some lines of a log, each with its line number in the whole file: what the parsers read of a log too big
    to read whole. `log_lines` takes it as it takes a whole text."""

    lines: tuple[tuple[int, str], ...]
    size: int  # the whole file's size in bytes

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)


def _regular_file_size(path: str | Path) -> int | None:
    """The file's size; None when it is not a regular file (a FIFO or /dev/zero would block or never end)."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_size if stat.S_ISREG(status.st_mode) else None


def read_tail(path: str | Path | None, most: int | None = None) -> LogExcerpt:
    """The log's last `most` bytes, from a line's start, each line numbered as in the whole file (its newlines
    are counted in chunks: bounded memory). Empty when the file is missing or not a regular file."""
    size = _regular_file_size(path) if path is not None else None
    if size is None:
        return LogExcerpt((), 0)
    with open(path, "rb") as log:
        start = max(0, size - (most or TAIL_BYTES))
        log.seek(start)
        data = log.read(size - start)
        if start:
            cut = data.find(b"\n")  # the first line is partial: begin after it
            data, start = (data[cut + 1:], start + cut + 1) if cut >= 0 else (b"", size)
        first = _count_newlines(log, start) + 1
    lines = data.decode("utf-8", errors="replace").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return LogExcerpt(tuple(enumerate(lines, start=first)), size)


def _count_newlines(log, end: int) -> int:
    log.seek(0)
    counted, position = 0, 0
    while position < end:
        chunk = log.read(min(_CHUNK_BYTES, end - position))
        if not chunk:
            break
        counted += chunk.count(b"\n")
        position += len(chunk)
    return counted


def read_log(path: str | Path, keywords: Iterable[str]) -> str | LogExcerpt:
    """A log for the parsers: the whole text up to WHOLE_BYTES; a longer one streamed, keeping its first
    HEAD_BYTES whole (the tables a program prints as it starts) and after that the lines holding one of
    `keywords` (each parser's LOG_KEYWORDS: the lines it can read), with their line numbers."""
    size = _regular_file_size(path)
    if size is None:
        return ""
    if size <= WHOLE_BYTES:
        return read_text(path)
    wanted = re.compile(b"|".join(re.escape(keyword.encode()) for keyword in keywords))
    kept: list[tuple[int, str]] = []
    with open(path, "rb") as log:
        number, offset, carry = 1, 0, b""
        while True:
            block = log.read(HEAD_BYTES if offset == 0 else _CHUNK_BYTES)
            data = carry + block
            if not block:
                carry, chunk = b"", data
            else:
                cut = data.rfind(b"\n") + 1  # whole lines only; the rest waits for the next block
                if not cut and len(data) > _CHUNK_BYTES:
                    cut = len(data)  # a line longer than a chunk is read in pieces: memory stays bounded
                chunk, carry = data[:cut], data[cut:]
            if chunk:
                kept.extend(_lines_of(chunk, number, None if offset == 0 else wanted))  # the head: whole
                number += chunk.count(b"\n")
                offset += len(chunk)
            if not block:
                break
    return LogExcerpt(tuple(kept), size)


def _lines_of(chunk: bytes, first: int, wanted: re.Pattern | None) -> list[tuple[int, str]]:
    """The numbered lines of a chunk of whole lines: all of them, or those holding a wanted keyword (one regular
    expression pass over the bytes: a chunk of noise costs no Python work per line)."""
    if wanted is None:
        lines = chunk.decode("utf-8", errors="replace").split("\n")
        if chunk.endswith(b"\n"):
            lines.pop()
        return list(enumerate(lines, start=first))
    spans = []
    match = wanted.search(chunk)
    while match is not None:
        start = chunk.rfind(b"\n", 0, match.start()) + 1
        end = chunk.find(b"\n", match.end())
        end = len(chunk) if end < 0 else end
        spans.append((start, end))
        match = wanted.search(chunk, end)  # the next line holding one
    found, number, counted_to = [], first, 0
    for start, end in spans:
        number += chunk.count(b"\n", counted_to, start)
        counted_to = start
        found.append((number, chunk[start:end].decode("utf-8", errors="replace")))
    return found


def strip_launcher_prefix(line: str) -> str:
    """The line as the process printed it, without the prefixes its launchers added."""
    while match := _LAUNCHER_PREFIX.match(line):
        if not match.end():
            break
        line = line[match.end():]
    return line


def log_lines(text: "str | LogExcerpt") -> list[tuple[int, str]]:
    """(line number, text without launcher prefixes) for every line of a log (or of an excerpt of one).

    Numbers count newline-separated lines as an editor shows them; the pieces of a line that a
    progress bar split with carriage returns share its number."""
    numbered = []
    lines = text.lines if isinstance(text, LogExcerpt) else enumerate(text.split("\n"), start=1)
    for number, line in lines:
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
