"""Job control: submit a script, follow its state, wait for many jobs, cancel.

Two backends answer the same calls:
- `slurm`: sbatch / scontrol / squeue / sacct / scancel (Ibex, or the project's local cluster);
- `local`: runs the script with bash on this machine, SLURM-like, where no scheduler exists.
Choose with `backend=` or $WORKSHOP_BACKEND (slurm | local | auto); auto prefers SLURM.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import slurm_output
from .errors import ClusterError, JobFailed, SubmitError
from .slurm_output import FINAL_STATES, JobInfo  # noqa: F401  (re-exported: part of this module's API)

BACKENDS = ("slurm", "local")


# ---- choosing a backend -----------------------------------------------------------------------
def python_environment_path(path: str | None = None) -> str:
    """PATH with this interpreter's bin folder first: jobs then run the same python, torchrun and
    workshop as the notebook or shell that submits them, even when the environment was never activated."""
    import sys

    bin_dir = str(Path(sys.executable).parent)
    entries = [entry for entry in (path if path is not None else os.environ.get("PATH", "")).split(os.pathsep)
               if entry and entry != bin_dir]
    return os.pathsep.join([bin_dir, *entries])


def scheduler_environment() -> dict[str, str]:
    """os.environ with the submitter's interpreter first on PATH, plus SLURM_CONF of the project's
    local cluster when it runs and none is set. sbatch hands this environment to the job."""
    env = dict(os.environ)
    env["PATH"] = python_environment_path(env.get("PATH"))
    if "SLURM_CONF" not in env:
        from .local_cluster import LocalCluster

        local = LocalCluster()
        if local.conf.exists() and local.controller_running():  # cheap: a PID file, no sinfo call
            env["SLURM_CONF"] = str(local.conf)
    return env


def slurm_available() -> bool:
    """True if sbatch exists and a cluster configuration can be found."""
    if not shutil.which("sbatch"):
        return False
    env = scheduler_environment()
    return "SLURM_CONF" in env or Path("/etc/slurm/slurm.conf").exists() or Path("/etc/slurm-llnl/slurm.conf").exists()


def resolve_backend(backend: str | None = None) -> str:
    """The backend to use: the argument, else $WORKSHOP_BACKEND, else SLURM if present, else local."""
    choice = (backend or os.environ.get("WORKSHOP_BACKEND") or "auto").lower()
    if choice not in BACKENDS + ("auto",):
        raise ClusterError(f"unknown backend {choice!r}: use one of slurm, local, auto (WORKSHOP_BACKEND)")
    if choice == "auto":
        if slurm_available():
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


# ---- the Job ------------------------------------------------------------------------------
@dataclass
class Job:
    """A submitted job. `info()` asks the scheduler each time it is called."""

    job_id: str
    backend: str
    stdout_path: Path | None = None
    name: str | None = None
    _last: JobInfo | None = field(default=None, repr=False)

    def info(self) -> JobInfo:
        if self._last is not None and self._last.finished:
            return self._last  # a finished job does not change again
        if self.backend == "local":
            from . import local_executor

            info = local_executor.job_info(self.job_id)
        else:
            info = _slurm_info(self.job_id)
        if info.stdout_path is None and self.stdout_path is not None:
            info = info.with_stdout(self.stdout_path)
        if info.stdout_path is not None:
            self.stdout_path = info.stdout_path
        self._last = info
        return info

    @property
    def state(self) -> str:
        return self.info().state

    @property
    def finished(self) -> bool:
        return self.info().finished

    def cancel(self) -> None:
        if self.backend == "local":
            from . import local_executor

            local_executor.cancel(self.job_id)
        else:
            _run_slurm(["scancel", self.job_id], "scancel")

    def log_tail(self, lines: int = 20) -> str:
        return slurm_output.tail(self.info().stdout_path, lines)

    def accounting(self, timeout: float = 20.0) -> JobInfo:
        """The job's record in `sacct`, once accounting has caught up with the controller.

        sacct lags the controller by a second or more and may first show a provisional record
        (named "allocation", one node): accept a final record only when it matches what the
        controller says, or, if the controller has forgotten the job, when it is stable across two reads.
        """
        if self.backend == "local":
            return self.info()
        controller = self.info()
        deadline = time.monotonic() + timeout
        previous = None
        while True:
            record = _sacct([self.job_id]).get(self.job_id)
            if record is not None and record.finished:
                if controller.finished and controller.reason != "not found in scontrol or sacct yet":
                    agrees = (record.state, record.exit_code, record.name) == (
                        controller.state, controller.exit_code, controller.name)
                else:
                    agrees = record == previous
                if agrees:
                    return record.with_stdout(self.stdout_path)
            if time.monotonic() > deadline:
                if record is not None:
                    return record.with_stdout(self.stdout_path)
                raise ClusterError(f"job {self.job_id} has no sacct record after {timeout:.0f} s: is slurmdbd "
                                   "running? (`workshop cluster status`; start without --no-accounting)")
            previous = record
            time.sleep(0.75)

    def raise_for_state(self) -> None:
        info = self.info()
        if info.state != "COMPLETED":
            raise JobFailed(info.failure_message(self.log_tail(20)))

    def __repr__(self) -> str:  # short: shows up in notebooks
        return f"Job({self.job_id!r}, backend={self.backend!r})"


def submit(script: Path | str, workdir: Path | str | None = None, sbatch_args: Sequence[str] = (),
           backend: str | None = None) -> Job:
    """Submit a job script; returns its Job. Raises SubmitError with the scheduler's message if refused."""
    script = Path(script).resolve()
    if not script.is_file():
        raise SubmitError(f"job script {script} does not exist; render it first (`workshop render ID -o FILE`)")
    workdir = Path(workdir).resolve() if workdir else script.parent
    chosen = resolve_backend(backend)
    if chosen == "local":
        from . import local_executor

        return local_executor.submit(script, workdir, sbatch_args)
    command = ["sbatch", "--parsable", f"--chdir={workdir}", *sbatch_args, str(script)]
    result = subprocess.run(command, capture_output=True, text=True, env=scheduler_environment(), timeout=60)
    if result.returncode != 0:
        raise SubmitError(f"sbatch refused {script.name}:\n{result.stderr.strip()}\n"
                          "Check the #SBATCH lines named above (`workshop check SCRIPT` explains common mistakes).")
    job_id = result.stdout.strip().split(";")[0]
    job = Job(job_id, "slurm")
    job.stdout_path = slurm_output.expected_stdout(script, workdir, job_id, sbatch_args)
    return job


