"""The class day, in numbers and words: the class plan (workshop_lib.class_plan) with each run's duration from the
chapter time plan, the report `workshop class plan` prints, and the agenda the book's day plan page shows. Every
figure comes from the plan; only the minutes for reading and questions are the workshop's choice (AGENDA)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from workshop_lib.book.plans.time_plan import CAP_SOURCE, estimate_chapter
from workshop_lib.class_plan import (
    DAY_TARGET_S,
    IBEX_4GPU,
    IBEX_8GPU,
    INVENTORY_SOURCE,
    ClassJobs,
    ClassPlan,
    Node,
    PlanError,
    class_jobs,
    describe_counts,
    nodes_of,
    plan_on,
    smallest_reservation,
)
from workshop_lib.class_plan.roles import PARTICIPANT_VARIABLE
from workshop_lib.experiments import CHAPTERS, all_experiments

INSTRUCTOR_COLUMN = "read from the instructor's runs"


@dataclass(frozen=True)
class AgendaTimes:
    """A chapter's time around its jobs: reading and predicting before submitting, results and questions after,
    and what to do while the jobs queue and run."""

    reading_min: int
    questions_min: int
    while_running: str


AGENDA = {
    1: AgendaTimes(25, 15, "read the reference runs' tables (measured on real GPUs) and predict how your step time "
                           "and memory change with the GPUs; questions 1-3"),
    2: AgendaTimes(30, 20, "work through the memory calculator for the Mixtral layouts and the instructor's Mixtral "
                           "results (read, not run); questions 1-4 and 8"),
    3: AgendaTimes(20, 15, "compare the ZeRO stages' predicted memory with the reference tables; predict what CPU "
                           "offload costs in time; questions of the single-GPU part"),
    4: AgendaTimes(20, 15, "read the FSDP strategies and the NCCL bandwidth check; predict the weak-scaling rows; "
                           "questions of the strategies part"),
}
# A chapter of the registry without its own agenda yet: the class day still plans it, with these times.
DEFAULT_AGENDA = AgendaTimes(20, 15, "read the reference runs' tables and predict your runs' rows")


def class_durations(profile: str = "ibex") -> dict[str, float]:
    """Each experiment's planned seconds on the site: the chapter time plan's figure (its high estimate, or
    the time limit where nothing was measured)."""
    return {estimate.experiment.id: estimate.planned_s for estimate in estimate_chapter(all_experiments(), profile)}


def class_jobs_for(participants: int, profile: str = "ibex") -> ClassJobs:
    return class_jobs(participants, class_durations(profile), profile)


def node_counts(nodes_4gpu: int, nodes_8gpu: int) -> tuple[Node, ...]:
    """Ibex A100 nodes by count; a count below 0 or no node at all is an error that says what to give."""
    if nodes_4gpu < 0 or nodes_8gpu < 0:
        raise PlanError(f"--nodes-4gpu {nodes_4gpu} --nodes-8gpu {nodes_8gpu}: node counts are 0 or more")
    if nodes_4gpu + nodes_8gpu == 0:
        raise PlanError("no nodes to plan on: give --nodes-4gpu N and/or --nodes-8gpu M (e.g. --nodes-4gpu 16 "
                        "--nodes-8gpu 2), or --reservation NAME")
    return nodes_of({IBEX_4GPU: nodes_4gpu, IBEX_8GPU: nodes_8gpu})


def _minutes(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{seconds / 60:.0f} min"


def _gpus(count: int) -> str:
    return f"{count} GPU" + ("s" if count > 1 else "")


def _runs(experiments) -> str:
    return ", ".join(f"{e.id} ({_gpus(e.gpus)})" for e in experiments) or "none"


def _short(names: tuple[str, ...]) -> str:
    numbers = [name.rsplit("-", 1)[-1] for name in names]
    return "participants " + ", ".join(numbers) if numbers else "nobody"


def describe_plan(plan: ClassPlan, smallest: ClassPlan | None, durations: dict[str, float],
                  users: tuple[str, ...] = ()) -> str:
    """The report of `workshop class plan`: per chapter who makes which runs and how long the jobs take, the day,
    GPU-hours by node shape, the instructor's runs and the smallest reservation that fits."""
    lines = [f"Class plan: {len(plan.participants)} participants on {plan.where}; at most {plan.cap} GPUs per user "
             f"in running jobs ({CAP_SOURCE}). Durations: the chapter time plans' A100 estimates."]
    for day in plan.chapters:
        assignment, schedule = day.assignment, day.schedule
        lines += ["", f"Chapter {day.chapter} ({CHAPTERS[day.chapter]}): {len(day.jobs)} jobs, "
                      f"{sum(job.gpus for job in day.jobs)} GPUs asked in all; last job ends "
                      f"{_minutes(schedule.makespan_s)} after the chapter's first submission"]
        core = assignment.core
        lines.append(f"  every participant makes: {_runs(core)}" if core else
                     "  every participant makes: one of the shared runs below (at least one job of their own)")
        for experiment, makers in assignment.split:
            lines.append(f"  split: {experiment.id} ({_gpus(experiment.gpus)}, {_minutes(durations[experiment.id])}) "
                         f"by {len(makers)}: {_short(makers)}")
        if assignment.instructor:
            lines.append(f"  instructor, once before the day: {_runs(assignment.instructor)}")
        without = [name for name, runs in assignment.by_participant.items() if not runs]
        if without:
            lines.append(f"  ! {len(without)} participant(s) have no job of their own: {_short(tuple(without))}")
        if schedule.never:
            lines.append(f"  ! {len(schedule.never)} job(s) can never start on these nodes (see below)")
    count = len(plan.participants)
    lines += ["", f"Each participant exports {PARTICIPANT_VARIABLE}=K/{count} (K: their number above, 1 to {count}) "
                  "before starting JupyterLab: each chapter then submits that participant's runs only."]
    if users:
        lines.append("Numbers by the reservation's users: " + ", ".join(
            f"{index + 1} {user}" for index, user in enumerate(users[:count])))
    verdict = "fits" if plan.fits else "does NOT fit"
    lines += ["", f"The day: {plan.day_s / 3600:.2f} h of jobs, chapters one after the other (target "
                  f"{plan.target_s / 3600:g} h): {verdict}. Most GPUs one participant holds at once: "
                  f"{max(day.schedule.peak_user_gpus for day in plan.chapters)} (cap {plan.cap})."]
    hours = plan.gpu_hours()
    lines.append("GPU-hours of the participants' jobs: " + ", ".join(
        f"{value:.0f} on {gpus}-GPU nodes" for gpus, value in sorted(hours.items())) + ".")
    instructor = plan.instructor_schedule
    if plan.instructor_jobs:
        hours = plan.gpu_hours("instructor")
        lines.append(f"Instructor's runs before the day: {len(plan.instructor_jobs)} jobs, " + ", ".join(
            f"{value:.0f} GPU-hours on {gpus}-GPU nodes" for gpus, value in sorted(hours.items()))
            + f"; {instructor.makespan_s / 3600:.1f} h on these nodes (runs never measured count their time limit)."
            + (f" {len(instructor.never)} of them cannot run on these nodes." if instructor.never else ""))
    for line in plan.missing_shapes():
        lines.append(f"! Missing: {line}")
    if smallest is not None:
        lines.append(f"Smallest reservation that fits ({INVENTORY_SOURCE}: 46 four-GPU and 8 eight-GPU A100 nodes): "
                     f"{smallest.where}, {smallest.day_s / 3600:.2f} h of jobs. Ask for it with the node features "
                     "a100,4gpus and a100,8gpus.")
    else:
        lines.append("No reservation of Ibex's A100 nodes holds this day within the target: raise --hours or cut runs.")
    return "\n".join(lines)


