"""A run's record, job.json: the one reader and writer of it (the states a run without a live job has are in
jobs/states.py)."""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from workshop_lib.core.errors import WorkshopError
from workshop_lib.core.run_directory import ATTEMPTS_DIR, RECORD_NAME, SCRIPT_NAME, RunDirectory
from workshop_lib.jobs.backend import BACKENDS


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
    script_sha256: str | None = None  # the submitted script's digest: a later edit of job.sbatch is told apart
    # Fields this version does not know (a newer workshop wrote them): written back as they were.
    unknown_fields: dict = field(default_factory=dict, compare=False, repr=False)

    def save(self, directory: Path) -> None:
        known = {key: value for key, value in asdict(self).items() if key != "unknown_fields"}
        write_atomically(directory / RECORD_NAME, json.dumps({**self.unknown_fields, **known}, indent=2) + "\n")

    @classmethod
    def load(cls, directory: Path) -> "RunRecord | None":
        data = read_record(directory)
        if data is None:
            return None
        names = {item.name for item in fields(cls)} - {"unknown_fields"}
        try:
            return cls(**{key: data[key] for key in names if key in data},
                       unknown_fields={key: value for key, value in data.items() if key not in names})
        except TypeError as error:  # a required field missing
            raise _damaged(Path(directory), error) from error


def read_record(directory: Path | str) -> dict | None:
    """The run's job.json as a dict; None when there is none. Raises DamagedRecord when it is not a JSON object
    (a file cut short, or edited by hand): the one reader of job.json, whatever each caller then does about it."""
    path = Path(directory) / RECORD_NAME
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except ValueError as error:
        raise _damaged(Path(directory), error) from error
    if not isinstance(data, dict):
        raise _damaged(Path(directory), TypeError(f"a JSON {type(data).__name__}, not an object"))
    problem = _field_problem(data, Path(directory))
    if problem:
        raise _damaged(Path(directory), ValueError(problem))
    return data


# What each field of job.json may hold: a record copied from elsewhere or edited by hand is refused here,
# with the field named, instead of failing (or reading a file outside the run) wherever the value is used.
_TEXT_FIELDS = ("experiment_id", "content_hash", "profile", "job_id", "backend", "submitted_at", "script", "stdout",
                "final_state", "job_name", "reason", "script_sha256")
_INTEGER_FIELDS = ("exit_code", "signal")
_NUMBER_FIELDS = ("elapsed_s", "time_limit_s")
_STATE = re.compile(r"[A-Z][A-Z_]*")


def _field_problem(data: dict, directory: Path) -> str | None:
    """Why a job.json's fields cannot be this workshop's record of a job; None when they can."""
    for key in _TEXT_FIELDS:
        if data.get(key) is not None and not isinstance(data[key], str):
            return f"field {key!r} is {data[key]!r}, not a string"
    for key in _INTEGER_FIELDS:
        if data.get(key) is not None and (isinstance(data[key], bool) or not isinstance(data[key], int)):
            return f"field {key!r} is {data[key]!r}, not a whole number"
    for key in _NUMBER_FIELDS:
        if data.get(key) is not None and (isinstance(data[key], bool) or not isinstance(data[key], (int, float))):
            return f"field {key!r} is {data[key]!r}, not a number"
    if data.get("job_id") is not None and not data["job_id"].strip():
        return "field 'job_id' is empty"
    if data.get("backend") is not None and data["backend"] not in BACKENDS:
        return f"field 'backend' is {data['backend']!r}, not one of {', '.join(BACKENDS)}"
    if data.get("final_state") is not None and not _STATE.fullmatch(data["final_state"]):
        return f"field 'final_state' is {data['final_state']!r}, not a scheduler state such as COMPLETED"
    for key in ("stdout", "script"):
        if data.get(key) and not _inside(directory, data[key]):
            return f"field {key!r} names {data[key]!r}, outside the run folder (a run's files stay in its folder)"
    return None


def _inside(directory: Path, name: str) -> bool:
    resolved_folder = directory.resolve()
    return (resolved_folder / name).resolve().is_relative_to(resolved_folder)


def _damaged(directory: Path, error: Exception) -> DamagedRecord:
    return DamagedRecord(f"{directory / RECORD_NAME} is damaged ({type(error).__name__}: {error}); the run's other "
                         f"files are intact. {_damaged_record_advice(directory)}")


def _damaged_record_advice(directory: Path) -> str:
    """What to do about a damaged job.json, from what the job's log says: a completed run is kept as it is
    (renaming its record would run the experiment again)."""
    from workshop_lib.core.log_text import read_tail
    from workshop_lib.jobs.footer import parse_footer

    logs = RunDirectory(directory).stdout_logs()
    if not logs:
        return (f"No job log is here, so the job never ran: rename job.json to job.json.damaged and re-run; the "
                f"next submission keeps this run's files under {ATTEMPTS_DIR}/ and submits it again.")
    names = ", ".join(log.name for log in logs)
    exit_status = parse_footer(read_tail(logs[-1])).exit_status
    if exit_status == 0:
        return (f"Its log {logs[-1].name} ends with `Exit status: 0`: the job completed and the tables read its "
                "results from the other files. Leave job.json as it is: renaming it would run the experiment "
                "again (this run is not submitted again while it is damaged).")
    ended = f"ends with `Exit status: {exit_status}`" if exit_status is not None else "has no footer yet"
    return (f"The job's log {names} {ended} (its number is the job id). If that job still runs (`squeue --me`), "
            "wait for it. Once it has ended without completing, rename job.json to job.json.damaged: the next "
            f"submission keeps every file of this run under {ATTEMPTS_DIR}/ and submits it again.")
