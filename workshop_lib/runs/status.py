"""Waiting for runs and saying where they stand: the status table, and why an ended run ended as it did."""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

from workshop_lib import jobs as cluster
from workshop_lib.experiments import Experiment, select_experiments
from workshop_lib.jobs.states import COMPLETED, HELD, UNKNOWN, JobInfo
from workshop_lib.core.errors import ClusterError
from workshop_lib.runs.run import (
    Run, earlier_attempts, earlier_attempts_of, load_run, may_hold_unrecorded_jobs, query_runs, unrecorded_jobs,
)
from workshop_lib.runs.submit import first_line

if TYPE_CHECKING:
    from workshop_lib.jobs.failures import Explanation


def wait_for_runs(runs: Iterable[Run], timeout: float | None = None, progress: bool = True,
                  poll_interval: float | None = None,
                  on_poll: Callable[[list[tuple[Run, JobInfo]]], None] | None = None) -> list[JobInfo]:
    """Wait until every submitted run has ended; records final states in job.json.
    `on_poll` gets every run with its state after each poll (a job monitor shows them)."""
    runs = [run for run in runs if run.record is not None]
    waiting = [run for run in runs if not run.record.final_state]
    recorded = {id(run): run.info() for run in runs if run.record.final_state}  # from job.json: no scheduler call

    def report(infos: list[JobInfo]) -> None:
        latest = {id(run): info for run, info in zip(waiting, infos)}
        on_poll([(run, latest.get(id(run)) or recorded[id(run)]) for run in runs])

    infos = cluster.wait_for([run.job for run in waiting], timeout=timeout, progress=progress,
                             poll_interval=poll_interval, on_poll=report if on_poll else None) if waiting else []
    if on_poll is not None and not waiting:
        report([])
    for run, info in zip(waiting, infos):
        run.remember(info)
    latest = {id(run): info for run, info in zip(waiting, infos)}
    return [latest.get(id(run)) or run.info() for run in runs]


def explain_run(run: Run, info: JobInfo, attempts: tuple[str, ...] | None = None) -> Explanation:
    """The failure explanation of a run that did not complete (failures.explain with the run's log, the
    estimator's prediction, and the earlier attempts of a requeued job). A view of several runs passes
    `attempts` from its one `earlier_attempts_of` call; without it, sacct is asked for this run alone."""
    from workshop_lib.jobs.failures import explain

    return explain(info, run.stdout_path, predicted=_predicted_memory(run),
                   earlier_attempts=earlier_attempts(run) if attempts is None else attempts)


def explain_runs(pairs: Sequence[tuple[Run, JobInfo]]) -> list[Explanation]:
    """`explain_run` of several ended runs, with one sacct call for all their earlier attempts."""
    requeued = earlier_attempts_of([run for run, _ in pairs])
    return [explain_run(run, info, requeued.get(id(run), ())) for run, info in pairs]


def _predicted_memory(run: Run) -> str | None:
    """The estimator's per-GPU figure, for a run that trained the experiment's own model on GPUs; None for one
    whose profile realised it otherwise (the tiny profile: a tiny model on CPUs, where the real model's GPU figure
    says nothing about why the run ran out of memory)."""
    experiment = run.experiment
    if not _ran_the_real_model_on_gpus(run):
        return None
    try:
        from workshop_lib.estimate.memory import estimate_memory
        from workshop_lib.estimate.report import setup_from_experiment

        estimate = estimate_memory(experiment.model, setup_from_experiment(experiment))
    except Exception:  # noqa: BLE001 - a model the estimator does not know: no prediction, no failure
        return None
    return f"{estimate.total / 2**30:.1f} GiB per GPU (`workshop estimate {experiment.id}`)"


