"""The SLURM backend: sbatch, squeue, sacct, scontrol and scancel, as few calls as a shared scheduler wants.

One `squeue` call answers for all of a waiter's jobs, exit codes of the ended ones included; `sacct` (which
asks slurmdbd, not the controller) only about the jobs the controller no longer lists. A failing call
raises ClusterError with the tool's own message: an unreachable scheduler is never read as a job's state.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from workshop_lib.checks.sbatch import sbatch_request
from workshop_lib.core.errors import ClusterError, SubmitError
from workshop_lib.jobs import slurm_output
from workshop_lib.jobs.backend import CLOCK_SKEW_S, PollPolicy, Submission
from workshop_lib.jobs.states import FINAL_STATES, FORGOTTEN, JobInfo

# squeue columns: id (array tasks as ID_TASK), name, state, reason, time used, time limit, nodes, working
# directory, submit time, and the wait status of an ended job (exit code << 8 | signal): with it, an ended
# job needs no `scontrol show job` of its own. "Field:|" = no padding, "|" after each value.
SQUEUE_FIELDS = ("JobArrayID", "Name", "State", "Reason", "TimeUsed", "TimeLimit", "NodeList", "WorkDir", "SubmitTime",
                 "exit_code")
SQUEUE_FORMAT = ",".join(f"{field}:|" for field in SQUEUE_FIELDS)
# A shared scheduler: squeue costs 2 controller RPCs; 10 s growing to 15 s keeps a waiter under
# 12 RPCs a minute whatever the number of jobs (benchmarks/polling_rpcs.py measures it).
CLUSTER_POLLING = PollPolicy(first=10.0, longest=15.0)
# The project's own cluster on this machine: tiny jobs end in seconds and nobody else is served.
LOCAL_CLUSTER_POLLING = PollPolicy(first=0.5, longest=3.0)
ACCOUNTING_DISABLED = "accounting storage is disabled"
JOB_ID = re.compile(r"\d+(_\d+)?")  # a job, or one task of an array job (1234_5)
INHERITED_SLURM_VARIABLES = {"SLURM_CONF"}


def scheduler_environment() -> dict[str, str]:
    """os.environ with the submitter's interpreter first on PATH, plus SLURM_CONF of the project's
    local cluster when it runs and none is set. sbatch hands this environment to the job."""
    from workshop_lib.jobs.backend import python_environment_path

    # A kernel inside a job (the Jupyter batch job, an Open OnDemand session) carries that job's SLURM_*
    # variables; handed on, they would mix with the new job's own (e.g. SLURM_MEM_PER_CPU next to --mem:
    # "mutually exclusive" at its first srun). Only the configuration's location is kept.
    env = {name: value for name, value in os.environ.items()
           if not name.startswith("SLURM_") or name in INHERITED_SLURM_VARIABLES}
    env["PATH"] = python_environment_path(env.get("PATH"))
    if "SLURM_CONF" not in env:
        from workshop_lib.jobs.local_cluster import LocalCluster

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


def _run(command: list[str], what: str, timeout: float = 60) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(command, capture_output=True, text=True, env=scheduler_environment(), timeout=timeout)
    except FileNotFoundError:
        raise ClusterError(f"`{command[0]}` not found: SLURM's client tools are not installed here") from None
    except subprocess.TimeoutExpired:
        raise ClusterError(f"{what} did not answer within {timeout:.0f} s: the scheduler is overloaded or down; "
                           "try again in a minute") from None


def _checked(command: list[str], what: str) -> str:
    result = _run(command, what)
    if result.returncode != 0:
        raise ClusterError(f"{what} failed: {(result.stderr or result.stdout).strip()}")
    return result.stdout


class SlurmBackend:
    name = "slurm"

    def submit(self, script: Path, workdir: Path, sbatch_args: Sequence[str] = (), hold: bool = False) -> Submission:
        command = ["sbatch", "--parsable", f"--chdir={workdir}", *(["--hold"] if hold else []), *sbatch_args,
                   str(script)]
        result = _run(command, "sbatch")
        if result.returncode != 0:
            raise SubmitError(f"sbatch refused {script.name}:\n{result.stderr.strip()}\n" + _refusal_hint(result.stderr))
        job_id = result.stdout.strip().split(";")[0]
        name = sbatch_request(script.read_text(errors="replace"), sbatch_args).get("job-name") or script.name
        return Submission(job_id, slurm_output.expected_stdout(script, workdir, job_id, sbatch_args), name)

    def query(self, job_ids: Sequence[str]) -> dict[str, JobInfo]:
        if not job_ids:
            return {}
        listed = self._squeue(job_ids)
        infos: dict[str, JobInfo] = {}
        for job_id in job_ids:
            if job_id in listed:
                infos[job_id] = listed[job_id]
        missing = [job_id for job_id in job_ids if job_id not in infos]
        if missing:
            records = self.accounting(missing)
            for job_id in missing:
                record = (records or {}).get(job_id)
                infos[job_id] = record or JobInfo(
                    job_id=job_id, state=FORGOTTEN,
                    reason="not in squeue" + (" nor in sacct" if records is not None else "; no accounting here"))
        return infos

    def accounting(self, job_ids: Sequence[str], duplicates: bool = False,
                   origin: dict[str, tuple[str, float]] | None = None) -> dict[str, JobInfo] | None:
        """sacct's records of these jobs; None where the cluster keeps no accounting. With
        `duplicates`, every attempt of a requeued job (key `ID#N`, oldest first). `origin` (job id ->
        working directory, earliest submit time in epoch s) keeps only the rows of that very job: after a
        scheduler reset, `sacct -D` also lists unrelated jobs that had the same id."""
        fields = slurm_output.SACCT_FIELDS + (",WorkDir,Submit" if origin is not None else "")
        command = ["sacct", "-n", "-P", "-X", *(["-D"] if duplicates else []), "-j", ",".join(job_ids),
                   "-o", fields]
        result = _run(command, "sacct")
        if result.returncode != 0:
            if ACCOUNTING_DISABLED in result.stderr.lower():
                return None
            raise ClusterError(f"sacct failed: {result.stderr.strip()} (is slurmdbd running? "
                               "`sacctmgr show cluster` tells; on Ibex, ask the admins if it persists)")
        if not duplicates:
            return slurm_output.job_infos_from_sacct(result.stdout)
        attempts: dict[str, JobInfo] = {}
        counts: dict[str, int] = {}
        for line in result.stdout.splitlines():  # one line per attempt, oldest first
            if origin is not None and not _same_job(line, origin):
                continue
            for job_id, info in slurm_output.job_infos_from_sacct(line).items():
                attempts[f"{job_id}#{counts.get(job_id, 0)}"] = info
                counts[job_id] = counts.get(job_id, 0) + 1
        return attempts

    def release(self, job_id: str) -> None:
        _checked(["scontrol", "release", job_id], f"scontrol release {job_id}")

    def cancel(self, job_id: str) -> None:
        _checked(["scancel", job_id], f"scancel {job_id}")

    def jobs_in(self, workdir: Path, since: float = 0.0) -> list[JobInfo]:
        output = _checked(["squeue", "-h", "-t", "all", "--me", "--local", "-O", SQUEUE_FORMAT], "squeue")
        wanted = str(Path(workdir).resolve())
        found = []
        for line in output.splitlines():
            fields = line.split("|")
            if len(fields) < 9 or str(Path(fields[7]).resolve()) != wanted:
                continue
            try:
                submitted = datetime.fromisoformat(fields[8]).timestamp()
            except ValueError:
                submitted = since
            if submitted >= since - CLOCK_SKEW_S:
                found.append(JobInfo(job_id=fields[0], state=slurm_output.normalise_state(fields[2]),
                                     reason=fields[3] or None, name=fields[1] or None, workdir=Path(fields[7])))
        return sorted(found, key=lambda info: int(info.job_id) if info.job_id.isdigit() else 0)

    def poll_policy(self) -> PollPolicy:
        from workshop_lib.jobs.backend import chosen_poll_policy

        choice = chosen_poll_policy()
        if choice == "auto":
            choice = "local" if _is_project_cluster() else "shared"
        return LOCAL_CLUSTER_POLLING if choice == "local" else CLUSTER_POLLING

    available = staticmethod(slurm_available)

    @staticmethod
    def owns(job_id: str) -> bool:
        return JOB_ID.fullmatch(job_id) is not None

    # ---- helpers ------------------------------------------------------------------------------
    def _squeue(self, job_ids: Sequence[str]) -> dict[str, JobInfo]:
        # All of this user's jobs, filtered here: one controller request (plus squeue's partition request)
        # whatever the number of jobs; `-j ID` would cost a third one, and so would the federation lookup
        # squeue makes for a user other than root without --local.
        wanted = set(job_ids)
        result = _run(["squeue", "-h", "-t", "all", "--me", "--local", "-O", SQUEUE_FORMAT], "squeue")
        if result.returncode != 0:
            raise ClusterError(f"squeue failed: {result.stderr.strip()} (the controller is unreachable; the jobs "
                               "are not known to have ended: ask again later)")
        rows: dict[str, list[JobInfo]] = {}
        for line in result.stdout.splitlines():
            fields = line.split("|")
            if len(fields) < len(SQUEUE_FIELDS):
                continue
            task_id, name, state, reason, used, limit, nodes = fields[:7]
            parent = task_id.split("_")[0]
            if parent not in wanted:
                continue
            state = slurm_output.normalise_state(state)
            exit_code, signal = (slurm_output.parse_wait_status(fields[9]) if state in FINAL_STATES
                                 else (None, None))
            rows.setdefault(parent, []).append(JobInfo(
                job_id=task_id, state=state, reason=reason or None, exit_code=exit_code, signal=signal,
                elapsed_s=slurm_output.parse_elapsed(used), name=name or None,
                node_list=nodes if nodes and nodes != "(null)" else None,
                time_limit_s=slurm_output.parse_elapsed(limit), workdir=Path(fields[7]) if fields[7] else None))
        infos = {}
        for job_id, tasks in rows.items():
            if len(tasks) == 1 and tasks[0].job_id == job_id:
                infos[job_id] = tasks[0]
            else:
                infos[job_id] = slurm_output.aggregate_array(job_id, tasks)
        return infos


def _same_job(line: str, origin: dict[str, tuple[str, float]]) -> bool:
    """Whether an `sacct -D` row (SACCT_FIELDS, WorkDir, Submit) belongs to the job `origin` describes."""
    fields = line.split("|")
    count = len(slurm_output.SACCT_FIELDS.split(","))
    if len(fields) < count + 2 or fields[0] not in origin:
        return True  # nothing to compare: keep it
    workdir, earliest = origin[fields[0]]
    try:
        submitted = datetime.fromisoformat(fields[count + 1]).timestamp()
    except ValueError:
        submitted = earliest
    same_folder = Path(fields[count]).resolve() == Path(workdir).resolve() if fields[count] else True
    return same_folder and submitted >= earliest - 60


def _refusal_hint(stderr: str) -> str:
    lowered = stderr.lower()
    if "unable to contact slurm controller" in lowered or "connection refused" in lowered \
            or "socket timed out" in lowered:
        return ("The scheduler did not answer: nothing was submitted. Try again in a minute "
                "(`workshop cluster status` for the local cluster).")
    return "Check the #SBATCH lines named above (`workshop check SCRIPT` explains common mistakes)."


def _is_project_cluster() -> bool:
    conf = scheduler_environment().get("SLURM_CONF")
    if not conf:
        return False
    try:
        return "written by `workshop cluster up`" in Path(conf).read_text(errors="replace")[:400]
    except OSError:
        return False


def test_only(script: Path | str, sbatch_args: Sequence[str] = ()) -> str:
    """Ask SLURM whether it would accept the script (`sbatch --test-only`); returns its answer."""
    result = _run(["sbatch", "--test-only", *sbatch_args, str(script)], "sbatch --test-only")
    if result.returncode != 0:
        raise SubmitError(f"sbatch --test-only rejected {Path(script).name}:\n{result.stderr.strip()}")
    return (result.stderr or result.stdout).strip()


BACKEND = SlurmBackend()
