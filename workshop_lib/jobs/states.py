"""The states a job or a run can be in, named once, and `JobInfo`, one look at a job.

SLURM's own state names (what squeue, sacct and scontrol print; the local executor uses the same words) and
the workshop's (a job the scheduler forgot, a run never submitted, a record that cannot be read...). Every other
module compares with these names, never with a typed string: a test (tests/test_state_names.py) keeps it so.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from workshop_lib.core.durations import format_duration

# ---- SLURM's states (JOB_STATE_CODES in squeue's man page) --------------------------------------
PENDING = "PENDING"
CONFIGURING = "CONFIGURING"
RUNNING = "RUNNING"
COMPLETING = "COMPLETING"
SUSPENDED = "SUSPENDED"
REQUEUED = "REQUEUED"
RESIZING = "RESIZING"
STAGE_OUT = "STAGE_OUT"
SIGNALING = "SIGNALING"
REQUEUE_HOLD = "REQUEUE_HOLD"
REQUEUE_FED = "REQUEUE_FED"
RESV_DEL_HOLD = "RESV_DEL_HOLD"
STOPPED = "STOPPED"
COMPLETED = "COMPLETED"
FAILED = "FAILED"
CANCELLED = "CANCELLED"
TIMEOUT = "TIMEOUT"
OUT_OF_MEMORY = "OUT_OF_MEMORY"
NODE_FAIL = "NODE_FAIL"
PREEMPTED = "PREEMPTED"
BOOT_FAIL = "BOOT_FAIL"
DEADLINE = "DEADLINE"
REVOKED = "REVOKED"
SPECIAL_EXIT = "SPECIAL_EXIT"
HELD = "JobHeldUser"  # not a state: squeue's reason for a PENDING job submitted with --hold

# ---- the workshop's own ----------------------------------------------------------------------------
# A job the scheduler no longer remembers (past MinJobAge, a wiped state, an id now used by another job)
# and that accounting does not know either: not active, not ended as far as the scheduler can say.
# The job code settles it from the job's own log (its footer), never from its absence.
FORGOTTEN = "FORGOTTEN"
# A forgotten job whose log has no footer: how it ended is unknown, but it never runs again.
LOST = "LOST"
UNKNOWN = "UNKNOWN"  # the scheduler could not be asked (or said nothing readable): the job may still run
NOT_SUBMITTED = "NOT SUBMITTED"  # a run folder without a job
DAMAGED = "DAMAGED"  # a run whose job.json cannot be read
# A run's row in a chapter's table when the run has no recorded state:
MISSING = "MISSING"  # no run directory: never submitted
INCOMPLETE = "INCOMPLETE"  # a run directory without a final metrics record

# States after which a job never runs again.
FINAL_STATES = frozenset({
    COMPLETED, FAILED, CANCELLED, TIMEOUT, OUT_OF_MEMORY, NODE_FAIL, PREEMPTED,
    BOOT_FAIL, DEADLINE, REVOKED, SPECIAL_EXIT, LOST,
})
ACTIVE_STATES = frozenset({
    PENDING, CONFIGURING, RUNNING, COMPLETING, SUSPENDED, REQUEUED, RESIZING, STAGE_OUT,
    SIGNALING, REQUEUE_HOLD, REQUEUE_FED, RESV_DEL_HOLD, STOPPED,
})


@dataclass(frozen=True)
class JobInfo:
    """One look at a job: its state, how it ended, where its output is."""

    job_id: str
    state: str
    exit_code: int | None = None
    signal: int | None = None
    elapsed_s: float | None = None
    reason: str | None = None
    stdout_path: Path | None = None
    name: str | None = None
    node_list: str | None = None
    tasks: tuple["JobInfo", ...] = ()  # array tasks, if this is a job array
    time_limit_s: float | None = None  # --time as the scheduler holds it
    workdir: Path | None = None  # the job's working directory, where the scheduler says (squeue, the local executor)

    @property
    def finished(self) -> bool:
        return self.state in FINAL_STATES

    def with_stdout(self, path: Path | None) -> "JobInfo":
        return replace(self, stdout_path=path)

    def with_limit(self, seconds: float | None) -> "JobInfo":
        return replace(self, time_limit_s=seconds)

    def describe(self) -> str:
        parts = [f"job {self.job_id}", self.state]
        if self.exit_code is not None:
            parts.append(f"exit {self.exit_code}" + (f" (signal {self.signal})" if self.signal else ""))
        if self.elapsed_s is not None:
            parts.append(f"{format_duration(self.elapsed_s)} elapsed")
        if self.reason and self.reason not in ("None", "NonZeroExitCode"):
            parts.append(f"reason {self.reason}")
        if self.stdout_path:
            parts.append(f"log {self.stdout_path}")
        return ", ".join(parts)