def _ran_the_real_model_on_gpus(run: Run) -> bool:
    from workshop_lib.core.errors import WorkshopError
    from workshop_lib.sites.profiles import load_profile

    if run.record is None:
        return False
    try:
        profile = load_profile(run.record.profile)
    except WorkshopError:
        return False  # a profile given as a path, or one this checkout lacks: no claim is better than a wrong one
    return profile.has_nvidia_smi and profile.model_name(run.experiment.model) == run.experiment.model


# ---- reading: status ----------------------------------------------------------------------------
@dataclass(frozen=True)
class RunStatus:
    """One line of `workshop status`."""

    experiment_id: str
    state: str
    job_id: str
    profile: str
    current: bool  # the recorded run is of this very experiment (same content hash)
    directory: Path
    explanation: str = ""  # why a run did not complete (or why its record cannot be read)


def run_status(experiments: Iterable[Experiment] | None = None, chapter: int | None = None,
               root: Path | str | None = None) -> list[RunStatus]:
    """The state of each experiment's run (NOT SUBMITTED when it has none); asks the scheduler once for
    all active runs and writes nothing."""
    if experiments is None:
        experiments = select_experiments(chapter=chapter) if chapter else _all()
    runs = [load_run(experiment, root) for experiment in experiments]
    infos = query_runs(runs)
    requeued = earlier_attempts_of([run for run, info in zip(runs, infos) if info.state != UNKNOWN])
    statuses = []
    for run, info in zip(runs, infos):
        record = run.record
        explanation = run.damage or ""
        if record is not None and info.finished and info.state != COMPLETED:
            explanation = explain_run(run, info, requeued.get(id(run), ())).text()
        elif info.state == UNKNOWN:
            explanation = f"the scheduler does not answer: {first_line(info.reason)}"
        elif requeued.get(id(run)):
            explanation = "\n".join(f"earlier attempt: {attempt} (SLURM requeued the job; its log holds both "
                                     "attempts)" for attempt in requeued[id(run)])
        state, job_id = info.state, record.job_id if record else ""
        if may_hold_unrecorded_jobs(run) and not run.damage:
            unrecorded, said = _unrecorded(run)
            explanation = "\n".join(filter(None, [explanation, said]))
            if unrecorded and record is None:  # a held job waits: the run is on its way, not "not submitted"
                state, job_id = unrecorded[0].state, unrecorded[0].job_id
        statuses.append(RunStatus(
            experiment_id=run.experiment.id, state=state, job_id=job_id,
            profile=record.profile if record else "",
            current=bool(record and record.content_hash == run.experiment.content_hash), directory=run.directory,
            explanation=explanation))
    return statuses


def _unrecorded(run: Run) -> tuple[list[JobInfo], str]:
    """The jobs waiting in a run folder where a submission was interrupted, and what status says of them."""
    try:
        found = unrecorded_jobs(run)
    except ClusterError as error:
        return [], (f"a submission was interrupted here and the scheduler does not answer ({first_line(error)}), "
                    "so a job of it may wait unseen: `workshop status` again later")
    if found and _submitter_alive(run.files.reservation):
        return found, "\n".join(f"job {info.job_id} ({info.state}) is being submitted right now: its submitter "
                                 "still runs and records it in a moment" for info in found)
    command = f"`workshop submit {run.experiment.id}` (or re-running the chapter)"
    return found, "\n".join(
        f"job {info.job_id} ({info.state}{', held' if info.reason == HELD else ''}) waits in this run "
        f"folder but job.json does not name it: a job of an interrupted submission. {command} settles it "
        f"(adopted when it is the run's one new job, else cancelled); `workshop cancel {run.experiment.id}` "
        "cancels it" for info in found)


def _submitter_alive(reservation: Path) -> bool:
    """Whether the process that wrote a reservation still runs (on this machine: a pid elsewhere says nothing)."""
    try:
        noted = json.loads(reservation.read_text())
        if noted.get("host") != socket.gethostname():
            return False
        os.kill(int(noted["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
    return True


def _all() -> list[Experiment]:
    from workshop_lib.experiments import all_experiments

    return all_experiments()
