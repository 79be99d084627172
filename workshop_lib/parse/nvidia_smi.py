"""GPU memory (and utilisation) logs written by `nvidia-smi --query-gpu=… --format=csv[,nounits] -l N`,
one file per node."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from .text import LogProblem, SkippedLines, log_lines, read_text

# The columns assumed when a file has no header line (`--format=csv,noheader`): seed 002's query. The job
# scripts' monitor (scripts.GPU_QUERY, which adds utilization.gpu) always writes its header.
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
    utilization_pct: float | None = None  # utilization.gpu; None where the query lacks it or the GPU says [N/A]


@dataclass(frozen=True)
class GpuMemoryLog(SkippedLines):
    """One node's log. `node` comes from the file name (`gpu_memory_<node>.csv`) when not given."""

    node: str
    samples: list[GpuMemorySample] = field(default_factory=list)
    problems: list[LogProblem] = field(default_factory=list)

    @property
    def gpu_indices(self) -> list[int]:
        return sorted({sample.gpu_index for sample in self.samples})

    def used_mib(self, gpu_index: int) -> list[float]:
        """Every reading of one GPU of this node, in file order."""
        return [sample.used_mib for sample in self.samples if sample.gpu_index == gpu_index]

    def gpu_samples(self, gpu_index: int) -> list[GpuMemorySample]:
        """Every sample of one GPU of this node, in file order."""
        return [sample for sample in self.samples if sample.gpu_index == gpu_index]


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


def _percent(cell: str) -> float | None:
    """A percentage from `97` or `97 %`; None for anything else."""
    match = _NUMBER_WITH_UNIT.match(cell.strip())
    return float(match["number"]) if match and match["unit"] in (None, "%") else None


def _timestamp(cell: str) -> datetime | None:
    for layout in ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S"):
        try:
            return datetime.strptime(cell.strip(), layout)
        except ValueError:
            continue
    return None


# A header cell: a query property (`memory.used`, `index`), with or without its unit (` [MiB]`).
_HEADER_CELL = re.compile(r"^[a-z_]+(?:\.[a-z_]+)*(?: \[[^\]]+\])?$")


def _is_header(cells: list[str]) -> bool:
    return all(_HEADER_CELL.match(cell) for cell in cells)


def parse_nvidia_smi(text: str, node: str = "") -> GpuMemoryLog:
    """Read an nvidia-smi CSV with or without units. The header names the columns (any query that
    has memory.used); a repeated header (an appended file, or one nvidia-smi call per sample) is
    read again. Without a header seed 002's columns (DEFAULT_COLUMNS) are assumed. Lines with
    `[N/A]`, cut lines and lines mixed with other output are reported, with the reason."""
    columns: tuple[str, ...] = DEFAULT_COLUMNS
    has_header = False
    samples: list[GpuMemorySample] = []
    problems: list[LogProblem] = []
    for number, line in log_lines(text):
        if not line.strip():
            continue
        cells = [cell.strip() for cell in line.split(",")]
        if _is_header(cells):
            columns, has_header = tuple(_column_name(cell) for cell in cells), True
            continue
        sample = _sample(cells, columns)
        if isinstance(sample, str):
            if not has_header and len(cells) != len(columns):
                sample = (f"{len(cells)} fields and no header line to name them; without one the columns "
                          f"are taken to be {', '.join(DEFAULT_COLUMNS)} (log with --format=csv, without "
                          "noheader, so the file names its columns)")
            problems.append(LogProblem(number, line, sample))
        else:
            samples.append(sample)
    return GpuMemoryLog(node=node, samples=samples, problems=problems)


def _sample(cells: list[str], columns: tuple[str, ...]) -> GpuMemorySample | str:
    """The sample of one line, or why there is none."""
    if "memory.used" not in columns:
        return f"the header names no memory.used column ({', '.join(columns)})"
    if len(cells) != len(columns):
        return f"{len(cells)} fields where the header names {len(columns)}"
    row = dict(zip(columns, cells))
    used = _mib(row["memory.used"])
    if used is None:
        return f"memory.used is {row['memory.used']!r}, not a number of MiB"
    index = 0  # a query without `index` is a single-GPU log
    if "index" in row:
        if not row["index"].isdigit():
            return f"index is {row['index']!r}, not a GPU number"
        index = int(row["index"])
    timestamp = None
    if "timestamp" in row:
        timestamp = _timestamp(row["timestamp"])
        if timestamp is None:
            return f"timestamp {row['timestamp']!r} is not YYYY/MM/DD HH:MM:SS.fff"  # a damaged line
    utilization = None  # also where the GPU does not report it ([N/A]: MIG slices, some older cards)
    if row.get("utilization.gpu", "[N/A]") not in _UNAVAILABLE:
        utilization = _percent(row["utilization.gpu"])
        if utilization is None:
            return f"utilization.gpu is {row['utilization.gpu']!r}, not a percentage"
    return GpuMemorySample(
        gpu_index=index,
        used_mib=used,
        total_mib=_mib(row["memory.total"]) if "memory.total" in row else None,
        timestamp=timestamp,
        name=row.get("name"),
        utilization_pct=utilization,
    )


def read_nvidia_smi(path: str | Path, node: str | None = None) -> GpuMemoryLog:
    """Parse one node's log file; the node name defaults to the one in the file name."""
    return parse_nvidia_smi(read_text(path), node=node if node is not None else node_from_filename(path))
