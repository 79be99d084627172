"""GPU memory (and utilisation) logs written by `nvidia-smi --query-gpu=… --format=csv[,nounits] -l N`,
one file per node."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

from workshop_lib.core.log_text import LogProblem, SkippedLines, log_lines, read_text

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


_PCI_BUS = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d$")
_WATTS = re.compile(r"^\d+(?:\.\d+)?\s*W$")
_BARE_NUMBER = re.compile(r"^\d+(?:\.\d+)?$")


def infer_columns(rows: list[list[str]]) -> tuple[str, ...] | None:
    """The query of header-less lines (`--format=csv,noheader[,nounits]`), read from the cells themselves;
    None when they do not show which column is memory.used.

    With units each cell says what it is: `%` utilization (gpu, then memory), `MiB` memory (used, total;
    or used, free, total), `W` power, a date the timestamp, a bus id, a GPU name; a bare number is the
    index before the memory columns and the temperature after them. Without units (nounits) memory is the
    adjacent pair (used, total) whose second value stays the same on every line and is the largest;
    a number before it is utilization.gpu, the ones after it temperature.gpu and power.draw."""
    widths = {len(row) for row in rows}
    if len(widths) != 1 or not rows:
        return None
    first = rows[0]
    if any(_mib(cell) is not None and cell.endswith(("MiB", "GiB")) for cell in first):
        return _columns_from_units(first)
    # nounits: the text cells say what they are (a date, a bus id, a GPU name); the numbers are read together
    text_columns = {i: _text_column(first[i]) for i in range(len(first)) if not _BARE_NUMBER.match(first[i])}
    # nvidia-smi's queries name the GPU by `index,name` (or `index,pci.bus_id`): a number right before those is it
    text_columns |= {i - 1: "index" for i, name in list(text_columns.items())
                     if name in ("name", "pci.bus_id") and i > 0 and i - 1 not in text_columns}
    numeric = [i for i in range(len(first)) if i not in text_columns]
    if not numeric or not all(_BARE_NUMBER.match(row[i]) for row in rows for i in numeric):
        return None
    names = _columns_from_numbers([[row[i] for i in numeric] for row in rows])
    if names is None:
        return None
    columns = dict(text_columns) | dict(zip(numeric, names))
    return tuple(columns[i] for i in range(len(first)))


def _text_column(cell: str) -> str:
    if _timestamp(cell) is not None:
        return "timestamp"
    return "pci.bus_id" if _PCI_BUS.match(cell) else "name"


def _columns_from_units(cells: list[str]) -> tuple[str, ...] | None:
    columns: list[str] = []
    memory = [i for i, cell in enumerate(cells) if cell.endswith(("MiB", "GiB"))]
    memory_names = {2: ("memory.used", "memory.total"), 3: ("memory.used", "memory.free", "memory.total")}
    if len(memory) not in memory_names:
        return None
    percents = iter(("utilization.gpu", "utilization.memory"))
    for i, cell in enumerate(cells):
        if i in memory:
            columns.append(memory_names[len(memory)][memory.index(i)])
        elif cell.endswith("%"):
            columns.append(next(percents, "other"))
        elif _WATTS.match(cell):
            columns.append("power.draw")
        elif _timestamp(cell) is not None:
            columns.append("timestamp")
        elif _PCI_BUS.match(cell):
            columns.append("pci.bus_id")
        elif cell.isdigit():
            columns.append("index" if i < memory[0] else "temperature.gpu")
        else:
            columns.append("name")
    return tuple(columns)


def _columns_from_numbers(rows: list[list[str]]) -> tuple[str, ...] | None:
    values = [[float(cell) for cell in row] for row in rows]
    width = len(values[0])
    largest = max(max(row) for row in values)
    total = [i for i in range(1, width)
             if len({row[i] for row in values}) == 1 and values[0][i] == largest
             and all(row[i - 1] <= row[i] for row in values)]
    if len(total) != 1 or largest < 1024:
        return None  # no single column that can only be memory.total
    first_column = [row[0] for row in values]
    if total[0] == 2:
        before: tuple[str, ...] = ("utilization.gpu",)
    elif total[0] == 3 and all(value.is_integer() and value < 64 for value in first_column):
        before = ("index", "utilization.gpu")  # --query-gpu=index,utilization.gpu,memory.used,...
    elif total[0] == 1:
        before = ()
    else:
        return None
    after = ("temperature.gpu", "power.draw", "utilization.memory")[:width - total[0] - 1]
    if len(after) != width - total[0] - 1:
        return None
    return (*before, "memory.used", "memory.total", *after)


def looks_like_nvidia_smi(first_line: str) -> bool:
    """True for a header line or a header-less line whose columns can be read from its cells."""
    cells = [cell.strip() for cell in first_line.split(",")]
    if "memory.used" in first_line:
        return True
    return len(cells) >= 2 and infer_columns([cells]) is not None and any(
        cell.endswith(("MiB", "GiB")) for cell in cells)


# The line `date` writes (`Fri Nov 27 10:00:00 UTC 2026`): monitors that loop `date; nvidia-smi ...` stamp
# their samples with it instead of a timestamp column.
_DATE_LINE = re.compile(r"^[A-Z][a-z]{2} [A-Z][a-z]{2} +\d{1,2} \d{2}:\d{2}:\d{2}(?: [A-Z]{2,5}| [+-]\d{2,4})? \d{4}$")


def date_line_time(line: str) -> datetime | None:
    """The time of a `date` line (its time zone dropped), or None for any other line."""
    if not _DATE_LINE.match(line.strip()):
        return None
    words = line.split()
    try:
        return datetime.strptime(" ".join(words[:4] + words[-1:]), "%a %b %d %H:%M:%S %Y")
    except ValueError:
        return None


def parse_nvidia_smi(text: str, node: str = "") -> GpuMemoryLog:
    """Read an nvidia-smi CSV with or without units. The header names the columns (any query that
    has memory.used); a repeated header (an appended file, or one nvidia-smi call per sample) is
    read again. Without a header seed 002's columns (DEFAULT_COLUMNS) are assumed when the lines fit
    them, else the columns are read from the cells (``infer_columns``). A `date` line between samples
    stamps the samples after it. Lines with `[N/A]`, cut lines and lines mixed with other output are
    reported, with the reason."""
    lines = [(number, line) for number, line in log_lines(text) if line.strip()]
    columns: tuple[str, ...] = _headerless_columns([(n, line) for n, line in lines if date_line_time(line) is None])
    has_header = False
    stamped: datetime | None = None
    samples: list[GpuMemorySample] = []
    problems: list[LogProblem] = []
    for number, line in lines:
        if (moment := date_line_time(line)) is not None:
            stamped = moment
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
            samples.append(sample if sample.timestamp or stamped is None else replace(sample, timestamp=stamped))
    return GpuMemoryLog(node=node, samples=samples, problems=problems)


def _headerless_columns(lines: list[tuple[int, str]]) -> tuple[str, ...]:
    """The columns of the lines before any header: seed 002's when they fit, else read from the cells."""
    rows = []
    for _, line in lines:
        cells = [cell.strip() for cell in line.split(",")]
        if _is_header(cells):
            break
        rows.append(cells)
    if not rows or all(isinstance(_sample(row, DEFAULT_COLUMNS), GpuMemorySample) for row in rows[:5]):
        return DEFAULT_COLUMNS
    return infer_columns(rows[:50]) or DEFAULT_COLUMNS


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
