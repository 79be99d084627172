"""CPU memory logs written by `psrecord PID --include-children --interval N --log FILE`
(the plain text layout, and the `--log-format csv` one).

psrecord divides psutil's byte counts by 1024², so its "MB" columns are MiB; we name them so."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from workshop_lib.core.log_text import LogProblem, SkippedLines, is_number, log_lines, read_text, to_float

_CSV_HEADER_START = "elapsed_time,"


@dataclass(frozen=True)
class CpuMemorySample:
    elapsed_s: float
    cpu_percent: float
    real_mib: float  # resident memory of the process and its children
    virtual_mib: float | None = None  # absent from logs with fewer columns


@dataclass(frozen=True)
class CpuMemoryLog(SkippedLines):
    samples: list[CpuMemorySample] = field(default_factory=list)
    problems: list[LogProblem] = field(default_factory=list)

    @property
    def real_mib(self) -> list[float]:
        return [sample.real_mib for sample in self.samples]


# The plain layout's header comment names its columns; these are the ones we read.
_PLAIN_COLUMNS = {"Elapsed time": "elapsed_s", "CPU (%)": "cpu_percent", "Real (MB)": "real_mib",
                  "Virtual (MB)": "virtual_mib"}
_PLAIN_DEFAULT = ("elapsed_s", "cpu_percent", "real_mib", "virtual_mib")


def _plain_columns(header: str) -> tuple[str, ...]:
    """`# Elapsed time   CPU (%)   Real (MB) …` -> the attribute of each column (None for others)."""
    names = re.split(r"\s{2,}", header.lstrip("#").strip())
    return tuple(_PLAIN_COLUMNS.get(name) for name in names)


def _plain_sample(line: str, columns: tuple[str | None, ...]) -> CpuMemorySample | str:
    cells = line.split()
    numbers = [to_float(cell) for cell in cells]
    if not all(is_number(number) for number in numbers):
        return "a sample line with a field that is not a number"
    if len(cells) != len(columns) and not (columns == _PLAIN_DEFAULT and len(cells) in (4, 8)):
        return f"{len(cells)} fields where the header names {len(columns)}"  # 8 with --include-io
    values = {name: number for name, number in zip(columns, numbers) if name}
    if not {"elapsed_s", "cpu_percent", "real_mib"} <= values.keys():
        return "no elapsed time, CPU and Real (MB) columns"
    return CpuMemorySample(**values)


def _csv_sample(line: str, columns: list[str]) -> CpuMemorySample | None:
    cells = line.split(",")
    if len(cells) != len(columns):
        return None
    row = {name: to_float(cell) for name, cell in zip(columns, cells)}
    wanted = ("elapsed_time", "cpu", "mem_real", "mem_virtual")
    if not all(is_number(row.get(name)) for name in wanted):
        return None
    return CpuMemorySample(
        elapsed_s=row["elapsed_time"], cpu_percent=row["cpu"], real_mib=row["mem_real"], virtual_mib=row["mem_virtual"]
    )


def parse_psrecord(text: str) -> CpuMemoryLog:
    """Read a psrecord log; the header names the columns, damaged lines are reported."""
    samples: list[CpuMemorySample] = []
    problems: list[LogProblem] = []
    csv_columns: list[str] | None = None
    plain_columns: tuple[str | None, ...] = _PLAIN_DEFAULT
    for number, line in log_lines(text):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            if "Elapsed time" in stripped:
                plain_columns = _plain_columns(stripped)
            continue
        if stripped.startswith(_CSV_HEADER_START):
            csv_columns = stripped.split(",")
            continue
        sample = _csv_sample(stripped, csv_columns) if csv_columns else _plain_sample(stripped, plain_columns)
        if sample is None or isinstance(sample, str):
            problems.append(LogProblem(number, stripped, sample or "a CSV line that does not match its header"))
        else:
            samples.append(sample)
    return CpuMemoryLog(samples=samples, problems=problems)


def read_psrecord(path: str | Path) -> CpuMemoryLog:
    return parse_psrecord(read_text(path))
