"""`nvidia-smi dmon -s u` (a toy format for the walk-through): per-GPU SM utilisation samples, and its reader."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from workshop_lib.core.log_text import LogProblem, read_text


@dataclass(frozen=True)
class DmonLog:
    """SM utilisation (%) of each GPU, sample by sample; lines that could not be read, with why."""

    sm_by_gpu: dict[int, list[float]]
    problems: list[LogProblem]


def parse_dmon(text: str) -> DmonLog:
    """dmon prints `# gpu sm mem enc dec` and `# Idx % % % %` headers, then `<gpu> <sm> ...` rows."""
    columns: list[str] = []
    samples: dict[int, list[float]] = {}
    problems: list[LogProblem] = []
    for number, line in enumerate(text.splitlines(), start=1):
        words = line.replace(",", " ").split()
        if not words:
            continue
        if words[0] == "#":
            columns = columns or words[1:]  # the first header names the columns; the second gives units
            continue
        try:
            row = dict(zip(columns, words, strict=True))
            samples.setdefault(int(row["gpu"]), []).append(float(row["sm"]))
        except (KeyError, ValueError) as error:  # "-" for an unsupported counter, a cut line, no header yet
            problems.append(LogProblem(number, line, f"not a dmon row of {' '.join(columns) or '(no header)'}: "
                                                     f"{error}"))
    return DmonLog(samples, problems)


def read_dmon(reading, paths: list[Path]) -> None:
    """The reader (results/read.py READERS): GPU 0's peak SM utilisation."""
    log = parse_dmon(read_text(paths[0]))
    reading.note(paths[0], log.problems)
    if log.sm_by_gpu.get(0):
        reading.values["gpu0_sm_peak_pct"] = max(log.sm_by_gpu[0])
