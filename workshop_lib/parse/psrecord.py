"""CPU memory logs written by `psrecord PID --include-children --interval N --log FILE`
(the plain text layout, and the `--log-format csv` one).

psrecord divides psutil's byte counts by 1024², so its "MB" columns are MiB; we name them so."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .text import is_number, read_text, split_lines, to_float

_CSV_HEADER_START = "elapsed_time,"


@dataclass(frozen=True)
class CpuMemorySample:
    elapsed_s: float
    cpu_percent: float
    real_mib: float  # resident memory of the process and its children
    virtual_mib: float


@dataclass(frozen=True)
class CpuMemoryLog:
    samples: list[CpuMemorySample] = field(default_factory=list)
    skipped_lines: int = 0

    @property
    def real_mib(self) -> list[float]:
        return [sample.real_mib for sample in self.samples]


def _plain_sample(line: str) -> CpuMemorySample | None:
    cells = line.split()
    if len(cells) < 4:
        return None
    numbers = [to_float(cell) for cell in cells[:4]]
    if not all(is_number(number) for number in numbers) or len(cells) not in (4, 8):
        return None  # 8 columns when --include-io added its counters
    elapsed, cpu, real, virtual = numbers
    return CpuMemorySample(elapsed_s=elapsed, cpu_percent=cpu, real_mib=real, virtual_mib=virtual)


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
    """Read a psrecord log; header and comment lines are passed over, damaged lines counted."""
    samples: list[CpuMemorySample] = []
    skipped = 0
    csv_columns: list[str] | None = None
    for line in split_lines(text):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith(_CSV_HEADER_START):
            csv_columns = stripped.split(",")
            continue
        sample = _csv_sample(stripped, csv_columns) if csv_columns else _plain_sample(stripped)
        if sample is None:
            skipped += 1
        else:
            samples.append(sample)
    return CpuMemoryLog(samples=samples, skipped_lines=skipped)


def read_psrecord(path: str | Path) -> CpuMemoryLog:
    return parse_psrecord(read_text(path))
