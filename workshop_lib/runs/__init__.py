"""Runs: an experiment's folder, record and job, from submission to its end.

Owns: record.py (job.json, the one reader and writer), run.py (Run, loading and asking about runs), submit.py
(submit or reuse, one job per experiment whatever fails), status.py (waiting, the status table, explanations).
May import: core, experiments, sites, checks, scripts, jobs.
"""

from workshop_lib.jobs.states import DAMAGED, HELD, NOT_SUBMITTED, UNKNOWN
from workshop_lib.runs.record import DamagedRecord, RunRecord, write_atomically
from workshop_lib.runs.run import (
    RUNS_VARIABLE, Run, earlier_attempts, earlier_attempts_of, load_run, query_runs, read_only_info, run_directory,
)
from workshop_lib.runs.status import RunStatus, explain_run, explain_runs, run_status, wait_for_runs
from workshop_lib.runs.submit import (
    FAULT_VARIABLE, LOCK_TIMEOUT_S, CancelReport, cancel_runs, cancel_runs_report, prepare_run_directory,
    records_this_experiment, run_lock, submit_experiment, submit_experiments,
)

__all__ = [
    "CancelReport", "DAMAGED", "DamagedRecord", "FAULT_VARIABLE", "HELD", "LOCK_TIMEOUT_S", "NOT_SUBMITTED",
    "RUNS_VARIABLE", "Run", "RunRecord", "RunStatus", "UNKNOWN", "cancel_runs", "cancel_runs_report",
    "earlier_attempts", "earlier_attempts_of", "explain_run",
    "explain_runs", "load_run", "prepare_run_directory", "query_runs", "read_only_info", "records_this_experiment",
    "run_directory", "run_lock", "run_status", "submit_experiment", "submit_experiments",
    "wait_for_runs", "write_atomically",
]
