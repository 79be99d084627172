"""A progress line for waiting on jobs: updates in place in a notebook or a terminal, plain lines in logs."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Sequence

from .slurm_output import JobInfo, format_duration

BAR_WIDTH = 30


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and shell.__class__.__name__ == "ZMQInteractiveShell"


def summary_line(infos: Sequence[JobInfo], elapsed_s: float) -> str:
    """'[#######.....] 3/5 ended (3 COMPLETED) | 1 RUNNING, 1 PENDING | 00:42'"""
    ended = [i for i in infos if i.finished]
    filled = int(BAR_WIDTH * len(ended) / len(infos)) if infos else BAR_WIDTH
    bar = "#" * filled + "." * (BAR_WIDTH - filled)
    end_states = Counter(i.state for i in ended)
    active = Counter(i.state for i in infos if not i.finished)
    ended_text = ", ".join(f"{n} {s}" for s, n in sorted(end_states.items()))
    active_text = ", ".join(f"{n} {s}" for s, n in sorted(active.items())) or "none active"
    return (f"[{bar}] {len(ended)}/{len(infos)} ended" + (f" ({ended_text})" if ended_text else "")
            + f" | {active_text} | {format_duration(elapsed_s)}")


class JobProgress:
    """Shows `summary_line` as jobs change: in place where possible, otherwise one line per change."""

    def __init__(self, total: int, stream=None):
        self.total = total
        self.stream = stream or sys.stderr
        self.notebook = _in_notebook()
        self.handle = None
        self.last_counts: Counter | None = None
        if self.notebook:
            from IPython.display import display

            self.handle = display(f"waiting for {total} job(s)...", display_id=True)

    def update(self, infos: Sequence[JobInfo], elapsed_s: float) -> None:
        line = summary_line(infos, elapsed_s)
        if self.handle is not None:
            self.handle.update(line)
        elif self.stream.isatty():
            self.stream.write("\r" + line)
            self.stream.flush()
        else:
            counts = Counter(i.state for i in infos)
            if counts != self.last_counts:  # a log gets a line only when something changed
                self.stream.write(line + "\n")
                self.stream.flush()
            self.last_counts = counts

    def close(self, infos: Sequence[JobInfo], elapsed_s: float, timed_out: bool) -> None:
        line = summary_line(infos, elapsed_s) + (" -- timed out waiting" if timed_out else "")
        if self.handle is not None:
            self.handle.update(line)
        elif self.stream.isatty():
            self.stream.write("\r" + line + "\n")
            self.stream.flush()
        elif timed_out or Counter(i.state for i in infos) != self.last_counts:
            self.stream.write(line + "\n")  # otherwise update() already printed this very line
            self.stream.flush()
