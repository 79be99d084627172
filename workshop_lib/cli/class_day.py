"""`workshop class plan`: the class day for N participants on a reservation (read from SLURM) or on node counts.
It adds its verb to the `workshop class` group that cli/class_pool.py makes."""

from __future__ import annotations

import argparse
import re

from workshop_lib.core.errors import WorkshopError


def register(subparsers: argparse._SubParsersAction) -> None:
    from workshop_lib.cli.class_pool import class_verbs

    plan = class_verbs(subparsers).add_parser(
        "plan", help="which runs each participant makes, how long the day's jobs take, the reservation to ask for",
        description="Deal every chapter's runs out to the participants (the core everyone makes, the runs split "
        "across the class, the instructor's runs before the day), simulate the jobs on the reservation's nodes as "
        "SLURM packs them, and print the day's length, GPU-hours by node shape and the smallest reservation that "
        "fits.")
    plan.add_argument("--participants", type=int, required=True, metavar="N", help="participants in the class")
    plan.add_argument("--reservation", metavar="NAME",
                      help="read the nodes from `scontrol show reservation NAME` (on the cluster)")
    plan.add_argument("--nodes-4gpu", type=int, metavar="N", help="4-GPU A100 nodes (default 16 without --reservation)")
    plan.add_argument("--nodes-8gpu", type=int, metavar="M", help="8-GPU A100 nodes (default 2 without --reservation)")
    plan.add_argument("--hours", type=float, default=5.0, help="the day's target for jobs, in hours (default 5)")
    plan.add_argument("--profile", default="ibex", help="the site profile whose scripts the jobs are (default ibex)")
    plan.set_defaults(handler=run_plan)


def run_plan(args: argparse.Namespace) -> int:
    from workshop_lib.book.plans.day_plan import class_durations, describe_plan, node_counts
    from workshop_lib.class_plan import (
        class_jobs,
        counts_of,
        describe_counts,
        plan_on,
        read_reservation,
        smallest_reservation,
    )
    from workshop_lib.sites.reservation import RESERVATION

    if args.participants < 1:
        raise WorkshopError(f"--participants {args.participants}: a class has at least 1 participant "
                            "(e.g. --participants 30)")
    if not args.hours > 0:
        raise WorkshopError(f"--hours {args.hours}: the day's target must be more than 0 hours (e.g. --hours 5)")
    if args.reservation is not None and (args.nodes_4gpu is not None or args.nodes_8gpu is not None):
        raise WorkshopError("give either --reservation NAME or node counts (--nodes-4gpu N --nodes-8gpu M), not both")
    if args.reservation is not None:
        if not re.fullmatch(RESERVATION.pattern, args.reservation):
            raise WorkshopError(f"--reservation {args.reservation!r} is not {RESERVATION.expected}: give the name "
                                "`scontrol show reservation` lists")
        reservation = read_reservation(args.reservation)
        nodes, users = reservation.nodes, reservation.users
        where = f"reservation {reservation.name} ({describe_counts(counts_of(nodes))}, {reservation.start} to " \
                f"{reservation.end}, {reservation.state})"
    else:
        nodes = node_counts(16 if args.nodes_4gpu is None else args.nodes_4gpu,
                            2 if args.nodes_8gpu is None else args.nodes_8gpu)
        where, users = describe_counts(counts_of(nodes)), ()
    target = args.hours * 3600
    durations = class_durations(args.profile)
    jobs = class_jobs(args.participants, durations, args.profile)
    plan = plan_on(jobs, nodes, where, target_s=target)
    print(describe_plan(plan, smallest_reservation(jobs, target_s=target), durations, users=users))
    return 0 if plan.fits else 1
