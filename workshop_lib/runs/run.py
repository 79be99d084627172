"""A run: an experiment's folder under the runs folder, its record and its job."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Sequence

from workshop_lib import jobs as cluster
from workshop_lib.core import paths
from workshop_lib.core.errors import ClusterError
from workshop_lib.core.run_directory import RunDirectory
from workshop_lib.experiments import Experiment
from workshop_lib.jobs.backend import BACKENDS, get_backend
from workshop_lib.jobs.states import DAMAGED, FORGOTTEN, LOST, NOT_SUBMITTED, UNKNOWN, JobInfo
from workshop_lib.runs.record import DamagedRecord, RunRecord

RUNS_VARIABLE = paths.RUNS_VARIABLE


def run_directory(experiment: Experiment, root: Path | str | None = None) -> Path:
    """The experiment's run folder under `root` (else $WORKSHOP_RUNS_DIR, else <repository>/runs)."""
    return RunDirectory.of(experiment.id, root).path


@dataclass
class Run:
    """An experiment's run directory and the job recorded there (if any)."""

    experiment: Experiment
    directory: Path
    record: RunRecord | None
    submitted_now: bool = False
    note: str = ""
    damage: str | None = None  # why job.json could not be read

    @property
    def job(self) -> cluster.Job | None:
        if self.record is None:
            return None
        return cluster.job_from_id(self.record.job_id, self.record.backend, stdout_path=self.stdout_path,
                                   name=self.record.job_name, workdir=self.directory)

    @property
    def files(self) -> RunDirectory:
        """Every path of the run folder, by name (core/run_directory.py names them once)."""
        return RunDirectory(self.directory)

    @property
    def stdout_path(self) -> Path | None:
        if self.record is None:
            return None
        return self.directory / self.record.stdout if self.record.stdout else self.files.stdout(self.record.job_id)

    def info(self) -> JobInfo:
        """The job's state now (writes nothing): the recorded final state, or the scheduler's answer."""
        return query_runs([self])[0]

    def remember(self, info: JobInfo) -> None:
        """Write a final state into job.json (a restarted scheduler reuses job ids; the file does not).
        A read-only runs folder keeps what it has: the state is asked again next time."""
        if self.record is not None and info.finished and not self.record.final_state:
            self.record = replace(self.record, final_state=info.state, exit_code=info.exit_code, signal=info.signal,
                                  elapsed_s=info.elapsed_s, time_limit_s=info.time_limit_s, reason=info.reason)
            try:
                self.record.save(self.directory)
            except OSError:
                pass

    @property
    def state(self) -> str:
        return self.info().state


def query_runs(runs: Sequence[Run], max_age_s: float = 0.0) -> list[JobInfo]:
    """Each run's state, asking the scheduler once for all the runs still active (an answer this process got
    less than `max_age_s` seconds ago is reused). Writes nothing.
    A scheduler that cannot be asked gives UNKNOWN (with its message as the reason)."""
    answers: dict[int, JobInfo] = {}
    asking: list[tuple[int, cluster.Job]] = []
    for index, run in enumerate(runs):
        if run.damage:
            answers[index] = JobInfo(job_id="", state=DAMAGED, reason=run.damage)
        elif run.record is None:
            answers[index] = JobInfo(job_id="", state=NOT_SUBMITTED)
        elif run.record.final_state:
            record = run.record
            answers[index] = JobInfo(job_id=record.job_id, state=record.final_state, exit_code=record.exit_code,
                                     signal=record.signal, elapsed_s=record.elapsed_s, reason=record.reason,
                                     time_limit_s=record.time_limit_s, stdout_path=run.stdout_path,
                                     name=record.job_name)
        else:
            asking.append((index, run.job))
    if asking:
        try:
            infos = cluster.query_jobs([job for _, job in asking], max_age_s=max_age_s)
        except ClusterError as error:
            infos = [JobInfo(job_id=job.job_id, state=UNKNOWN, reason=str(error), stdout_path=job.stdout_path)
                     for _, job in asking]
        answers.update({index: info for (index, _), info in zip(asking, infos)})
    return [answers[index] for index in range(len(runs))]


