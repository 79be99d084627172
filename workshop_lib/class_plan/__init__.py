"""The class: a day of many participants on one reservation. Which runs each participant makes, which the class
splits and which the instructor makes before the day (roles.py); the nodes, Ibex's A100 shapes and a reservation
read from SLURM (nodes.py); the day's jobs packed on those nodes as SLURM packs them (simulate.py); the plan, its
length, GPU-hours by node shape and the smallest reservation that fits (plan.py).
May import: core, experiments, sites, checks and scripts (the same #SBATCH lines the job scripts carry); the
book composes it with the chapter time plan's durations (workshop_lib.book.plans.day_plan).
"""

from workshop_lib.class_plan.nodes import (
    IBEX_4GPU,
    IBEX_8GPU,
    IBEX_A100_NODES,
    INVENTORY_SOURCE,
    Node,
    NodeShape,
    ReservationLookupError,
    ReservationNodes,
    counts_of,
    describe_counts,
    nodes_of,
    parse_nodes,
    parse_reservation,
    read_reservation,
)
from workshop_lib.class_plan.plan import (
    DAY_TARGET_S,
    ChapterDay,
    ClassJobs,
    ClassPlan,
    PlanError,
    build_plan,
    class_jobs,
    plan_on,
    planned_job,
    smallest_reservation,
)
from workshop_lib.class_plan.roles import (
    CLASS_ROLES,
    CORE,
    INSTRUCTOR,
    SPLIT,
    ChapterRoles,
    assign,
    participant_names,
    role_of,
    unnamed_runs,
)
from workshop_lib.class_plan.simulate import Placement, PlannedJob, Schedule, simulate

__all__ = [
    "CLASS_ROLES", "CORE", "DAY_TARGET_S", "IBEX_4GPU", "IBEX_8GPU", "IBEX_A100_NODES", "INSTRUCTOR",
    "INVENTORY_SOURCE", "SPLIT", "ChapterDay", "ChapterRoles", "ClassJobs", "ClassPlan", "Node", "NodeShape", "Placement",
    "PlanError", "PlannedJob", "ReservationLookupError", "ReservationNodes", "Schedule", "assign", "build_plan", "class_jobs",
    "counts_of", "describe_counts", "nodes_of", "parse_nodes", "parse_reservation", "participant_names",
    "plan_on", "planned_job", "read_reservation", "role_of", "simulate", "smallest_reservation", "unnamed_runs",
]
