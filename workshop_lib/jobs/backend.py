"""What the job code asks of a scheduler, and how a backend is chosen.

`cluster.py` (Job, submit, wait_for) talks only to a `Backend`; the two implementations live in
`slurm_backend.py` (sbatch, squeue, sacct, scontrol, scancel) and `local_executor.py` (bash on this
machine). Neither backend imports the job code, and the job code imports a backend's module only
through `get_backend` (submitit's core / slurm / local split).
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence

from workshop_lib.core.errors import ClusterError
from workshop_lib.jobs.states import JobInfo

BACKENDS = {"slurm": "workshop_lib.jobs.slurm", "local": "workshop_lib.jobs.local"}
# How far the submitter's clock may run ahead of the scheduler's (a login node's against the controller's) for a
# job to count as submitted since a moment the submitter noted (`Backend.jobs_in`).
CLOCK_SKEW_S = 60.0


@dataclass(frozen=True)
class Submission:
    """What a backend answers to a submission."""

    job_id: str
    stdout_path: Path | None
    name: str | None


@dataclass(frozen=True)
class PollPolicy:
    """How often a waiter asks: `first` seconds, growing by `factor` up to `longest`."""

    first: float
    longest: float
    factor: float = 1.5

    def intervals(self):
        interval = self.first
        while True:
            yield interval
            interval = min(self.longest, interval * self.factor)


class Backend(Protocol):
    name: str

    def submit(self, script: Path, workdir: Path, sbatch_args: Sequence[str] = (), hold: bool = False) -> Submission:
        """Submit; with `hold`, the job waits until `release` (the run folder is made ready meanwhile)."""

    def query(self, job_ids: Sequence[str]) -> dict[str, JobInfo]:
        """The state of every job in one scheduler call; states.FORGOTTEN for ids it does not know. Raises
        ClusterError when the scheduler cannot be asked (it is then unknown whether a job still runs)."""

    def release(self, job_id: str) -> None: ...

    def cancel(self, job_id: str) -> None: ...

    def jobs_in(self, workdir: Path, since: float = 0.0) -> list[JobInfo]:
        """The jobs the scheduler still lists with this working directory, submitted since `since` (epoch s),
        oldest first (finds a job whose submitter stopped before recording it). Raises ClusterError when the
        scheduler cannot be asked."""

    def poll_policy(self) -> PollPolicy: ...

    def available(self) -> bool:
        """Whether this backend can run jobs here (for WORKSHOP_BACKEND=auto)."""

    def owns(self, job_id: str) -> bool:
        """Whether `job_id` has the shape of this backend's ids (`job_from_id` finds a job's backend by it)."""

    # Optional, for a backend that keeps accounting apart from its scheduler (SLURM's sacct):
    #     def accounting(self, job_ids: Sequence[str]) -> dict[str, JobInfo] | None
    # the records of these jobs, None where this cluster keeps no accounting. A backend without it has
    # no accounting: `Job.accounting()` answers with the job's state.


def get_backend(name: str) -> Backend:
    if name not in BACKENDS:
        raise ClusterError(f"unknown backend {name!r}: use one of {', '.join(BACKENDS)} (WORKSHOP_BACKEND)")
    return importlib.import_module(BACKENDS[name]).BACKEND


def python_environment_path(path: str | None = None) -> str:
    """PATH with this interpreter's bin folder first: jobs then run the same python, torchrun and
    workshop as the notebook or shell that submits them, even when the environment was never activated."""
    bin_dir = str(Path(sys.executable).parent)
    entries = [entry for entry in (path if path is not None else os.environ.get("PATH", "")).split(os.pathsep)
               if entry and entry != bin_dir]
    return os.pathsep.join([bin_dir, *entries])


def resolve_backend(backend: str | None = None) -> str:
    """The backend to use: the argument, else $WORKSHOP_BACKEND, else SLURM if present, else local."""
    choice = (backend or os.environ.get("WORKSHOP_BACKEND") or "auto").lower()
    if choice not in (*BACKENDS, "auto"):
        raise ClusterError(f"unknown backend {choice!r}: use one of slurm, local, auto (WORKSHOP_BACKEND)")
    if choice == "auto":
        if get_backend("slurm").available():
            return "slurm"
        if os.environ.get("WORKSHOP_ALLOW_LOCAL", "1") in ("0", "false", "no"):
            raise ClusterError(
                "no SLURM scheduler found (no sbatch, or no slurm.conf) and the local executor is not allowed "
                "(WORKSHOP_ALLOW_LOCAL=0). Start the project's cluster with `workshop cluster up`, "
                "or allow the local executor: export WORKSHOP_ALLOW_LOCAL=1."
            )
        return "local"
    if choice == "slurm" and not shutil.which("sbatch"):
        raise ClusterError(
            "WORKSHOP_BACKEND=slurm but `sbatch` is not on PATH. On Ibex, log in to a login node; elsewhere start "
            "the local cluster with `workshop cluster up`, or use WORKSHOP_BACKEND=local to run jobs with bash."
        )
    return choice


def longest_poll_override() -> float | None:
    """$WORKSHOP_POLL_MAX_S, if set: the longest pause between two polls."""
    value = os.environ.get("WORKSHOP_POLL_MAX_S")
    if not value:
        return None
    try:
        return max(0.1, float(value))
    except ValueError:
        raise ClusterError(f"WORKSHOP_POLL_MAX_S={value!r} is not a number of seconds") from None


POLL_POLICY_VARIABLE = "WORKSHOP_POLL_POLICY"
POLL_POLICIES = ("auto", "shared", "local")


def chosen_poll_policy() -> str:
    """$WORKSHOP_POLL_POLICY: `shared` polls as on a cluster many people use (Ibex, a class rehearsal on the
    project's cluster), `local` as on a cluster nobody else uses, `auto` (default) lets the backend decide."""
    value = os.environ.get(POLL_POLICY_VARIABLE, "auto").strip().lower() or "auto"
    if value not in POLL_POLICIES:
        raise ClusterError(f"{POLL_POLICY_VARIABLE}={value!r}: use one of {', '.join(POLL_POLICIES)} (shared: as on "
                           "a cluster a class shares, local: fast, for a cluster nobody else uses)")
    return value
