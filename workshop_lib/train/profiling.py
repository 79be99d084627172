"""Where a training step's time goes: the PyTorch profiler over a few optimizer steps.

Set ``WORKSHOP_PROFILE_STEPS=FIRST:LAST`` (optimizer steps, counted from 0) for a Hugging Face
Trainer run and rank 0 writes ``profile.txt`` into its output folder: the operators that took the
most GPU time and the most CPU time, and how busy the GPU was over those steps. A GPU that is busy
far less than the steps' wall time is waiting on the CPU (Python, kernel launches, synchronisations).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from transformers import TrainerCallback

from workshop_lib.core.errors import WorkshopError

ENVIRONMENT_VARIABLE = "WORKSHOP_PROFILE_STEPS"


def requested_steps(environ=os.environ) -> tuple[int, int] | None:
    """``(first, last)`` from the environment, or None when profiling is off."""
    text = environ.get(ENVIRONMENT_VARIABLE, "").strip()
    if not text:
        return None
    try:
        first, last = (int(part) for part in text.split(":"))
    except ValueError:
        raise WorkshopError(f"{ENVIRONMENT_VARIABLE}={text!r}: give two optimizer steps as FIRST:LAST, "
                            "e.g. 10:14") from None
    if first < 0 or last < first:
        raise WorkshopError(f"{ENVIRONMENT_VARIABLE}={text!r}: need 0 <= FIRST <= LAST")
    return first, last


class ProfilerCallback(TrainerCallback):
    """Profiles optimizer steps FIRST..LAST and writes the report when LAST ends."""

    def __init__(self, steps: tuple[int, int], report: Path, device_kind: str):
        self.first, self.last = steps
        self.report = report
        self.cuda = device_kind == "cuda"
        self.profiler = None
        self.started = None
        self.wall = None

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.first and self.profiler is None:
            import torch

            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.cuda:
                activities.append(torch.profiler.ProfilerActivity.CUDA)
                torch.cuda.synchronize()
            self.profiler = torch.profiler.profile(activities=activities)
            self.profiler.__enter__()
            self.started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        # global_step has already been increased for the step that just ended
        if self.profiler is None or state.global_step - 1 != self.last:
            return
        import torch

        if self.cuda:
            torch.cuda.synchronize()
        self.wall = time.perf_counter() - self.started
        self.profiler.__exit__(None, None, None)

    def on_train_end(self, args, state, control, **kwargs):
        # Written after training: building the tables takes seconds, which the step times must not see.
        if self.profiler is not None and self.wall is not None:
            self.report.write_text(profile_report(self.profiler, self.wall, self.last - self.first + 1, self.cuda))
            self.profiler = None


def profile_report(profiler, wall_s: float, steps: int, cuda: bool) -> str:
    averages = profiler.key_averages()
    lines = [f"profiled optimizer steps: {steps}, wall {wall_s * 1000:.1f} ms "
             f"({wall_s * 1000 / steps:.1f} ms per step)"]
    if cuda:
        from torch.autograd import DeviceType

        # Kernels only: operator rows and annotations repeat the time of the kernels they launched.
        kernel_us = sum(e.device_time_total for e in profiler.events() if e.device_type == DeviceType.CUDA)
        lines.append(f"GPU busy (sum of kernel time): {kernel_us / 1000:.1f} ms = "
                     f"{100 * kernel_us / 1e6 / wall_s:.0f} % of the wall time")
        lines += ["", "top operators by GPU time:",
                  averages.table(sort_by="self_device_time_total", row_limit=30, max_name_column_width=60)]
    lines += ["", "top operators by CPU time (self):",
              averages.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60)]
    return "\n".join(lines) + "\n"
