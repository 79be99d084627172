"""`workshop cluster up|down|status|env` and `workshop jobs`."""

from __future__ import annotations

import argparse
import re
import shlex
import sys
import time
from pathlib import Path

from workshop_lib.core.errors import WorkshopError


def register(subparsers: argparse._SubParsersAction) -> None:
    cluster = subparsers.add_parser("cluster", help="start, stop or inspect the local SLURM cluster")
    actions = cluster.add_subparsers(dest="action", metavar="ACTION", required=True)

    up = actions.add_parser("up", help="start the local cluster (installs SLURM if missing; needs root)")
    up.add_argument("--nodes", type=int, default=2, help="emulated nodes, each like an Ibex A100 node (default 2)")
    up.add_argument("--no-accounting", action="store_true",
                    help="skip slurmdbd and MariaDB (faster start; sacct will not work)")
    up.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for idle nodes")
    up.set_defaults(handler=_up)

    down = actions.add_parser("down", help="cancel its jobs (running ones too) and stop every daemon it started; "
                                           "returns once they have exited")
    down.set_defaults(handler=_down)

    status = actions.add_parser("status", help="show the daemons and the nodes")
    status.set_defaults(handler=_status)

    env = actions.add_parser("env", help="print the export line that points sbatch/squeue at the local cluster")
    env.set_defaults(handler=_env)

    jobs = subparsers.add_parser("jobs", help="show jobs by id (state, exit code, elapsed, log)")
    jobs.add_argument("job_ids", nargs="+", metavar="JOB_ID")
    jobs.add_argument("--backend", choices=["slurm", "local"], default=None)
    jobs.add_argument("--wait", action="store_true", help="wait until they have all ended")
    jobs.set_defaults(handler=_jobs)


def _up(args: argparse.Namespace) -> int:
    from workshop_lib.jobs.local_cluster import LocalCluster

    if not 0 < args.timeout < float("inf"):
        raise WorkshopError(f"--timeout {args.timeout} is not a number of seconds above 0 (default 90)")
    cluster = LocalCluster()
    started = time.monotonic()
    status = cluster.up(nodes=args.nodes, accounting=not args.no_accounting, timeout=args.timeout)
    print(status.describe())
    print(f"ready in {time.monotonic() - started:.1f} s. For sbatch/squeue in your shell: "
          f"export SLURM_CONF={shlex.quote(str(status.conf))}")
    return 0


def _down(args: argparse.Namespace) -> int:
    from workshop_lib.jobs.local_cluster import LocalCluster

    cluster = LocalCluster()
    stopped = cluster.down()
    if cluster.cancelled:
        states = sorted({state for _, state in cluster.cancelled})
        counts = ", ".join(f"{sum(s == state for _, s in cluster.cancelled)} {state.lower()}" for state in states)
        print(f"cancelled {len(cluster.cancelled)} job(s) ({counts}): "
              + " ".join(job_id for job_id, _ in cluster.cancelled))
    print("stopped: " + (", ".join(stopped) + " (each has exited; its ports are free)" if stopped
                         else "nothing was running"))
    return 0


def _status(args: argparse.Namespace) -> int:
    from workshop_lib.jobs.local_cluster import LocalCluster

    status = LocalCluster().status()
    print(status.describe())
    return 0 if status.running else 3


def _env(args: argparse.Namespace) -> int:
    from workshop_lib.jobs.local_cluster import LocalCluster

    print(f"export SLURM_CONF={shlex.quote(str(LocalCluster().conf))}")
    return 0


def _jobs(args: argparse.Namespace) -> int:
    from workshop_lib import jobs as cluster
    from workshop_lib.jobs.states import COMPLETED, FORGOTTEN, LOST

    for job_id in args.job_ids:
        if not JOB_ID.fullmatch(job_id):
            raise WorkshopError(f"{job_id!r} is not a job id: give SLURM's number (e.g. 1234, or 1234_5 for an array "
                                "task) or the local executor's local-N, as `workshop status` shows them")
    jobs = [cluster.job_from_id(job_id, backend=args.backend) for job_id in args.job_ids]
    infos = cluster.wait_for(jobs) if args.wait else cluster.query_jobs(jobs)  # one scheduler call for all
    for info in infos:
        print(info.describe())
    unknown = [info.job_id for info in infos if info.state in (LOST, FORGOTTEN) and not _has_log(info)]
    if unknown:
        print(f"workshop: error: the scheduler does not know job {', '.join(unknown)} and there is no log of it: "
              "check the id (`workshop status` lists each run's job; `squeue --me` the active ones)", file=sys.stderr)
        return 1
    return 0 if all(info.state == COMPLETED for info in infos) or not args.wait else 1


# SLURM's job ids (an array task 12_3, a heterogeneous part 12+1) and the local executor's local-N.
JOB_ID = re.compile(r"\d+([_+]\d+)?|local-\d+")


def _has_log(info) -> bool:
    return info.stdout_path is not None and Path(info.stdout_path).is_file()
