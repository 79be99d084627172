"""GPU memory logs written by `nvidia-smi --query-gpu=… --format=csv[,nounits] -l N`, one file per node."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from .text import read_text, split_lines

# What the job scripts ask for when a file has no header line (`--format=csv,noheader`).
DEFAULT_COLUMNS = ("timestamp", "index", "name", "memory.used", "memory.total")
_UNAVAILABLE = {"[N/A]", "N/A", "[Not Supported]", "[Unknown Error]", "[GPU is lost]"}
_NUMBER_WITH_UNIT = re.compile(r"^(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>MiB|GiB|%)?$")
_FILE_PREFIXES = ("gpu_memory_log_", "gpu_memory_")


@dataclass(frozen=True)
class GpuMemorySample:
    """One GPU at one moment."""

    gpu_index: int
    used_mib: float
    total_mib: float | None = None
    timestamp: datetime | None = None
    name: str | None = None


@dataclass(frozen=True)
class GpuMemoryLog:
    """One node's log. `node` comes from the file name (`gpu_memory_<node>.csv`) when not given."""

    node: str
    samples: list[GpuMemorySample] = field(default_factory=list)
    skipped_lines: int = 0

    @property
    def gpu_indices(self) -> list[int]:
        return sorted({sample.gpu_index for sample in self.samples})

    def used_mib(self, gpu_index: int) -> list[float]:
        """Every reading of one GPU of this node, in file order."""
        return [sample.used_mib for sample in self.samples if sample.gpu_index == gpu_index]


def node_from_filename(path: str | Path) -> str:
    """`gpu_memory_node1.csv` → `node1`; other names give their stem."""
    stem = Path(path).stem
    if stem in ("gpu_memory", "gpu_memory_log"):
        return stem  # the seeds' single-node name carries no node
    for prefix in _FILE_PREFIXES:
        if stem.startswith(prefix) and len(stem) > len(prefix):
            return stem[len(prefix):]
    return stem


def _column_name(header_cell: str) -> str:
    """`memory.used [MiB]` → `memory.used`."""
    return header_cell.split("[")[0].strip()


def _mib(cell: str) -> float | None:
    """A memory value in MiB from `1234`, `1234 MiB` or `1.2 GiB`; None for `[N/A]` and junk."""
    cell = cell.strip()
    if cell in _UNAVAILABLE:
        return None
    match = _NUMBER_WITH_UNIT.match(cell)
    if match is None:
        return None
    number = float(match["number"])
    return number * 1024 if match["unit"] == "GiB" else number


def _timestamp(cell: str) -> datetime | None:
    for layout in ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S"):
        try:
            return datetime.strptime(cell.strip(), layout)
        except ValueError:
            continue
    return None


def _is_header(cells: list[str]) -> bool:
    names = {_column_name(cell) for cell in cells}
    return "memory.used" in names or "timestamp" in names


def parse_nvidia_smi(text: str, node: str = "") -> GpuMemoryLog:
    """Read an nvidia-smi CSV with or without units. Lines with `[N/A]`, cut lines and lines mixed
    with other output are skipped and counted; a repeated header (an appended file) is accepted."""
    columns: tuple[str, ...] = DEFAULT_COLUMNS
    samples: list[GpuMemorySample] = []
    skipped = 0
    for line in split_lines(text):
        if not line.strip():
            continue
        cells = [cell.strip() for cell in line.split(",")]
        if _is_header(cells):
            columns = tuple(_column_name(cell) for cell in cells)
            continue
        sample = _sample(cells, columns)
        if sample is None:
            skipped += 1
        else:
            samples.append(sample)
    return GpuMemoryLog(node=node, samples=samples, skipped_lines=skipped)


def _sample(cells: list[str], columns: tuple[str, ...]) -> GpuMemorySample | None:
    if len(cells) != len(columns) or "memory.used" not in columns:
        return None
    row = dict(zip(columns, cells))
    used = _mib(row["memory.used"])
    if used is None:
        return None
    index = 0  # a query without `index` is a single-GPU log
    if "index" in row:
        if not row["index"].isdigit():
            return None
        index = int(row["index"])
    timestamp = None
    if "timestamp" in row:
        timestamp = _timestamp(row["timestamp"])
        if timestamp is None:
            return None  # a garbled or cut time stamp means the line itself is damaged
    return GpuMemorySample(
        gpu_index=index,
        used_mib=used,
        total_mib=_mib(row["memory.total"]) if "memory.total" in row else None,
        timestamp=timestamp,
        name=row.get("name"),
    )


def read_nvidia_smi(path: str | Path, node: str | None = None) -> GpuMemoryLog:
    """Parse one node's log file; the node name defaults to the one in the file name."""
    return parse_nvidia_smi(read_text(path), node=node if node is not None else node_from_filename(path))
