"""Run directories: render an experiment into ``runs/<experiment id>/``, submit it, remember the job.

A run directory holds ``job.sbatch`` (the script exactly as submitted), ``job.json`` (a RunRecord),
the job's stdout ``slurm-<jobid>.out``, the monitors (``gpu_memory_<node>.csv``; ``cpu_memory.txt`` on one
node or ``cpu_memory_<node>.txt`` per node; ``nccl_allreduce.txt``) and ``train/`` (the entry point's
``--output-dir``). Re-running a notebook never resubmits finished work: an experiment whose content hash
already has a COMPLETED run on the same profile is reused, an active one is never doubled, and a run that
is replaced is moved to ``attempts/<job id>/`` rather than deleted.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Sequence

from . import cluster
from .errors import ClusterError, WorkshopError
from .experiments import Experiment, select_experiments
from .profiles import Profile, load_profile
from .scripts import CPU_MEMORY_LOG, DS_CONFIGS_DIR, TRAIN_DIR, render_script
from .slurm_output import FINAL_STATES, JobInfo

RUNS_VARIABLE = "WORKSHOP_RUNS_DIR"
SCRIPT_NAME = "job.sbatch"
RECORD_NAME = "job.json"
DEEPSPEED_CONFIG_NAME = "ds_config.json"
ATTEMPTS_DIR = "attempts"
NOT_SUBMITTED = "NOT SUBMITTED"


def runs_root(root: Path | str | None = None) -> Path:
    """Where run directories live: ``root``, else $WORKSHOP_RUNS_DIR, else ./runs."""
    chosen = root or os.environ.get(RUNS_VARIABLE) or Path.cwd() / "runs"
    return Path(chosen).expanduser().resolve()


def run_directory(experiment: Experiment, root: Path | str | None = None) -> Path:
    return runs_root(root) / experiment.id


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

    def save(self, directory: Path) -> None:
        (directory / RECORD_NAME).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, directory: Path) -> "RunRecord | None":
        path = Path(directory) / RECORD_NAME
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text())
            known = {key: data[key] for key in cls.__dataclass_fields__ if key in data}
            return cls(**known)
        except (ValueError, TypeError) as error:
            raise WorkshopError(f"{path} is not a job record ({error}); move the folder aside and submit again") \
                from error


@dataclass
class Run:
    """An experiment's run directory and the job recorded there (if any)."""

    experiment: Experiment
    directory: Path
    record: RunRecord | None
    submitted_now: bool = False
    note: str = ""

    @property
    def job(self) -> cluster.Job | None:
        if self.record is None:
            return None
        job = cluster.job_from_id(self.record.job_id, self.record.backend)
        job.stdout_path = self.stdout_path
        return job

    @property
    def stdout_path(self) -> Path | None:
        if self.record is None:
            return None
        return self.directory / (self.record.stdout or f"slurm-{self.record.job_id}.out")

    @property
    def train_dir(self) -> Path:
        return self.directory / TRAIN_DIR

    @property
    def cpu_memory_log(self) -> Path:
        return self.directory / CPU_MEMORY_LOG

    def info(self) -> JobInfo:
        """The job's state now: the recorded final state, or the scheduler's answer (recorded when final)."""
        if self.record is None:
            return JobInfo(job_id="", state=NOT_SUBMITTED)
        if self.record.final_state:
            return JobInfo(job_id=self.record.job_id, state=self.record.final_state,
                           exit_code=self.record.exit_code, stdout_path=self.stdout_path)
        try:
            info = self.job.info()
        except ClusterError as lost:
            # The scheduler no longer knows the job (a wiped local state folder, a rebuilt cluster):
            # the run can never finish, so it counts as failed and a new submission may replace it.
            info = JobInfo(job_id=self.record.job_id, state="NODE_FAIL", reason=f"job lost: {lost}",
                           stdout_path=self.stdout_path)
        self.remember(info)
        return info

    def remember(self, info: JobInfo) -> None:
        """Write a final state into job.json (a restarted scheduler reuses job ids; the file does not)."""
        if self.record is not None and info.state in FINAL_STATES and not self.record.final_state:
            self.record = replace(self.record, final_state=info.state, exit_code=info.exit_code)
            self.record.save(self.directory)

    @property
    def state(self) -> str:
        return self.info().state


def load_run(experiment: Experiment, root: Path | str | None = None) -> Run:
    directory = run_directory(experiment, root)
    return Run(experiment, directory, RunRecord.load(directory))