def agenda(plan: ClassPlan) -> pd.DataFrame:
    """The day, one row per chapter: reading, the jobs (the plan's makespan), results and questions, what to do
    while the jobs run; the core and split runs and the instructor's."""
    rows, clock = [], 0.0
    for day in plan.chapters:
        times = AGENDA.get(day.chapter, DEFAULT_AGENDA)
        running = math.ceil(day.schedule.makespan_s / 300) * 5  # minutes, rounded up to 5
        length = times.reading_min + running + times.questions_min
        rows.append({
            "chapter": f"{day.chapter}. {CHAPTERS[day.chapter]}",
            "starts at": f"{int(clock // 60)}:{int(clock % 60):02d}",
            "reading (min)": times.reading_min, "jobs running (min)": running,
            "results and questions (min)": times.questions_min,
            "everyone runs": ", ".join(e.id for e in day.assignment.core) or "one of the shared runs",
            "split across the class": ", ".join(f"{e.id} (×{len(makers)})" for e, makers in day.assignment.split),
            INSTRUCTOR_COLUMN: ", ".join(e.id for e in day.assignment.instructor) or "—",
            "while the jobs run": times.while_running})
        clock += length
    return pd.DataFrame(rows)


def day_length_min(frame: pd.DataFrame) -> int:
    return int(frame[["reading (min)", "jobs running (min)", "results and questions (min)"]].to_numpy().sum())


