"""Where a job's wall time goes: named phases, printed as one line at the end of the log."""

from __future__ import annotations

import time
from contextlib import contextmanager


def process_age_s() -> float | None:
    """Seconds since this process started (interpreter start-up and imports included)."""
    try:
        import psutil

        return time.time() - psutil.Process().create_time()
    except Exception:  # psutil missing or /proc unreadable: the line just lacks this phase
        return None


class PhaseClock:
    """Wall time per phase, in order; ``line()`` gives ``== phases: imports 4.1 s, data 0.9 s, ...``."""

    def __init__(self):
        self.phases: dict[str, float] = {}
        started = process_age_s()
        if started is not None:
            self.phases["start+imports"] = started

    @contextmanager
    def phase(self, name: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - started

    def add(self, name: str, seconds: float) -> None:
        self.phases[name] = self.phases.get(name, 0.0) + seconds

    def line(self) -> str:
        return "== phases: " + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.phases.items())
