"""The block a job script echoes around its work: start time, end time, `Total time : HH:MM:SS` and the
`Exit status: N` of its commands (slurm/templates/blocks/footer.j2)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

from workshop_lib.core.durations import format_duration, parse_duration
from workshop_lib.core.log_text import LogProblem, SkippedLines, log_lines

# `date "+%Y-%m-%d %H:%M:%S"` pads; the seeds' example ("2025-12-5 10:34:24") does not: accept both.
_TIMESTAMP = r"(?P<stamp>\d{4}-\d{1,2}-\d{1,2}[ T]\d{1,2}:\d{2}:\d{2})"
_START = re.compile(r"Start time\s*:\s*" + _TIMESTAMP)
_END = re.compile(r"End time\s*:\s*" + _TIMESTAMP)
# HH:MM:SS, hours may pass 24; SLURM-style D-HH:MM:SS also accepted (durations.parse_duration reads it).
_TOTAL = re.compile(r"Total time\s*:\s*(?:\d+-)?\d+:\d{2}:\d{2}\b")
# The footer's words open their line (after the template's indent): a program's own line that carries them
# further on, like NeMo's "Global Checkpoint Save : … Start time: 1795613081.807s", is not the job's footer.
_HINT = re.compile(r"^\s*(Start time|End time|Total time)\s*:")
# The whole line, so a program's own "exit status: ..." sentence is not taken for the job's.
_EXIT_STATUS = re.compile(r"^\s*Exit status\s*:\s*(\d+)\s*$")
LOG_KEYWORDS = ("Start time", "End time", "Total time", "Exit status")  # every line parse_footer reads holds one


@dataclass(frozen=True)
class JobFooter(SkippedLines):
    """Times a job printed about itself; None where the line is missing (a job killed early)."""

    start_time: datetime | None = None
    end_time: datetime | None = None
    total_time_s: int | None = None
    exit_status: int | None = None  # the last one: a requeued job's log holds each attempt's footer
    problems: list[LogProblem] = field(default_factory=list)  # footer lines whose time could not be read

    @property
    def finished(self) -> bool:
        """True when the job reached its closing block."""
        return self.end_time is not None or self.total_time_s is not None

    @property
    def total_time_text(self) -> str | None:
        return format_duration(self.total_time_s) if self.total_time_s is not None else None


def _timestamp(text: str) -> datetime | None:
    try:
        return datetime.strptime(text.replace("T", " "), "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return None


def _total_seconds(match: re.Match) -> int | None:
    try:
        seconds = parse_duration(match.group(0).split(":", 1)[1])
    except ValueError:
        return None
    return int(seconds) if seconds is not None else None


def parse_footer(text: str) -> JobFooter:
    """The last start, end and total time lines of a job's output; the total is computed from the
    start and end when the job printed no `Total time` line."""
    start = end = None
    total = exit_status = None
    problems: list[LogProblem] = []
    for number, line in log_lines(text):
        if match := _EXIT_STATUS.match(line):
            exit_status = int(match.group(1))
            continue
        if not _HINT.match(line):
            continue
        read_something = False
        if (match := _START.search(line)) and (stamp := _timestamp(match["stamp"])):
            start, read_something = stamp, True
        if (match := _END.search(line)) and (stamp := _timestamp(match["stamp"])):
            end, read_something = stamp, True
        if (match := _TOTAL.search(line)) and (seconds := _total_seconds(match)) is not None:
            total, read_something = seconds, True
        if not read_something:
            problems.append(LogProblem(number, line.strip(), "a footer line whose time is not YYYY-MM-DD HH:MM:SS "
                                                             "or a duration HH:MM:SS"))
    if total is None and start is not None and end is not None and end >= start:
        total = int((end - start).total_seconds())
    return JobFooter(start_time=start, end_time=end, total_time_s=total, exit_status=exit_status, problems=problems)