def may_hold_unrecorded_jobs(run: Run) -> bool:
    """Whether a job that job.json does not name may wait in the run folder: a submission was interrupted there
    (its reservation is still here, or it was settled while its sbatch may still have reached the controller)."""
    return run.files.reservation.exists() or run.files.interrupted.exists()


def unrecorded_jobs(run: Run, backend: str | None = None) -> list[JobInfo]:
    """The queued or running jobs in the run folder that job.json does not name, oldest first (one scheduler
    call). Raises ClusterError when the scheduler cannot be asked."""
    named = run.record.job_id if run.record is not None else None
    return [info for info in get_backend(backend or folder_backend(run)).jobs_in(run.directory)
            if not info.finished and info.job_id != named]


def folder_backend(run: Run) -> str:
    """The backend the run folder's jobs were submitted to: job.json's, else the interrupted submission's."""
    if run.record is not None:
        return run.record.backend
    for path in (run.files.reservation, run.files.interrupted):
        try:
            noted = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        latest = noted[-1] if isinstance(noted, list) and noted else noted
        if isinstance(latest, dict) and latest.get("backend") in BACKENDS:
            return latest["backend"]
    return cluster.resolve_backend(None)


def load_run(experiment: Experiment, root: Path | str | None = None) -> Run:
    """The run directory as it is on disk; a damaged job.json is reported on the Run, not raised."""
    directory = run_directory(experiment, root)
    try:
        return Run(experiment, directory, RunRecord.load(directory))
    except DamagedRecord as damaged:
        return Run(experiment, directory, None, damage=str(damaged), note="job.json damaged")


def earlier_attempts(run: Run) -> tuple[str, ...]:
    """Attempts SLURM requeued before the last one (e.g. after NODE_FAIL), from sacct; () where unknown."""
    return earlier_attempts_of([run]).get(id(run), ())


def earlier_attempts_of(runs: Sequence[Run]) -> dict[int, tuple[str, ...]]:
    """`earlier_attempts` of several runs with one sacct call, keyed by id(run)."""
    recorded = {run.record.job_id: run for run in runs if run.record is not None and run.record.backend == "slurm"}
    if not recorded:
        return {}
    origin = {job_id: (str(run.directory), _epoch(run.record.submitted_at)) for job_id, run in recorded.items()}
    try:
        records = get_backend("slurm").accounting(list(recorded), duplicates=True, origin=origin) or {}
    except ClusterError:
        return {}
    found: dict[int, tuple[str, ...]] = {}
    for job_id, run in recorded.items():
        attempts = [records[key] for key in sorted(records, key=lambda k: int(k.split("#")[1]))
                    if key.split("#")[0] == job_id and (not run.record.job_name or not records[key].name
                                                        or records[key].name == run.record.job_name)]
        if len(attempts) > 1:
            found[id(run)] = tuple(info.state + (f" on {info.node_list}" if info.node_list else "")
                                   for info in attempts[:-1])
    return found


def _epoch(stamp: str) -> float:
    try:
        return datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return 0.0


def read_only_info(run: Run) -> JobInfo:
    """What the run folder alone says, asking no scheduler (the book's read-only view): the recorded final
    state, else the end the job's log footer gives, else UNKNOWN (it may still run)."""
    if run.damage:
        return JobInfo(job_id="", state=DAMAGED, reason=run.damage)
    if run.record is None:
        return JobInfo(job_id="", state=NOT_SUBMITTED)
    if run.record.final_state:
        return query_runs([run])[0]  # the recorded state: no scheduler call
    ended = cluster.ended_from_log(JobInfo(job_id=run.record.job_id, state=FORGOTTEN,
                                           stdout_path=run.stdout_path, reason="read only: no scheduler asked"))
    return ended if ended.state != LOST else JobInfo(job_id=run.record.job_id, state=UNKNOWN,
                                                       stdout_path=run.stdout_path)
