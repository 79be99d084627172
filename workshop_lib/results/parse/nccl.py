"""nccl-tests output (`all_reduce_perf`, `all_gather_perf`, …): the per-size rows and the
`# Avg bus bandwidth` line of each collective in a file.

Layouts differ between versions: the leading columns are `size count type` plus `redop` and/or
`root` (12 or 13 columns in all), the error column is `error` (older) or `#wrong` (may be `N/A`).
A file may hold several collectives, each announced by its command line (`Running: …/all_reduce_perf …`);
each is reported by name. Under `mpirun --tag-output` or `srun -l` every line carries a prefix."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from workshop_lib.core.log_text import (
    LogProblem,
    SkippedLines,
    UnreadableLog,
    is_number,
    log_lines,
    read_text,
    to_float,
)

_AVERAGE = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(?P<value>\S+)")
_RANK = re.compile(r"^#\s*Rank\s+\d+\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(?P<host>\S+)\s+device\s+\d+")
_OUT_OF_BOUNDS = re.compile(r"^#\s*Out of bounds values\s*:\s*(?P<count>\d+)")
_TEST_NAME = re.compile(r"(?P<name>\b[a-z_]+_perf)\b")
_ELISION = re.compile(r"^\s*(?:\.\.\.|…|⋮)\s*$")
# size count type [redop] [root] | time algbw busbw error | time algbw busbw error
_TIMING_COLUMNS = 8
UNNAMED = ""


@dataclass(frozen=True)
class CollectiveRow:
    """One message size: out-of-place and in-place timings (GB/s are the tool's 10⁹ bytes/s)."""

    size_bytes: int
    count: int
    data_type: str
    out_of_place_time_us: float
    out_of_place_algbw_gbps: float
    out_of_place_busbw_gbps: float
    in_place_time_us: float
    in_place_algbw_gbps: float
    in_place_busbw_gbps: float


@dataclass(frozen=True)
class NcclResult(SkippedLines):
    """One collective's results. When srun started one independent test per node, each prints its
    own average: all are kept, and `avg_bus_bandwidth_gbps` is the lowest of them, the one a
    threshold check must use."""

    name: str = UNNAMED  # e.g. "all_reduce_perf"; "" when the file does not say
    rows: list[CollectiveRow] = field(default_factory=list)
    avg_bus_bandwidths_gbps: list[float] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    out_of_bounds: int | None = None
    problems: list[LogProblem] = field(default_factory=list)

    @property
    def avg_bus_bandwidth_gbps(self) -> float | None:
        return min(self.avg_bus_bandwidths_gbps) if self.avg_bus_bandwidths_gbps else None

    @property
    def peak_bus_bandwidth_gbps(self) -> float | None:
        if not self.rows:
            return None
        return max(max(row.out_of_place_busbw_gbps, row.in_place_busbw_gbps) for row in self.rows)

    @property
    def sizes_bytes(self) -> list[int]:
        """The message sizes measured, each once, in order."""
        return sorted({row.size_bytes for row in self.rows})


@dataclass(frozen=True)
class NcclLog:
    """Every collective of one file, by name, in the order they ran."""

    collectives: dict[str, NcclResult] = field(default_factory=dict)
    problems: list[LogProblem] = field(default_factory=list)  # lines outside any section

    def __getitem__(self, name: str) -> NcclResult:
        """The collective `name` (`all_reduce` or `all_reduce_perf`)."""
        key = name if name.endswith("_perf") or name == UNNAMED else f"{name}_perf"
        return self.collectives[key]


def _row(cells: list[str]) -> CollectiveRow | None:
    leading = len(cells) - _TIMING_COLUMNS
    if not 3 <= leading <= 5 or not cells[0].isdigit() or not cells[1].isdigit():
        return None
    numbers = [to_float(cells[leading + offset]) for offset in (0, 1, 2, 4, 5, 6)]
    if not all(is_number(number) for number in numbers):
        return None
    return CollectiveRow(int(cells[0]), int(cells[1]), cells[2], *numbers)


class _Section:
    def __init__(self, name: str):
        self.name = name
        self.rows: list[CollectiveRow] = []
        self.averages: list[float] = []
        self.hosts: list[str] = []
        self.out_of_bounds: int | None = None
        self.problems: list[LogProblem] = []

    def result(self) -> NcclResult:
        return NcclResult(self.name, self.rows, self.averages, self.hosts, self.out_of_bounds, self.problems)


def parse_nccl(text: str) -> NcclLog:
    """Read nccl-tests output; lines that start like a result row but do not parse are reported."""
    sections: dict[str, _Section] = {}
    current: _Section | None = None
    for number, line in log_lines(text):
        stripped = line.strip()
        if not stripped or _ELISION.match(stripped):
            continue
        if not stripped[0].isdigit() and not stripped.startswith("#") and (name := _TEST_NAME.search(stripped)):
            current = sections.setdefault(name["name"], _Section(name["name"]))
            continue
        if current is None:
            current = sections.setdefault(UNNAMED, _Section(UNNAMED))
        if stripped.startswith("#"):
            if match := _AVERAGE.match(stripped):
                value = to_float(match["value"])
                if is_number(value):
                    current.averages.append(value)
                else:
                    current.problems.append(LogProblem(number, stripped, "an average without a number"))
            elif match := _RANK.match(stripped):
                if match["host"] not in current.hosts:
                    current.hosts.append(match["host"])
            elif match := _OUT_OF_BOUNDS.match(stripped):
                current.out_of_bounds = (current.out_of_bounds or 0) + int(match["count"])
            continue
        if stripped[0].isdigit():
            row = _row(stripped.split())
            if row is None:
                current.problems.append(LogProblem(
                    number, stripped, "a result row that is not `size count type [redop] [root]` followed "
                    "by time, algbw, busbw and error twice (out-of-place, in-place)"))
            else:
                current.rows.append(row)
    collectives = {name: section.result() for name, section in sections.items()
                   if section.rows or section.averages or section.problems}
    return NcclLog(collectives=collectives)


def parse_nccl_allreduce(text: str) -> NcclResult:
    """The all_reduce_perf results of a file (the file's only collective when it names none)."""
    log = parse_nccl(text)
    if "all_reduce_perf" in log.collectives:
        return log.collectives["all_reduce_perf"]
    if len(log.collectives) == 1 and UNNAMED in log.collectives:
        return log.collectives[UNNAMED]
    return NcclResult(name="all_reduce_perf")


def read_nccl(path: str | Path) -> NcclLog:
    """Parse an nccl-tests output file; raise UnreadableLog when it holds no result at all."""
    log = parse_nccl(read_text(path))
    if not log.collectives or not any(result.rows or result.avg_bus_bandwidths_gbps for result in log.collectives.values()):
        problems = [problem for result in log.collectives.values() for problem in result.problems]
        raise UnreadableLog(str(path), "nccl-tests rows (`size count type … time algbw busbw …`) and an "
                            "`# Avg bus bandwidth` line", problems[0] if problems else None)
    return log
