"""nccl-tests `all_reduce_perf` output: the per-size rows and the `# Avg bus bandwidth` line."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .text import is_number, split_lines, to_float

_AVERAGE = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(?P<value>\S+)")
_RANK = re.compile(r"^#\s*Rank\s+(?P<rank>\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(?P<host>\S+)\s+device\s+(?P<device>\d+)")
_OUT_OF_BOUNDS = re.compile(r"^#\s*Out of bounds values\s*:\s*(?P<count>\d+)")


@dataclass(frozen=True)
class AllReduceRow:
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
class NcclResult:
    """Everything read from one or more all_reduce_perf outputs in the same file. When srun started
    one independent test per node, each prints its own average: all are kept, and
    `avg_bus_bandwidth_gbps` is the lowest of them, the one a threshold check must use."""

    rows: list[AllReduceRow] = field(default_factory=list)
    avg_bus_bandwidths_gbps: list[float] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    out_of_bounds: int | None = None
    skipped_lines: int = 0

    @property
    def avg_bus_bandwidth_gbps(self) -> float | None:
        return min(self.avg_bus_bandwidths_gbps) if self.avg_bus_bandwidths_gbps else None

    @property
    def peak_bus_bandwidth_gbps(self) -> float | None:
        if not self.rows:
            return None
        return max(max(row.out_of_place_busbw_gbps, row.in_place_busbw_gbps) for row in self.rows)


def _row(cells: list[str]) -> AllReduceRow | None:
    # size count type redop root | time algbw busbw #wrong | time algbw busbw #wrong
    if len(cells) != 13 or not cells[0].isdigit() or not cells[1].isdigit():
        return None
    numbers = [to_float(cells[index]) for index in (5, 6, 7, 9, 10, 11)]
    if not all(is_number(number) for number in numbers):
        return None
    return AllReduceRow(int(cells[0]), int(cells[1]), cells[2], *numbers)


def parse_nccl_allreduce(text: str) -> NcclResult:
    """Read all_reduce_perf output; lines that start like a result row but do not parse are counted."""
    rows: list[AllReduceRow] = []
    averages: list[float] = []
    hosts: list[str] = []
    out_of_bounds = None
    skipped = 0
    for line in split_lines(text):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            if match := _AVERAGE.match(stripped):
                value = to_float(match["value"])
                if is_number(value):
                    averages.append(value)
                else:
                    skipped += 1
            elif match := _RANK.match(stripped):
                if match["host"] not in hosts:
                    hosts.append(match["host"])
            elif match := _OUT_OF_BOUNDS.match(stripped):
                out_of_bounds = (out_of_bounds or 0) + int(match["count"])
            continue
        if stripped[0].isdigit():
            row = _row(stripped.split())
            if row is None:
                skipped += 1
            else:
                rows.append(row)
    return NcclResult(rows=rows, avg_bus_bandwidths_gbps=averages, hosts=hosts,
                      out_of_bounds=out_of_bounds, skipped_lines=skipped)