def job_from_id(job_id: str, backend: str | None = None) -> Job:
    """A Job for an id submitted earlier (by this process or another)."""
    job_id = str(job_id)
    chosen = backend or ("local" if job_id.startswith("local-") else resolve_backend(None))
    return Job(job_id, chosen)


def test_only(script: Path | str, sbatch_args: Sequence[str] = ()) -> str:
    """Ask SLURM whether it would accept the script (`sbatch --test-only`); returns its answer."""
    command = ["sbatch", "--test-only", *sbatch_args, str(script)]
    result = subprocess.run(command, capture_output=True, text=True, env=scheduler_environment(), timeout=60)
    if result.returncode != 0:
        raise SubmitError(f"sbatch --test-only rejected {Path(script).name}:\n{result.stderr.strip()}")
    return (result.stderr or result.stdout).strip()


def wait_for(jobs: Iterable[Job], timeout: float | None = None, poll_interval: float = 1.0,
             progress: bool = True) -> list[JobInfo]:
    """Poll until every job has ended or `timeout` seconds passed; returns their last known states."""
    from .progress import JobProgress

    jobs = list(jobs)
    started = time.monotonic()
    display = JobProgress(len(jobs)) if progress else None
    while True:
        infos = [job.info() for job in jobs]
        elapsed = time.monotonic() - started
        if display:
            display.update(infos, elapsed)
        if all(info.finished for info in infos) or (timeout is not None and elapsed >= timeout):
            if display:
                display.close(infos, elapsed, timed_out=not all(info.finished for info in infos))
            return infos
        time.sleep(poll_interval)


# ---- SLURM queries --------------------------------------------------------------------------
def _run_slurm(command: list[str], what: str) -> str:
    try:
        result = subprocess.run(command, capture_output=True, text=True, env=scheduler_environment(), timeout=60)
    except FileNotFoundError:
        raise ClusterError(f"`{command[0]}` not found: SLURM's client tools are not installed here") from None
    if result.returncode != 0:
        raise ClusterError(f"{what} failed: {result.stderr.strip()}")
    return result.stdout


def _slurm_info(job_id: str) -> JobInfo:
    """From the controller while it remembers the job, else from accounting."""
    result = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True,
                            env=scheduler_environment(), timeout=60)
    if result.returncode == 0 and result.stdout.strip():
        return slurm_output.job_info_from_scontrol(job_id, result.stdout)
    record = _sacct([job_id]).get(job_id)
    if record is not None:
        return record
    # Known to neither (yet): sacct lags the controller by a second or two after submission.
    return JobInfo(job_id=job_id, state="UNKNOWN", reason="not found in scontrol or sacct yet")


def _sacct(job_ids: Sequence[str]) -> dict[str, JobInfo]:
    try:
        output = _run_slurm(["sacct", "-n", "-P", "-X", "-j", ",".join(job_ids),
                             "-o", slurm_output.SACCT_FIELDS], "sacct")
    except ClusterError:
        return {}
    return slurm_output.job_infos_from_sacct(output)
