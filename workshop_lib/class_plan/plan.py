"""The class plan: every chapter's runs dealt out to the participants (roles.py), each job as the site's scripts ask
for it (GPUs, cores, memory and node features per node, from the same #SBATCH directives the scripts carry),
simulated on the reservation's nodes (simulate.py); the day's length, the GPU-hours by node shape, and the smallest
reservation that holds the day within its target."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from workshop_lib.checks.requests import mem_gib
from workshop_lib.class_plan.nodes import (
    IBEX_A100_NODES,
    PER_USER_GPU_CAP,
    Node,
    NodeShape,
    describe_counts,
    nodes_of,
)
from workshop_lib.class_plan.roles import CLASS_ROLES, Assignment, ChapterRoles, assign, participant_names
from workshop_lib.class_plan.simulate import PlannedJob, Schedule, simulate
from workshop_lib.core.errors import WorkshopError
from workshop_lib.experiments import CHAPTERS, Experiment
from workshop_lib.scripts.directives import directives
from workshop_lib.sites.profiles import Profile, load_profile

DAY_TARGET_S = 5 * 3600.0  # jobs of the whole day, chapters one after the other
INSTRUCTOR = "instructor"


class PlanError(WorkshopError):
    """The class plan cannot be made as asked; the message says what to change."""


def planned_job(experiment: Experiment, user: str, profile: Profile, duration_s: float) -> PlannedJob:
    """The job as the site's script asks for it: the same #SBATCH lines the renderer writes."""
    lines = {directive.option: directive.value for directive in directives(experiment, profile)}
    memory = mem_gib(lines.get("mem"))
    return PlannedJob(
        user=user, experiment_id=experiment.id, nodes=int(lines["nodes"]),
        gpus_per_node=int(lines["gpus-per-node"]),
        cpus_per_node=int(lines["ntasks-per-node"]) * int(lines["cpus-per-task"]),
        memory_mib=int(memory * 1024) if memory else 0,
        features=frozenset(word for word in lines.get("constraint", "").split(",") if word),
        duration_s=duration_s)


@dataclass(frozen=True)
class ChapterDay:
    chapter: int
    assignment: Assignment
    jobs: tuple[PlannedJob, ...]
    schedule: Schedule


@dataclass(frozen=True)
class ClassPlan:
    participants: tuple[str, ...]
    nodes: tuple[Node, ...]
    where: str  # "reservation NAME" or "16 four-GPU + 2 eight-GPU nodes (80 GPUs)"
    chapters: tuple[ChapterDay, ...]
    instructor_jobs: tuple[PlannedJob, ...]
    instructor_schedule: Schedule  # the instructor's runs alone on the same nodes, before the day
    cap: int
    target_s: float

    @property
    def day_s(self) -> float:
        """Chapters run one after the other: the day's jobs take the sum of the chapters' makespans."""
        return sum(day.schedule.makespan_s for day in self.chapters)

    @property
    def fits(self) -> bool:
        return self.day_s <= self.target_s and not self.never

    @property
    def never(self) -> tuple[PlannedJob, ...]:
        return tuple(job for day in self.chapters for job in day.schedule.never)

    def missing_shapes(self) -> list[str]:
        """One line per kind of participant job no node of this plan can hold (a missing shape or feature)."""
        lines: dict[tuple, list[str]] = {}
        for job in self.never:
            key = (tuple(sorted(job.features)), job.gpus_per_node, job.nodes)
            lines.setdefault(key, [])
            if job.experiment_id not in lines[key]:
                lines[key].append(job.experiment_id)
        return [f"{self.where} has no {'' if nodes == 1 else f'{nodes} '}node{'s' if nodes > 1 else ''} with the "
                f"features {','.join(features) or '(none)'}, {gpus} GPU{'s' if gpus > 1 else ''} and the job's cores and memory, needed by "
                f"{', '.join(ids)}" for (features, gpus, nodes), ids in lines.items()]

    def gpu_hours(self, jobs_of: str = "participants") -> dict[int, float]:
        """GPU-hours by node shape (GPUs per node of the nodes the jobs ran on)."""
        shapes = {node.name: node.shape.gpus for node in self.nodes}
        schedules = [day.schedule for day in self.chapters] if jobs_of == "participants" else [self.instructor_schedule]
        hours: dict[int, float] = {}
        for schedule in schedules:
            for placement in schedule.placements:
                gpus = shapes[placement.nodes[0]]
                hours[gpus] = hours.get(gpus, 0.0) + placement.job.gpus * placement.job.duration_s / 3600
        return hours