def prepare_run_directory(experiment: Experiment, profile: Profile, directory: Path) -> Path:
    """Render the script into the run directory, with its own copy of the DeepSpeed config; returns the script."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / TRAIN_DIR).mkdir(exist_ok=True)
    deepspeed_config = None
    if experiment.deepspeed_config and not (experiment.engine == "nemo" and profile.nemo.enabled):
        source = DS_CONFIGS_DIR / experiment.deepspeed_config
        if not source.is_file():
            raise WorkshopError(f"DeepSpeed config {source} is missing; it belongs in slurm/ds_configs/ "
                                f"(needed by {experiment.id})")
        # The job reads its own copy: editing the shared config later cannot change a queued job.
        shutil.copyfile(source, directory / DEEPSPEED_CONFIG_NAME)
        deepspeed_config = DEEPSPEED_CONFIG_NAME
    script = directory / SCRIPT_NAME
    script.write_text(render_script(experiment, profile, deepspeed_config=deepspeed_config))
    return script


def submit_experiment(experiment: Experiment, profile: Profile | str | None = None, *,
                      root: Path | str | None = None, force: bool = False, backend: str | None = None,
                      sbatch_args: Sequence[str] = ()) -> Run:
    """Submit one experiment unless an equal run has completed or is still active."""
    profile = load_profile(profile) if not isinstance(profile, Profile) else profile
    run = load_run(experiment, root)
    if run.record is not None:
        info = run.info()
        same = run.record.content_hash == experiment.content_hash and run.record.profile == profile.name
        if info.state not in FINAL_STATES and info.state != "UNKNOWN":
            run.note = f"job {run.record.job_id} is {info.state}: not doubled"
            return run
        if same and info.state == "COMPLETED" and not force:
            run.note = f"reused: job {run.record.job_id} completed"
            return run
        _archive_attempt(run)
    script = prepare_run_directory(experiment, profile, run.directory)
    job = cluster.submit(script, workdir=run.directory, sbatch_args=sbatch_args, backend=backend)
    run.record = RunRecord(experiment_id=experiment.id, content_hash=experiment.content_hash, profile=profile.name,
                           job_id=job.job_id, backend=job.backend,
                           stdout=job.stdout_path.name if job.stdout_path else None,
                           submitted_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    run.record.save(run.directory)
    run.submitted_now = True
    run.note = f"submitted job {job.job_id}"
    return run


def submit_experiments(experiments: Iterable[Experiment], profile: Profile | str | None = None, *,
                       root: Path | str | None = None, force: bool = False, backend: str | None = None,
                       skip_unsupported: bool = True) -> list[Run]:
    """Submit several experiments (the notebooks' entry point).

    Experiments outside the profile's grid (e.g. 8 nodes on the tiny profile) are skipped with a note
    when ``skip_unsupported``; otherwise they raise.
    """
    profile = load_profile(profile) if not isinstance(profile, Profile) else profile
    runs = []
    for experiment in experiments:
        reason = profile.unsupported_reason(experiment)
        if reason and skip_unsupported:
            run = load_run(experiment, root)
            run.note = f"skipped: {reason}"
            runs.append(run)
            continue
        runs.append(submit_experiment(experiment, profile, root=root, force=force, backend=backend))
    return runs


def wait_for_runs(runs: Iterable[Run], timeout: float | None = None, progress: bool = True,
                  poll_interval: float = 1.0) -> list[JobInfo]:
    """Wait until every submitted run has ended; records final states in job.json."""
    runs = [run for run in runs if run.record is not None]
    waiting = [run for run in runs if not run.record.final_state]
    infos = cluster.wait_for([run.job for run in waiting], timeout=timeout, progress=progress,
                             poll_interval=poll_interval) if waiting else []
    for run, info in zip(waiting, infos):
        run.remember(info)
    return [run.info() for run in runs]


@dataclass(frozen=True)
class RunStatus:
    """One line of `workshop status`."""

    experiment_id: str
    state: str
    job_id: str
    profile: str
    current: bool  # the recorded run is of this very experiment (same content hash)
    directory: Path


def run_status(experiments: Iterable[Experiment] | None = None, chapter: int | None = None,
               root: Path | str | None = None) -> list[RunStatus]:
    """The state of each experiment's run (NOT SUBMITTED when it has none)."""
    if experiments is None:
        experiments = select_experiments(chapter=chapter) if chapter else _all()
    statuses = []
    for experiment in experiments:
        run = load_run(experiment, root)
        record = run.record
        statuses.append(RunStatus(
            experiment_id=experiment.id, state=run.info().state, job_id=record.job_id if record else "",
            profile=record.profile if record else "",
            current=bool(record and record.content_hash == experiment.content_hash), directory=run.directory))
    return statuses


def _all() -> list[Experiment]:
    from .experiments import all_experiments

    return all_experiments()


def _archive_attempt(run: Run) -> None:
    """Move the previous attempt's files to attempts/<job id>/ so that no result is lost."""
    target = run.directory / ATTEMPTS_DIR / (run.record.job_id if run.record else "unknown")
    target.mkdir(parents=True, exist_ok=True)
    for entry in list(run.directory.iterdir()):
        if entry.name != ATTEMPTS_DIR:
            shutil.move(str(entry), str(target / entry.name))
