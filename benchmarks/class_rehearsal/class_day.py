"""The class day rehearsed: N participants follow the class plan on a local cluster shaped like its reservation.

    sudo WORKSHOP_SLURM_PORT_BASE=... python benchmarks/class_rehearsal/class_day.py --participants 30 \
        [--nodes-4gpu 16] [--nodes-8gpu 2] [--seconds-per-hour 120] [--chapters 1 2 3 4] \
        [--output benchmarks/results/class_rehearsal/class-day-30.json]

What it sets up:
- the project's local SLURM cluster with the reservation's shape: 4-GPU nodes (62 cores, 512 GB, features
  a100,4gpus) and 8-GPU nodes (126 cores, 1 TB, a100,8gpus), as KAUST documents Ibex's A100 nodes; jobs share
  nodes by GPUs, cores and memory;
- N Linux users (`useradd`, removed afterwards) and a real reservation for them on every node;
- the class plan made from that reservation as `workshop class plan --reservation NAME` makes it on Ibex: nodes
  and features read back with `scontrol show reservation` and `scontrol show node`.

Then chapter after chapter, each participant submits, as their own user, the jobs the plan gives them, in the
plan's order (participant by participant), with the #SBATCH lines the rehearsal profile's scripts carry (GPUs,
cores, --mem, --constraint=a100,4gpus or a100,8gpus, the reservation). Every job sleeps its planned A100 duration
scaled down (`--seconds-per-hour`). All of a chapter's jobs are submitted held and released together (the plan's
time 0); the chapter ends when its last job does. Measured: each chapter's makespan from SLURM's own start and end
times, beside the plan's prediction on the same scale.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from class_rehearsal import add_users, create_reservation, remove_users, run  # noqa: E402

# A job's own start and end are SLURM's (1 s resolution); a chapter's prediction is scaled to the same clock.
STATE_DONE = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED"}


def job_script(job, reservation: str, seconds: float) -> str:
    """The job as the plan sees it: the rehearsal profile's #SBATCH lines for its experiment, sleeping the
    planned duration scaled down."""
    from workshop_lib.experiments import get_experiment
    from workshop_lib.scripts.directives import directives
    from workshop_lib.sites.profiles import load_profile

    profile = load_profile("rehearsal")
    lines = ["#!/bin/bash"]
    for directive in directives(get_experiment(job.experiment_id), profile):
        if directive.option in ("output", "time", "reservation"):
            continue
        lines.append(directive.line)
    limit = max(1, math.ceil(seconds * 1.5 / 60))  # minutes; scaled like the job, with room
    lines += [f"#SBATCH --time={limit}", f"#SBATCH --reservation={reservation}", "#SBATCH --output=/dev/null",
              f"sleep {seconds:.2f}"]
    return "\n".join(lines) + "\n"


def submit_held(script: Path, user: str, env: dict, home: Path) -> str:
    entry = pwd.getpwnam(user)
    result = subprocess.run(["sbatch", "--parsable", "--hold", str(script)], capture_output=True, text=True,
                            env={**env, "HOME": str(home), "USER": user}, user=entry.pw_uid, group=entry.pw_gid,
                            extra_groups=[], cwd=home, timeout=60)
    if result.returncode != 0:
        raise RuntimeError(f"sbatch as {user} refused {script.name}: {result.stderr.strip()}")
    return result.stdout.strip().split(";")[0]


def job_times(ids: list[str], env: dict) -> dict[str, tuple[str, float, float, str]]:
    """(state, start, end, node list) of each job the controller still holds (MinJobAge keeps ended ones);
    times in epoch seconds."""
    output = run(["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", "%i|%T|%S|%e|%N"], env)
    found = {}
    for line in output.splitlines():
        job_id, state, start, end, nodes = line.split("|")
        found[job_id] = (state, _epoch(start), _epoch(end), nodes)
    return found


def wrong_shapes(times: dict, jobs: list, shapes: dict[str, int], env: dict) -> list[str]:
    """Jobs that ran on a node of another shape than the plan's (e.g. a 1-GPU job on an 8-GPU node)."""
    wrong = []
    for (job_id, (_, _, _, node_list)), job in zip(times.items(), jobs):
        wanted = 4 if job.gpus_per_node <= 4 else 8
        names = run(["scontrol", "show", "hostnames", node_list], env).split()
        if any(shapes[name] != wanted for name in names):
            wrong.append(f"{job.user} {job.experiment_id} ({job_id}) on {node_list}")
    return wrong


def _epoch(text: str) -> float:
    if text in ("N/A", "Unknown", "NONE", ""):
        return math.nan
    return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))


