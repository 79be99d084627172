"""Why a job did not complete, in a few lines: state, exit code or signal, time used against the limit,
the log lines that matter (the program's traceback or last error, ranked above a launcher's report that its
child failed; never the footer) and what to change.

The notebook, `workshop status` and `workshop submit --wait` all show `explain(...)`.
"""

from __future__ import annotations

import re
import signal as signals
from dataclasses import dataclass
from pathlib import Path

from workshop_lib.core.durations import format_duration
from workshop_lib.core.log_text import LogExcerpt, read_tail, strip_launcher_prefix
from workshop_lib.jobs.states import (
    CANCELLED,
    FAILED,
    LOST,
    NODE_FAIL,
    OUT_OF_MEMORY,
    PREEMPTED,
    TIMEOUT,
    JobInfo,
)

_TRACEBACK = "Traceback (most recent call last):"
_ERROR_LINE = re.compile(
    r"(\b\w*(Error|Exception)\b\s*:|\berror\b|\bERROR\b|\bKilled\b|oom[-_]kill|[Oo]ut of memory|Exceeded job memory"
    r"|CANCELLED AT|DUE TO TIME LIMIT|Segmentation fault|Aborted|command not found|No such file or directory)")
# Exceptions a launcher raises only to report that its child failed or vanished: the child's own output
# says why (torchrun's ChildFailedError; psrecord's NoSuchProcess when the process it follows never
# started; a launcher's CalledProcessError; torchrun's SignalException when SLURM stops the job).
_LAUNCHER_EXCEPTION = re.compile(r"\b(ChildFailedError|NoSuchProcess|CalledProcessError|SignalException)\b")
# Launchers' one-line reports of a child's exit (torchrun's elastic agent, srun's task summary).
_LAUNCHER_LINE = re.compile(r"torch/distributed/elastic/|^srun: error: .*Exited with exit code|"
                            r"exits with return code = -?\d+|^\[[\d\-: ,]+\] \[(ERROR|INFO)\] \[launch\.py")
# SLURM's words for a job killed over --mem: cgroup's oom-kill, or jobacct_gather's OverMemoryKill.
_MEMORY_KILL = re.compile(r"oom[-_]kill event|Exceeded job memory limit|exceeded memory limit")
# Lines the job template prints itself (header, `workshop memory`'s summary, footer): never the answer to
# "what went wrong".
_OWN_LINES = re.compile(
    r"^\s*(=+$|Job finished|End time|Total time|Exit status|Start time|Job \S+ \(|(GPU|CPU) Memory Usage"
    r"|\[.* - GPU \d+\] Peak =|(Peak|Average|Mode|Busy average) =|Avg / Average and Mode|Busy avg counts"
    r"|\d+ unreadable log lines|Memory summary failed|workshop: error: .*: no memory log here)")

MEMORY_REASON = "over its --mem (SLURM killed it)"
HINTS = {
    FAILED: "the job's commands exited with an error: the lines above say which. Fix the cause and re-run the "
              "cell (a failed run is submitted again; completed ones are reused).",
    TIMEOUT: "it ran out of time: raise the limit (#SBATCH --time in the run's job.sbatch, which the next "
               "submission of the run then submits; or the profile's scheduler.time_limits for this chapter) or "
               "make the run shorter (fewer steps or samples).",
    OUT_OF_MEMORY: "it used more host memory than --mem allows: lower the per-device batch, offload less to "
                     "the CPU, or raise --mem (the experiment's memory).",
    NODE_FAIL: "a node failed under the job (not the job's fault): re-run the cell to submit it again; tell "
                 "the admins if it repeats on the same node.",
    CANCELLED: "it was cancelled (scancel by you or an admin, or a reservation ended): re-run the cell to "
                 "submit it again.",
    LOST: "the scheduler no longer knows the job and its log has no footer, so it never finished its script: "
            "re-run the cell to submit it again (this attempt's files are kept under attempts/).",
    PREEMPTED: "a higher-priority job took its nodes: re-run the cell to submit it again.",
}


@dataclass(frozen=True)
class Explanation:
    """What a reader needs to know about a job that did not complete."""

    job_id: str
    state: str
    exit_code: int | None
    signal: int | None
    elapsed_s: float | None
    time_limit_s: float | None
    log_path: Path | None
    log_lines: tuple[tuple[int, str], ...]  # (line number, text)
    hint: str
    reason: str | None = None
    earlier_attempts: tuple[str, ...] = ()  # e.g. "NODE_FAIL on node1" for a requeued job

    def headline(self) -> str:
        """'job 12 TIMEOUT: signal 15 (SIGTERM), after 00:01:03 of its 00:01:00 limit'"""
        parts = []
        if self.signal:
            parts.append(f"signal {self.signal} ({_signal_name(self.signal)})")
        elif self.exit_code is not None:
            parts.append(f"exit code {self.exit_code}")
        if self.elapsed_s is not None:
            limit = f" of its {format_duration(self.time_limit_s)} limit" if self.time_limit_s else ""
            parts.append(f"after {format_duration(self.elapsed_s)}{limit}")
        if self.reason and self.reason not in ("None", "NonZeroExitCode"):
            parts.append(f"reason: {self.reason}")
        return f"job {self.job_id} {self.state}" + (": " + ", ".join(parts) if parts else "")

    def text(self) -> str:
        lines = [self.headline()]
        for attempt in self.earlier_attempts:
            lines.append(f"earlier attempt: {attempt} (SLURM requeued the job; its log holds both attempts)")
        if self.log_lines:
            lines.append(f"log {self.log_path}:")
            lines.extend(f"  {number:>5}: {text}" for number, text in self.log_lines)
        elif self.log_path is not None:
            lines.append(f"log {self.log_path}: (empty or missing)")
        lines.append(f"Hint: {self.hint}")
        return "\n".join(lines)


