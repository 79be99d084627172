"""Jobs on a scheduler: submit, find again, ask about and wait for them, on SLURM or the local executor.

Owns: job.py (Job, submit, job_from_id, a forgotten job's end read from its log), watcher.py (the process's one
watcher: one poll of every job someone waits for or shows, the answer cache, wait_for and its progress bar),
backend.py (the Backend protocol, the polling policy, choosing a backend), states.py (JobInfo and every job
and run state name: the one home of those words), slurm.py and slurm_output.py (sbatch,
squeue and sacct, and reading their output), local.py (the executor that runs job scripts without a scheduler)
with local_shims/, local_cluster.py (the real SLURM cluster the project starts on this machine), failures.py (why
a job ended the way it did).
May import: core and the checks (the #SBATCH reader). This face re-exports what callers use as `cluster.…`.
"""

from workshop_lib.jobs.backend import resolve_backend
from workshop_lib.jobs.job import Job, ended_from_log, job_from_id, submit, test_only
from workshop_lib.jobs.watcher import UNREACHABLE, query_jobs, state_counts, wait_for

__all__ = ["UNREACHABLE", "Job", "ended_from_log", "job_from_id", "query_jobs", "resolve_backend", "state_counts",
           "submit", "test_only", "wait_for"]