__all__ = ["AGENDA", "AgendaTimes", "agenda", "class_durations", "class_jobs_for", "day_length_min",
           "day_plan_markdown", "describe_plan", "node_counts"]


def day_plan_markdown(participants: int = 30, nodes_4gpu: int = 16, nodes_8gpu: int = 2,
                      target_s: float = DAY_TARGET_S) -> tuple[str, pd.DataFrame]:
    """The book's day plan page: the day and the reservation in words (Markdown) and the agenda, every number
    from the class plan."""
    durations = class_durations()
    jobs = class_jobs(participants, durations)
    plan = plan_on(jobs, node_counts(nodes_4gpu, nodes_8gpu), describe_counts(
        {IBEX_4GPU: nodes_4gpu, IBEX_8GPU: nodes_8gpu}), target_s=target_s)
    smallest = smallest_reservation(jobs, target_s=target_s)
    frame = agenda(plan)
    hours = plan.gpu_hours()
    instructor_hours = plan.gpu_hours("instructor")
    lines = [
        f"A class of **{participants} participants** on **{plan.where}**, all four chapters, one after the other. "
        f"The jobs of the whole day take **{plan.day_s / 3600:.1f} h** by the class plan's simulation "
        f"(target {target_s / 3600:g} h: {'fits' if plan.fits else 'does not fit'}); with reading, results and "
        f"questions the day is about **{day_length_min(frame) / 60:.1f} h**, breaks not counted.",
        "",
        "- GPU-hours of the participants' jobs: "
        + ", ".join(f"{value:.0f} on {gpus}-GPU nodes" for gpus, value in sorted(hours.items())) + ".",
        f"- The instructor's runs, once before the day: {len(plan.instructor_jobs)} jobs, "
        + ", ".join(f"{value:.0f} GPU-hours on {gpus}-GPU nodes" for gpus, value in sorted(instructor_hours.items()))
        + f", about {plan.instructor_schedule.makespan_s / 3600:.0f} h on the reservation's 8-GPU nodes (runs never "
        "measured count their full time limit). Their results are what the class reads where a table needs two "
        "8-GPU nodes.",
        f"- Most GPUs one participant holds at once: {max(day.schedule.peak_user_gpus for day in plan.chapters)}, "
        f"under KAUST's cap of {plan.cap} ({CAP_SOURCE}).",
    ]
    if smallest is not None:
        lines.append(f"- The smallest reservation that holds the day within {target_s / 3600:g} h: **{smallest.where}** "
                     f"({smallest.day_s / 3600:.1f} h of jobs), of Ibex's 46 four-GPU and 8 eight-GPU A100 nodes "
                     f"({INVENTORY_SOURCE}).")
    return "\n".join(lines), frame