def rehearse_day(participants: int, nodes_4gpu: int = 16, nodes_8gpu: int = 2, seconds_per_hour: float = 120.0,
                 chapters: tuple[int, ...] = (1, 2, 3, 4), timeout_s: float = 3600.0) -> dict:
    if os.geteuid() != 0:
        raise SystemExit("the rehearsal creates Linux users and a SLURM reservation: run it as root")
    from workshop_lib.book.plans.day_plan import class_durations
    from workshop_lib.class_plan import IBEX_4GPU, IBEX_8GPU, class_jobs, plan_on, read_reservation
    from workshop_lib.class_plan.nodes import counts_of, describe_counts, scontrol
    from workshop_lib.jobs.local_cluster import LocalCluster, NodeGroup, Ports

    folder = Path(tempfile.mkdtemp(prefix="class-day-"))
    folder.chmod(0o755)
    groups = tuple(NodeGroup(count, shape.gpus, shape.cpus, shape.memory_mib, ",".join(sorted(shape.features)))
                   for shape, count in ((IBEX_4GPU, nodes_4gpu), (IBEX_8GPU, nodes_8gpu)) if count)
    local = LocalCluster(state_dir=folder / "slurm", ports=Ports(Ports.from_environment().base + 40))
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    reservation = f"class-day-{os.getpid()}"
    users = []
    try:
        local.up(groups=groups, accounting=False, min_job_age=3600)
        env["SLURM_CONF"] = str(local.conf)
        os.environ["SLURM_CONF"] = env["SLURM_CONF"]  # scontrol, as `workshop class plan --reservation` runs it
        users = add_users(participants, folder)
        create_reservation(reservation, users, env)
        read = read_reservation(reservation, scontrol)
        durations = class_durations()
        planned = plan_on(class_jobs(participants, durations, chapters=chapters), read.nodes,
                          f"reservation {reservation} ({describe_counts(counts_of(read.nodes))})")
        shapes = {node.name: node.shape.gpus for node in read.nodes}
        by_name = {f"participant-{index + 1:02d}": user for index, user in enumerate(users)}
        report_chapters = []
        for day in planned.chapters:
            scripts = folder / "scripts" / str(day.chapter)
            scripts.mkdir(parents=True)
            scripts.chmod(0o755)
            ids = []
            for index, job in enumerate(day.jobs):  # the plan's order: participant by participant
                path = scripts / f"{index:04d}.sbatch"
                path.write_text(job_script(job, reservation, job.duration_s / 3600 * seconds_per_hour))
                path.chmod(0o644)
                user = by_name[job.user]
                ids.append(submit_held(path, user.user, env, user.home))
            released = time.time()
            run(["scontrol", "release", ",".join(ids)], env)
            deadline = released + timeout_s
            while True:
                times = job_times(ids, env)
                if all(times.get(job_id, ("",))[0] in STATE_DONE for job_id in ids):
                    times = {job_id: times[job_id] for job_id in ids}  # the plan's order
                    break
                if time.time() > deadline:
                    raise RuntimeError(f"chapter {day.chapter}'s jobs did not end within {timeout_s:.0f} s")
                time.sleep(1.0)
            first_start = min(start for _, start, _, _ in times.values())
            # How much longer than its sleep each job held its node (start-up and clean-up; 1 s resolution).
            slept = {job_id: job.duration_s / 3600 * seconds_per_hour for job_id, job in zip(ids, day.jobs)}
            overheads = [times[job_id][2] - times[job_id][1] - slept[job_id] for job_id in ids]
            ends = [end for _, _, end, _ in times.values()]
            measured = max(ends) - min(released, first_start)
            predicted = day.schedule.makespan_s / 3600 * seconds_per_hour
            report_chapters.append({
                "chapter": day.chapter, "jobs": len(ids), "predicted_s": round(predicted, 1),
                "measured_s": round(measured, 1), "error": round(measured / predicted - 1, 3),
                "states": sorted({state for state, _, _, _ in times.values()}),
                "on_another_shape": wrong_shapes(times, list(day.jobs), shapes, env),
                "job_overhead_s_mean": round(sum(overheads) / len(overheads), 2),
                "first_start_after_release_s": round(first_start - released, 1),
                "plan_makespan_h": round(day.schedule.makespan_s / 3600, 3)})
        predicted = sum(c["predicted_s"] for c in report_chapters)
        measured = sum(c["measured_s"] for c in report_chapters)
        return {"setup": {"participants": participants, "nodes_4gpu": nodes_4gpu, "nodes_8gpu": nodes_8gpu,
                          "seconds_per_hour": seconds_per_hour, "chapters": list(chapters),
                          "reservation": planned.where, "reservation_users": len(read.users)},
                "chapters": report_chapters, "plan_day_h": round(planned.day_s / 3600, 3),
                "predicted_s": round(predicted, 1), "measured_s": round(measured, 1),
                "error": round(measured / predicted - 1, 3)}
    finally:
        run(["scontrol", "delete", f"ReservationName={reservation}"], env, check=False)
        for user in users:
            run(["scancel", "--user", user.user], env, check=False)
        remove_users(users)
        local.down()
        shutil.rmtree(folder, ignore_errors=True)


def describe(report: dict) -> str:
    setup = report["setup"]
    lines = [f"{setup['participants']} participants on {setup['reservation']}, 1 plan hour = "
             f"{setup['seconds_per_hour']:g} s"]
    for chapter in report["chapters"]:
        lines.append(f"chapter {chapter['chapter']}: {chapter['jobs']} jobs, predicted {chapter['predicted_s']} s "
                     f"({chapter['plan_makespan_h']} h), measured {chapter['measured_s']} s "
                     f"({chapter['error']:+.0%}), states {chapter['states']}; each job held its node "
                     f"{chapter['job_overhead_s_mean']} s longer than it slept")
    lines.append(f"the day: predicted {report['predicted_s']} s ({report['plan_day_h']} h), measured "
                 f"{report['measured_s']} s ({report['error']:+.0%})")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--participants", type=int, default=30)
    parser.add_argument("--nodes-4gpu", type=int, default=16)
    parser.add_argument("--nodes-8gpu", type=int, default=2)
    parser.add_argument("--seconds-per-hour", type=float, default=120.0, help="rehearsal seconds per plan hour")
    parser.add_argument("--chapters", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--output", type=Path, help="also write the report as JSON here")
    args = parser.parse_args()
    report = rehearse_day(args.participants, args.nodes_4gpu, args.nodes_8gpu, args.seconds_per_hour,
                          tuple(args.chapters))
    print(describe(report))
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if abs(report["error"]) <= 0.2 else 1


if __name__ == "__main__":
    sys.exit(main())
