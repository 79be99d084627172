"""A class's jobs on a set of nodes, packed as SLURM packs them: a job starts when enough nodes carry its features
and have its GPUs, cores and memory free (per node), and its user stays within the per-user GPU cap of running
jobs. Jobs are considered in submission order at every moment something ends; a later job that fits starts
before an earlier one that does not (backfill), and within the nodes that fit, the fullest are filled first
(best fit, so small jobs leave whole nodes for large ones)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from workshop_lib.class_plan.nodes import Node


@dataclass(frozen=True)
class PlannedJob:
    """One job of the day, in the terms the scheduler sees: who, how many nodes, and per node what it takes."""

    user: str
    experiment_id: str
    nodes: int
    gpus_per_node: int
    cpus_per_node: int
    memory_mib: int  # --mem, per node
    features: frozenset[str]  # --constraint words, all required
    duration_s: float

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def fits_shape(self, node: Node) -> bool:
        shape = node.shape
        return (self.features <= shape.features and self.gpus_per_node <= shape.gpus
                and self.cpus_per_node <= shape.cpus and self.memory_mib <= shape.memory_mib)


@dataclass(frozen=True)
class Placement:
    job: PlannedJob
    start_s: float
    end_s: float
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class Schedule:
    placements: tuple[Placement, ...]
    never: tuple[PlannedJob, ...]  # jobs no set of these nodes can hold (missing shape, too large)
    peak_user_gpus: int  # the most GPUs one user held in running jobs at once

    @property
    def makespan_s(self) -> float:
        return max((p.end_s for p in self.placements), default=0.0)


def simulate(jobs: Sequence[PlannedJob], nodes: Sequence[Node], cap: int) -> Schedule:
    """When each job starts and ends if all are submitted at time 0 in this order."""
    free = {node.name: [node.shape.gpus, node.shape.cpus, node.shape.memory_mib] for node in nodes}
    eligible = {id(job): [node.name for node in nodes if job.fits_shape(node)] for job in jobs}
    never = tuple(job for job in jobs if len(eligible[id(job)]) < job.nodes or job.gpus > cap)
    left_out = {id(job) for job in never}
    pending = [job for job in jobs if id(job) not in left_out]
    running: list[tuple[float, Placement]] = []
    held: dict[str, int] = {}
    placements, peak, now = [], 0, 0.0
    while pending:
        waiting = []
        for job in pending:
            chosen = _place(job, eligible[id(job)], free) if held.get(job.user, 0) + job.gpus <= cap else None
            if chosen is None:
                waiting.append(job)
                continue
            for name in chosen:
                free[name][0] -= job.gpus_per_node
                free[name][1] -= job.cpus_per_node
                free[name][2] -= job.memory_mib
            held[job.user] = held.get(job.user, 0) + job.gpus
            peak = max(peak, held[job.user])
            placement = Placement(job, now, now + job.duration_s, chosen)
            placements.append(placement)
            running.append((placement.end_s, placement))
        pending = waiting
        if not pending:
            break
        now = min(end for end, _ in running)  # the next moment something ends
        for end, placement in [item for item in running if item[0] <= now]:
            running.remove((end, placement))
            job = placement.job
            for name in placement.nodes:
                free[name][0] += job.gpus_per_node
                free[name][1] += job.cpus_per_node
                free[name][2] += job.memory_mib
            held[job.user] -= job.gpus
    return Schedule(tuple(placements), never, peak)


def _place(job: PlannedJob, names: list[str], free: dict[str, list[int]]) -> tuple[str, ...] | None:
    """The job's nodes: those with room, fullest first (fewest free GPUs), or None if too few have room."""
    room = [name for name in names if free[name][0] >= job.gpus_per_node and free[name][1] >= job.cpus_per_node
            and free[name][2] >= job.memory_mib]
    if len(room) < job.nodes:
        return None
    room.sort(key=lambda name: free[name][0])
    return tuple(room[:job.nodes])
