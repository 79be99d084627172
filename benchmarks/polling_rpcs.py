"""Controller RPCs per minute of one waiter, measured with `sdiag` on the project's local SLURM cluster.

    sudo WORKSHOP_SLURM_PORT_BASE=... python benchmarks/polling_rpcs.py --jobs 1 25 --window 90

For each job count it submits that many `sleep` jobs (two run, the rest pend: the local cluster has two
exclusive nodes), resets the controller's statistics (`sdiag -r`), lets `cluster.wait_for` watch the jobs
for `--window` seconds, and reads back the RPCs the controller served, by message type. `sdiag`'s own
request is left out; with the jobs sleeping, nothing else talks to the controller meanwhile.

`--waiters N` watches the same jobs with N waiters in threads of one process, each starting 0.6 of the policy's
first pause after the one before (out of step: pollers of their own would each keep their own beat), all ending
with the window: the process's one watcher should keep the RPCs of a single waiter (plus one answer asked at
once for each late waiter).

`--policy cluster` polls as on a real, shared cluster (workshop_lib.jobs.slurm.CLUSTER_POLLING);
`--policy backend` uses what the backend picks here (the faster local-cluster policy). Run it with
PYTHONPATH pointing at another checkout to measure that checkout's waiter (an older `wait_for` without a
policy argument is called with its defaults).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

SDIAG_TYPE = re.compile(r"^\s+(\w+)\s+\(\s*\d+\)\s+count:(\d+)")


def rpc_counts(environment: dict[str, str]) -> dict[str, int]:
    """sdiag's RPC counts by message type, without sdiag's own REQUEST_STATS_INFO."""
    output = subprocess.run(["sdiag"], capture_output=True, text=True, env=environment, check=True).stdout
    section = output.split("Remote Procedure Call statistics by message type", 1)[1]
    section = section.split("Remote Procedure Call statistics by user", 1)[0]
    counts = {}
    for line in section.splitlines():
        match = SDIAG_TYPE.match(line)
        if match and match.group(1) != "REQUEST_STATS_INFO":
            counts[match.group(1)] = int(match.group(2))
    return counts


def measure(count: int, window: float, policy_name: str, environment: dict[str, str], folder: Path,
            waiters: int = 1) -> dict:
    from workshop_lib import jobs as cluster

    job_ids = []
    for index in range(count):
        submitted = subprocess.run(["sbatch", "--parsable", f"--job-name=poll-{index}", f"--output={folder}/%j.out",
                                    "--wrap", f"sleep {int(window) + 120}"],
                                   capture_output=True, text=True, env=environment, check=True)
        job_ids.append(submitted.stdout.strip().split(";")[0])
    if policy_name == "cluster":
        from workshop_lib.jobs.slurm import CLUSTER_POLLING as policy

        chosen = {"policy": policy}
    else:
        from workshop_lib.jobs.backend import get_backend

        policy, chosen = get_backend("slurm").poll_policy(), {}
    stagger = 0.6 * policy.first

    def waiter(index: int) -> None:
        jobs = [cluster.job_from_id(job_id, "slurm") for job_id in job_ids]  # each waiter its own Jobs
        cluster.wait_for(jobs, timeout=window - index * stagger, progress=False, **chosen)

    time.sleep(2)  # let the scheduler place the jobs before counting
    subprocess.run(["sdiag", "-r"], capture_output=True, env=environment, check=True)
    started = time.monotonic()
    try:
        threads = []
        for index in range(waiters):
            if index:
                time.sleep(stagger)
            threads.append(threading.Thread(target=waiter, args=(index,)))
            threads[-1].start()
        for thread in threads:
            thread.join()
    finally:
        elapsed = time.monotonic() - started
        counts = rpc_counts(environment)
        subprocess.run(["scancel", *job_ids], capture_output=True, env=environment)
    total = sum(counts.values())
    return {"jobs": count, "waiters": waiters, "window_s": round(elapsed, 1), "rpcs": total,
            "rpcs_per_minute": round(total * 60 / elapsed, 1), "by_type": counts, "policy": policy_name}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 25])
    parser.add_argument("--window", type=float, default=90.0, help="seconds each waiter runs")
    parser.add_argument("--policy", choices=["cluster", "backend"], default="cluster")
    parser.add_argument("--waiters", type=int, default=1, help="waiters in one process over the same jobs")
    parser.add_argument("--output", type=Path, help="also write the results as JSON here")
    args = parser.parse_args()
    from workshop_lib.jobs.local_cluster import LocalCluster

    if not os.environ.get("SLURM_CONF"):  # else: the cluster SLURM_CONF names, as it is
        local = LocalCluster()
        local.up(nodes=2)
        os.environ["SLURM_CONF"] = str(local.conf)
    environment = dict(os.environ)
    folder = Path(os.environ["SLURM_CONF"]).resolve().parent.parent / "polling-benchmark"
    folder.mkdir(exist_ok=True)
    results = [measure(count, args.window, args.policy, environment, folder, args.waiters) for count in args.jobs]
    for result in results:
        print(f"{result['jobs']:>3} job(s), {result['waiters']} waiter(s), {result['window_s']:>5.1f} s: "
              f"{result['rpcs']:>5} RPCs = "
              f"{result['rpcs_per_minute']:>7.1f}/min  {result['by_type']}")
    if args.output:
        args.output.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
