"""The #SBATCH lines of a job: the experiment's shape (nodes, GPUs, tasks, time) and the site's (account,
partition, constraint, reservation).
"""

from __future__ import annotations

from dataclasses import dataclass

from workshop_lib.core.run_directory import STDOUT_PATTERN
from workshop_lib.core.vocabulary import NEMO
from workshop_lib.experiments import Experiment
from workshop_lib.sites.profiles import Profile
from workshop_lib.sites.reservation import find_reservation


@dataclass(frozen=True)
class Directive:
    """One #SBATCH line and the short comment above it."""

    option: str
    value: str
    comment: str

    @property
    def line(self) -> str:
        return f"#SBATCH --{self.option}={self.value}"


def directives(experiment: Experiment, profile: Profile) -> list[Directive]:
    """The #SBATCH lines: the experiment's resources, then the site's placement and limits."""
    if experiment.engine == NEMO:
        # Lightning starts one rank per SLURM task: tasks per node must equal the GPUs per node.
        tasks = Directive("ntasks-per-node", str(experiment.gpus_per_node),
                          "Lightning/NeMo start one process per task: one task per GPU (never --ntasks)")
        processes_per_task = 1
    else:
        tasks = Directive("ntasks-per-node", "1", "one task per node: torchrun starts one process per GPU")
        processes_per_task = experiment.gpus_per_node
    cpus = experiment.cpus_per_task * processes_per_task
    return [
        Directive("job-name", experiment.job_name, "the name squeue and the log show"),
        Directive("nodes", str(experiment.nodes), "nodes of the job"),
        tasks,
        Directive("gpus-per-node", str(experiment.gpus_per_node), "GPUs on each node (not --gpus-per-task)"),
        Directive("cpus-per-task", str(cpus), f"CPU cores per task: {experiment.cpus_per_task} per training process "
                  f"({processes_per_task} in each task) for data loading and offload"),
        Directive("mem", experiment.memory, "host memory per node"),
        *site_directives(profile, time_limit=profile.time_limit(experiment.chapter),
                         gpus_per_node=experiment.gpus_per_node),
        Directive("output", STDOUT_PATTERN, "stdout and stderr, in the run directory sbatch is called from"),
    ]


def site_directives(profile: Profile, time_limit: str, gpus_per_node: int | None = None) -> list[Directive]:
    """The site's placement and limits. With ``gpus_per_node`` the constraint also names the smallest node
    shape that holds them (the profile's scheduler.gpu_node_features), so that a 1-GPU job never waits for, or
    takes, one of the few 8-GPU nodes."""
    scheduler = profile.scheduler
    lines = []
    feature = scheduler.node_feature(gpus_per_node) if gpus_per_node else None
    if feature:
        shape = next(gpus for gpus, name in scheduler.gpu_node_features.items() if name == feature)
        lines.append(Directive("constraint", scheduler.constraint_for(gpus_per_node),
                               f"node features: the GPU type and the {shape}-GPU nodes (the smallest that hold "
                               f"{gpus_per_node} GPU{'s' if gpus_per_node > 1 else ''})"))
    elif scheduler.constraint:
        lines.append(Directive("constraint", scheduler.constraint, "node feature: the GPU type (NeMo needs A100)"))
    if scheduler.partition:
        lines.append(Directive("partition", scheduler.partition, "partition of this site"))
    if scheduler.account:
        lines.append(Directive("account", scheduler.account, "account charged for the job"))
    reservation = find_reservation(profile)
    if reservation:
        lines.append(Directive("reservation", reservation.name,
                               f"the workshop's reserved nodes (set by {reservation.origin})"))
    lines.append(Directive("time", time_limit, "wall-clock limit"))
    return lines


def site_directives_without_gpu_type(profile: Profile, time_limit: str) -> list[Directive]:
    """The site's placement for a CPU-only job (JupyterLab): partition, account, reservation and time,
    without the GPU-type constraint (any compute node will do)."""
    return [line for line in site_directives(profile, time_limit) if line.option != "constraint"]