@dataclass(frozen=True)
class ClassJobs:
    """The day's jobs before they meet nodes: each chapter's assignment and jobs, and the instructor's."""

    participants: tuple[str, ...]
    chapters: tuple[tuple[Assignment, tuple[PlannedJob, ...]], ...]
    instructor: tuple[PlannedJob, ...]


def class_jobs(participants: int, durations: Mapping[str, float], profile: Profile | str = "ibex",
               roles: dict[int, ChapterRoles] = CLASS_ROLES, chapters: Sequence[int] = tuple(CHAPTERS)) -> ClassJobs:
    """Every chapter's runs dealt out to ``participants``; ``durations`` maps each experiment id to its planned
    seconds on the site (the chapter time plan's figure)."""
    names = participant_names(participants)
    profile = load_profile(profile)
    days, instructor, start = [], [], 0
    for chapter in chapters:
        assignment, start = assign(chapter, names, start, roles)
        jobs = tuple(planned_job(experiment, name, profile, _duration(durations, experiment))
                     for name in names for experiment in assignment.by_participant[name])
        days.append((assignment, jobs))
        instructor += [planned_job(experiment, INSTRUCTOR, profile, _duration(durations, experiment))
                       for experiment in assignment.instructor]
    return ClassJobs(names, tuple(days), tuple(instructor))


def plan_on(jobs: ClassJobs, nodes: Sequence[Node], where: str, cap: int = PER_USER_GPU_CAP,
            target_s: float = DAY_TARGET_S) -> ClassPlan:
    """The class's jobs simulated on ``nodes``, chapter after chapter; the instructor's alone, before the day."""
    if not nodes:
        raise PlanError(f"{where} holds no nodes: give node counts (--nodes-4gpu N --nodes-8gpu M) or a reservation "
                        "with nodes")
    days = tuple(ChapterDay(assignment.chapter, assignment, chapter_jobs, simulate(chapter_jobs, nodes, cap))
                 for assignment, chapter_jobs in jobs.chapters)
    return ClassPlan(jobs.participants, tuple(nodes), where, days, jobs.instructor,
                     simulate(jobs.instructor, nodes, cap), cap, target_s)


def build_plan(participants: int, durations: Mapping[str, float], nodes: Sequence[Node], where: str,
               profile: Profile | str = "ibex", cap: int = PER_USER_GPU_CAP, target_s: float = DAY_TARGET_S,
               roles: dict[int, ChapterRoles] = CLASS_ROLES, chapters: Sequence[int] = tuple(CHAPTERS)) -> ClassPlan:
    """The class plan for ``participants`` on ``nodes``."""
    return plan_on(class_jobs(participants, durations, profile, roles, chapters), nodes, where, cap, target_s)


def _duration(durations: Mapping[str, float], experiment: Experiment) -> float:
    if experiment.id not in durations:
        raise PlanError(f"no planned duration for {experiment.id}: the chapter time plan estimates every run "
                        "(workshop_lib.book.plans.time_plan)")
    return durations[experiment.id]


def smallest_reservation(jobs: ClassJobs, cap: int = PER_USER_GPU_CAP, target_s: float = DAY_TARGET_S,
                         inventory: Mapping[NodeShape, int] = IBEX_A100_NODES) -> ClassPlan | None:
    """The plan on the fewest GPUs (then the fewest large nodes) of the site's inventory whose day fits the
    target; None if even the whole inventory does not."""
    shapes = sorted(inventory, key=lambda shape: shape.gpus)
    small, large = shapes[0], shapes[-1]
    best: ClassPlan | None = None

    def plan_for(small_count: int, large_count: int) -> ClassPlan:
        counts = {small: small_count, large: large_count} if large is not small else {small: small_count}
        return plan_on(jobs, nodes_of(counts), describe_counts(counts), cap, target_s)

    def gpus(plan: ClassPlan) -> int:
        return sum(node.shape.gpus for node in plan.nodes)

    for large_count in range(0, inventory[large] + 1 if large is not small else 1):
        if best is not None and large_count * large.gpus >= gpus(best):
            break  # more large nodes alone hold more GPUs than the best plan
        if not plan_for(inventory[small], large_count).fits:
            continue
        low, high = 1, inventory[small]
        while low < high:  # the fewest small nodes that fit, with this many large ones
            middle = (low + high) // 2
            if plan_for(middle, large_count).fits:
                high = middle
            else:
                low = middle + 1
        plan = plan_for(low, large_count)
        if best is None or gpus(plan) < gpus(best):
            best = plan
    return best