def explain(info: JobInfo, log_path: Path | None = None, predicted: str | None = None,
            earlier_attempts: tuple[str, ...] = ()) -> Explanation:
    """The explanation of a job that ended in `info.state` (not COMPLETED). `predicted`: what the memory
    estimator expected, added to an out-of-memory hint."""
    path = log_path or info.stdout_path
    tail = read_tail(path)  # why it ended is at the end: a log of any size is read in seconds
    text = tail.text()
    hint = HINTS.get(info.state, f"the job ended {info.state}: the lines above tell why.")
    if info.state == TIMEOUT and info.time_limit_s:
        hint = f"it used all of its {format_duration(info.time_limit_s)}: " + hint.split(": ", 1)[1]
    reason = info.reason
    if info.state != OUT_OF_MEMORY and _MEMORY_KILL.search(text):
        # Without cgroups SLURM records such a job as FAILED (signal 9), with a reason of its own launch
        # (JobLaunchFailure) that misleads; its log says why.
        hint = "the log shows SLURM killed it for going over --mem: " + HINTS[OUT_OF_MEMORY].split(": ", 1)[1]
        reason = MEMORY_REASON
    elif info.state == OUT_OF_MEMORY:
        reason = MEMORY_REASON
    if "--mem" in hint and predicted:
        hint += f" The estimator predicted {predicted}."
    elif info.state == FAILED and info.signal == signals.SIGKILL.value and predicted:
        hint += f" SIGKILL often means memory ran out; the estimator predicted {predicted}."
    return Explanation(job_id=info.job_id, state=info.state, exit_code=info.exit_code, signal=info.signal,
                       elapsed_s=info.elapsed_s, time_limit_s=info.time_limit_s, log_path=path,
                       log_lines=tuple(important_lines(tail)), hint=hint, reason=reason,
                       earlier_attempts=earlier_attempts)


def important_lines(text: str | LogExcerpt, most: int = 8) -> list[tuple[int, str]]:
    """The lines that say what went wrong, the cause first in rank: a program's Python traceback (its head,
    last frames and the exception); else the last error lines a program printed (argparse's `error:`, bash's
    `No such file or directory`, SLURM's kill notices); only then a launcher's traceback, which just reports
    that its child failed (torchrun's ChildFailedError, psrecord's NoSuchProcess); else the last lines
    before the job's own footer."""
    numbered = list(text.lines) if isinstance(text, LogExcerpt) else list(enumerate(text.splitlines(), start=1))
    lines, numbers = [line for _, line in numbered], [number for number, _ in numbered]
    bare = [strip_launcher_prefix(line) for line in lines]  # launchers' prefixes (NeMo-Run, srun -l, …)
    tracebacks = _tracebacks(bare)
    programs = [(start, end) for start, end in tracebacks if not _is_launcher_exception(bare, end)]
    if programs:
        return _traceback(lines, numbers, bare, *programs[0], most)
    inside = {index for start, end in tracebacks for index in range(start, end + 1)}
    errors = [(numbers[index], lines[index]) for index, line in enumerate(bare)
              if index not in inside and _ERROR_LINE.search(line) and not _OWN_LINES.match(line)
              and not _LAUNCHER_LINE.search(line)]
    if errors:
        return errors[-most:]
    if tracebacks:
        return _traceback(lines, numbers, bare, *tracebacks[0], most)
    body = [(numbers[index], lines[index]) for index, line in enumerate(bare)
            if line.strip() and not _OWN_LINES.match(line)]
    return body[-min(most, 5):]


def _tracebacks(bare: list[str]) -> list[tuple[int, int]]:
    """(first line, exception line) of every Python traceback, chained ones ("During handling …") as one."""
    found, index = [], 0
    while index < len(bare):
        if not bare[index].startswith(_TRACEBACK):
            index += 1
            continue
        end = index + 1
        while end < len(bare) and (bare[end].startswith((" ", "\t")) or not bare[end].strip()
                                   or bare[end].startswith(("During handling", "The above exception", _TRACEBACK))):
            end += 1
        end = min(end, len(bare) - 1)
        found.append((index, end))
        index = end + 1
    return found


def _is_launcher_exception(bare: list[str], line: int) -> bool:
    return bool(_LAUNCHER_EXCEPTION.search(bare[line]))


def _traceback(lines: list[str], numbers: list[int], bare: list[str], start: int, last: int,
               most: int) -> list[tuple[int, str]]:
    # The head, the last two frames (file and code line) and the exception line.
    frames = [index for index in range(start + 1, last) if bare[index].lstrip().startswith("File ")]
    chosen = [start] + [index for frame in frames[-2:] for index in (frame, frame + 1) if index < last] + [last]
    picked = sorted(set(chosen))[:most]
    return [(numbers[index], lines[index]) for index in picked]


def _signal_name(number: int) -> str:
    try:
        return signals.Signals(number).name
    except ValueError:
        return "unknown signal"
