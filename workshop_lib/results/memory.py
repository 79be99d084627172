"""Memory summary of a run: peak, average and mode per GPU of every node, and of the CPU process tree,
with each GPU's utilisation (nvidia-smi utilization.gpu) where the monitor recorded it.

What the seeds' analyze_memory.py printed, with two corrections:
- multi-node: each node's log is its own source, so GPU 0 of node1 and GPU 0 of node2 stay apart;
- the monitors start before the model is loaded and stop after it is gone, so idle samples pull the
  average down and often make the mode ~0 MiB. Besides the plain average (every sample) we give the
  *busy average*: the mean over samples at or above `busy_fraction` (default 50 %) of that device's
  own peak — the memory a GPU holds while it is training. Half the peak separates the two phases
  well: an idle GPU holds 0 MiB or only its CUDA context (~0.5 GiB), while a training process keeps
  its weights and optimizer state resident from the first step to the last.
The same busy samples give the utilisation *while training*: chosen by memory, not by utilisation, so
the figure is not raised by leaving out the slow moments of training itself.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from workshop_lib.core.errors import WorkshopError
from workshop_lib.core.log_text import LogProblem, read_text
from workshop_lib.core.run_directory import CPU_LOG_PATTERNS, GPU_LOG_PATTERNS
from workshop_lib.results.parse.nvidia_smi import (
    GpuMemoryLog,
    GpuMemorySample,
    date_line_time,
    infer_columns,
    looks_like_nvidia_smi,
    read_nvidia_smi,
)
from workshop_lib.results.parse.psrecord import CpuMemoryLog, read_psrecord

DEFAULT_BUSY_FRACTION = 0.5


class MemoryLogError(WorkshopError):
    """A path given for a memory summary is missing or holds no memory log (or nothing readable:
    `problems` then holds each log's unreadable lines, by file)."""

    def __init__(self, message: str, problems: dict[str, list[LogProblem]] | None = None):
        super().__init__(message)
        self.problems = problems or {}


@dataclass(frozen=True)
class MemoryStats:
    """Statistics of one device's samples, in MiB."""

    peak: float
    average: float  # over every sample, idle ones included (the seeds' "Avg")
    modes: tuple[float, ...]  # most frequent whole-MiB values; several when tied
    busy_average: float | None  # over samples >= busy_fraction × peak; None when peak is 0
    samples: int
    busy_samples: int
    busy_fraction: float

    @property
    def mode(self) -> float:
        """The most frequent value (the smallest one when several tie)."""
        return self.modes[0]


@dataclass(frozen=True)
class UtilizationStats:
    """utilization.gpu of one GPU, in %: the share of time a kernel ran on it."""

    peak: float
    average: float  # over every sample, idle ones included
    busy_average: float | None  # over the samples whose memory was busy (MemoryStats): while training
    samples: int


@dataclass(frozen=True)
class GpuMemorySummary:
    label: str  # the log's file stem, as the seeds print it: [gpu_memory_node1 - GPU 0]
    node: str
    gpu_index: int
    stats: MemoryStats
    source: str
    utilization: UtilizationStats | None = None  # None where the monitor did not record utilization.gpu


@dataclass(frozen=True)
class CpuMemorySummary:
    label: str
    stats: MemoryStats
    source: str


@dataclass(frozen=True)
class MemoryReport:
    gpus: list[GpuMemorySummary] = field(default_factory=list)
    cpus: list[CpuMemorySummary] = field(default_factory=list)
    skipped_lines: int = 0
    busy_fraction: float = DEFAULT_BUSY_FRACTION
    problems: dict[str, list[LogProblem]] = field(default_factory=dict)  # unreadable lines, by log file

    def gpu(self, gpu_index: int = 0, node: str | None = None) -> GpuMemorySummary | None:
        """One GPU's summary: GPU `gpu_index` of `node`, or of the first node when no node is named."""
        for summary in self.gpus:
            if summary.gpu_index == gpu_index and (node is None or summary.node == node):
                return summary
        return None


def memory_stats(values: list[float], busy_fraction: float = DEFAULT_BUSY_FRACTION) -> MemoryStats:
    """Peak, average, mode(s) and busy average of a series of readings in MiB."""
    if not values:
        raise ValueError("memory_stats needs at least one sample")
    peak = max(values)
    counts = Counter(round(value) for value in values)
    top = max(counts.values())
    modes = tuple(sorted(float(value) for value, count in counts.items() if count == top))
    busy = [value for value in values if value >= busy_fraction * peak] if peak > 0 else []
    return MemoryStats(
        peak=peak,
        average=sum(values) / len(values),
        modes=modes,
        busy_average=sum(busy) / len(busy) if busy else None,
        samples=len(values),
        busy_samples=len(busy),
        busy_fraction=busy_fraction,
    )


def utilization_stats(samples: list[GpuMemorySample], memory: MemoryStats) -> UtilizationStats | None:
    """Peak, average and busy average of one GPU's utilization.gpu; None when no sample has it.
    A sample is busy when its memory is at or above memory.busy_fraction × the memory peak."""
    readings = [(sample.used_mib, sample.utilization_pct) for sample in samples if sample.utilization_pct is not None]
    if not readings:
        return None
    values = [percent for _, percent in readings]
    busy = [percent for used, percent in readings if memory.peak > 0 and used >= memory.busy_fraction * memory.peak]
    return UtilizationStats(peak=max(values), average=sum(values) / len(values),
                            busy_average=sum(busy) / len(busy) if busy else None, samples=len(values))


def summarize_gpu_logs(logs: list[tuple[str, GpuMemoryLog]], busy_fraction: float = DEFAULT_BUSY_FRACTION
                       ) -> list[GpuMemorySummary]:
    """One summary per (log file, GPU index): a file is one node."""
    summaries = []
    for source, log in logs:
        label = Path(source).stem
        for index in log.gpu_indices:
            samples = log.gpu_samples(index)
            stats = memory_stats([sample.used_mib for sample in samples], busy_fraction)
            summaries.append(GpuMemorySummary(label=label, node=log.node, gpu_index=index, stats=stats, source=source,
                                              utilization=utilization_stats(samples, stats)))
    return summaries


def find_memory_logs(path: str | Path) -> tuple[list[Path], list[Path]]:
    """The GPU and CPU memory logs a path stands for: a run directory's monitors, or the file itself."""
    path = Path(path)
    if not path.exists():
        raise MemoryLogError(
            f"{path}: no such file or directory. Give a run directory (runs/<experiment id>/) "
            "or the memory logs themselves (nvidia-smi CSV, psrecord log)."
        )
    if path.is_dir():
        gpu = sorted({found for pattern in GPU_LOG_PATTERNS for found in path.glob(pattern) if found.is_file()})
        cpu = sorted({found for pattern in CPU_LOG_PATTERNS for found in path.glob(pattern) if found.is_file()})
        if not gpu and not cpu:
            raise MemoryLogError(
                f"{path}: no memory log here (looked for gpu_memory*.csv and cpu_memory*.txt). "
                "Has the job started? Its monitors write these files into the run directory."
            )
        return gpu, cpu
    kind = sniff_log_kind(path)
    return ([path], []) if kind == "gpu" else ([], [path])


def sniff_log_kind(path: Path) -> str:
    """'gpu' for an nvidia-smi CSV, 'cpu' for a psrecord log, from the first line or the file name."""
    # `date` lines between nvidia-smi samples (a `date; nvidia-smi ...` loop) say nothing about the kind
    lines = [line.strip() for line in read_text(path).splitlines() if line.strip() and date_line_time(line) is None]
    first = lines[0] if lines else ""
    if "memory.used" in first or looks_like_nvidia_smi(first):
        return "gpu"
    if lines and infer_columns([[cell.strip() for cell in line.split(",")] for line in lines[:50]]):
        return "gpu"  # a header-less `--format=csv,noheader,nounits` snapshot
    if first.startswith("# Elapsed time") or first.startswith("elapsed_time,"):
        return "cpu"
    name = path.name.lower()
    if "gpu" in name and name.endswith(".csv"):
        return "gpu"
    if "cpu" in name:
        return "cpu"
    raise MemoryLogError(
        f"{path}: not a memory log this command can read (expected an nvidia-smi CSV with a "
        "memory.used column or header-less lines with memory.used and memory.total, or a psrecord --log file)."
    )


def memory_summary(paths: list[str | Path], busy_fraction: float = DEFAULT_BUSY_FRACTION) -> MemoryReport:
    """Summarize every memory log found under the given run directories or files."""
    if not 0 <= busy_fraction < 1:
        raise MemoryLogError(f"busy fraction {busy_fraction} is outside [0, 1): give e.g. 0.5 for half of the peak.")
    gpu_logs: list[tuple[str, GpuMemoryLog]] = []
    cpu_logs: list[tuple[str, CpuMemoryLog]] = []
    for path in paths:
        gpu_files, cpu_files = find_memory_logs(path)
        gpu_logs += [(str(file), read_nvidia_smi(file)) for file in gpu_files]
        cpu_logs += [(str(file), read_psrecord(file)) for file in cpu_files]
    skipped = sum(log.skipped_lines for _, log in gpu_logs) + sum(log.skipped_lines for _, log in cpu_logs)
    problems = {source: log.problems for source, log in gpu_logs + cpu_logs if log.problems}
    if not any(log.samples for _, log in gpu_logs) and not any(log.samples for _, log in cpu_logs):
        names = ", ".join(source for source, _ in gpu_logs + cpu_logs)
        first = next(((source, log.problems[0]) for source, log in gpu_logs + cpu_logs if log.problems), None)
        where = f" First unreadable line: {first[1].format(first[0])}." if first else ""
        raise MemoryLogError(f"no readable sample in {names}: the logs are empty or damaged "
                             f"({skipped} lines could not be read).{where}", problems)
    cpus = [CpuMemorySummary(label=Path(source).stem, stats=memory_stats(log.real_mib, busy_fraction), source=source)
            for source, log in cpu_logs if log.samples]
    return MemoryReport(gpus=summarize_gpu_logs(gpu_logs, busy_fraction), cpus=cpus,
                        skipped_lines=skipped, busy_fraction=busy_fraction, problems=problems)


def _mib(value: float) -> str:
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.2f}"


