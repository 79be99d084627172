"""A run's record, job.json: the one reader and writer of it, and the states a run without a live job has."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from workshop_lib import jobs as cluster
from workshop_lib.core.errors import WorkshopError
from workshop_lib.core.run_directory import ATTEMPTS_DIR, RECORD_NAME, SCRIPT_NAME

NOT_SUBMITTED = "NOT SUBMITTED"
DAMAGED = "DAMAGED"
UNKNOWN = cluster.UNREACHABLE
HELD = "JobHeldUser"  # squeue's reason for a job submitted with --hold


class DamagedRecord(WorkshopError):
    """A job.json that cannot be read; the run's other files are intact."""


def write_atomically(path: Path, text: str) -> None:
    """Write a whole file or nothing: readers never see half of it."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


@dataclass(frozen=True)
class RunRecord:
    """What job.json says about the job submitted from a run directory."""

    experiment_id: str
    content_hash: str
    profile: str
    job_id: str
    backend: str
    submitted_at: str
    script: str = SCRIPT_NAME
    stdout: str | None = None  # file name of the job's stdout inside the run directory
    final_state: str | None = None  # written once a final state has been seen, so ids reused later do not matter
    exit_code: int | None = None
    job_name: str | None = None  # what the scheduler calls the job: an id reused by another job is told apart
    # How it ended, kept with the final state for the failure explanation (the scheduler forgets).
    signal: int | None = None
    elapsed_s: float | None = None
    time_limit_s: float | None = None
    reason: str | None = None

    def save(self, directory: Path) -> None:
        write_atomically(directory / RECORD_NAME, json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, directory: Path) -> "RunRecord | None":
        path = Path(directory) / RECORD_NAME
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text())
            known = {key: data[key] for key in cls.__dataclass_fields__ if key in data}
            return cls(**known)
        except (ValueError, TypeError, AttributeError) as error:
            raise DamagedRecord(f"{path} is damaged ({type(error).__name__}: {error}); the run's other files are "
                                f"intact. {_damaged_record_advice(Path(directory))}") from error


def _damaged_record_advice(directory: Path) -> str:
    """What to do about a damaged job.json, from what the job's log says: a completed run is kept as it is
    (renaming its record would run the experiment again)."""
    from workshop_lib.parse.footer import parse_footer

    logs = sorted(directory.glob("slurm-*.out"))
    if not logs:
        return (f"No job log is here, so the job never ran: rename job.json to job.json.damaged and re-run; the "
                f"next submission keeps this run's files under {ATTEMPTS_DIR}/ and submits it again.")
    names = ", ".join(log.name for log in logs)
    try:
        exit_status = parse_footer(logs[-1].read_text(errors="replace")).exit_status
    except OSError:
        exit_status = None
    if exit_status == 0:
        return (f"Its log {logs[-1].name} ends with `Exit status: 0`: the job completed and the tables read its "
                "results from the other files. Leave job.json as it is: renaming it would run the experiment "
                "again (this run is not submitted again while it is damaged).")
    ended = f"ends with `Exit status: {exit_status}`" if exit_status is not None else "has no footer yet"
    return (f"The job's log {names} {ended} (its number is the job id). If that job still runs (`squeue --me`), "
            "wait for it. Once it has ended without completing, rename job.json to job.json.damaged: the next "
            f"submission keeps every file of this run under {ATTEMPTS_DIR}/ and submits it again.")