def _busy(stats: MemoryStats) -> str:
    if stats.busy_average is None:
        return "n/a (never above 0 MiB)"
    return f"{stats.busy_average:.2f} MiB ({stats.busy_samples} of {stats.samples} samples)"


def _utilization(stats: UtilizationStats) -> str:
    busy = "n/a" if stats.busy_average is None else f"{stats.busy_average:.1f} %"
    return f"Peak = {stats.peak:.0f} %, Avg = {stats.average:.1f} %, Busy avg = {busy}"


def format_memory_report(report: MemoryReport, show_gpu: bool = True, show_cpu: bool = True) -> str:
    """The report in the seeds' form, with the busy average added and a note saying which is which."""
    lines: list[str] = []
    if show_gpu and report.gpus:
        lines.append("GPU Memory Usage")
        for gpu in report.gpus:
            stats = gpu.stats
            lines.append(
                f"[{gpu.label} - GPU {gpu.gpu_index}] Peak = {_mib(stats.peak)} MiB, Avg = {stats.average:.2f} MiB, "
                f"Mode = {_mib(stats.mode)} MiB, Busy avg = {_busy(stats)}"
            )
            if gpu.utilization:
                lines.append(f"    Utilization: {_utilization(gpu.utilization)}")
    if show_cpu and report.cpus:
        for cpu in report.cpus:
            stats = cpu.stats
            lines += [
                "" if lines else None,
                f"CPU Memory Usage [{cpu.label}]",
                f"   Peak =    {_mib(stats.peak)} MiB",
                f"   Average = {stats.average:.2f} MiB",
                f"   Mode =    {', '.join(_mib(mode) for mode in stats.modes)} MiB",
                f"   Busy average = {_busy(stats)}",
            ]
    lines = [line for line in lines if line is not None]
    percent = f"{report.busy_fraction:.0%}"
    lines += [
        "",
        "Avg / Average and Mode count every sample, idle ones before and after training included.",
        f"Busy avg counts only samples at or above {percent} of that device's own peak (training running).",
    ]
    if any(gpu.utilization for gpu in report.gpus) and show_gpu:
        lines.append("Utilization is nvidia-smi's utilization.gpu: the share of time a kernel ran; its busy avg "
                     "counts the same busy samples (chosen by memory).")
    if report.skipped_lines:
        lines.append(f"{report.skipped_lines} unreadable log lines were skipped.")
    return "\n".join(lines)
