"""Job control against the project's real local SLURM cluster (slurmctld, slurmd x2, slurmdbd, munge)."""

from __future__ import annotations

import time

import pytest

from workshop_lib import jobs as cluster
from workshop_lib.core.errors import JobFailed, SubmitError

pytestmark = pytest.mark.cluster

IBEX_A100_SHAPE = """#!/bin/bash
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=4
#SBATCH --mem=256G
#SBATCH --time=00:10:00
#SBATCH --constraint={constraint}
hostname
"""


def write_script(folder, name, body, directives=()):
    script = folder / name
    lines = ["#!/bin/bash", f"#SBATCH --output={folder}/{name}-%j.out", *(f"#SBATCH {d}" for d in directives), body]
    script.write_text("\n".join(lines) + "\n")
    return script


def wait_until_running(job, timeout=20):
    deadline = time.monotonic() + timeout
    while job.state in ("PENDING", "UNKNOWN", "CONFIGURING"):
        assert time.monotonic() < deadline, f"{job} never started: {job.info()}"
        time.sleep(0.1)


def test_completed_job_reads_back_from_sacct(local_cluster, job_dir):
    job = cluster.submit(write_script(job_dir, "ok.sh", "echo hello from $SLURM_JOB_ID"))
    assert job.backend == "slurm" and job.job_id.isdigit()
    [info] = cluster.wait_for([job], timeout=60, progress=False)
    assert info.state == "COMPLETED" and info.exit_code == 0
    assert job.stdout_path.read_text().strip() == f"hello from {job.job_id}"
    record = job.accounting()
    assert (record.state, record.exit_code, record.name) == ("COMPLETED", 0, "ok.sh")
    job.raise_for_state()  # no exception


def test_failed_job_exit_code_and_log_tail(local_cluster, job_dir):
    job = cluster.submit(write_script(job_dir, "fail.sh", "echo step one; echo it broke >&2; exit 3"))
    [info] = cluster.wait_for([job], timeout=60, progress=False)
    assert (info.state, info.exit_code) == ("FAILED", 3)
    assert (job.accounting().state, job.accounting().exit_code) == ("FAILED", 3)
    with pytest.raises(JobFailed) as failure:
        job.raise_for_state()
    assert "exit code 3" in str(failure.value) and "it broke" in str(failure.value)


def test_cancelled_job(local_cluster, job_dir):
    job = cluster.submit(write_script(job_dir, "sleep.sh", "sleep 120"))
    wait_until_running(job)
    job.cancel()
    [info] = cluster.wait_for([job], timeout=60, progress=False)
    assert info.state == "CANCELLED"
    assert job.accounting().state == "CANCELLED"  # sacct prints "CANCELLED by 0"


def test_job_array_rolls_up(local_cluster, job_dir):
    script = job_dir / "array.sh"
    script.write_text(f"#!/bin/bash\n#SBATCH --array=1-3\n#SBATCH --output={job_dir}/array-%A_%a.out\n"
                      "echo task $SLURM_ARRAY_TASK_ID\n")
    job = cluster.submit(script)
    [info] = cluster.wait_for([job], timeout=90, progress=False)
    assert info.state == "COMPLETED"
    record = job.accounting()
    assert record.state == "COMPLETED" and len(record.tasks) == 3
    outputs = sorted(p.read_text().strip() for p in job_dir.glob(f"array-{job.job_id}_*.out"))
    assert outputs == ["task 1", "task 2", "task 3"]


def test_two_node_job_places_one_task_per_node(local_cluster, job_dir):
    script = write_script(job_dir, "two.sh", 'srun bash -c \'echo "$SLURMD_NODENAME rank $SLURM_PROCID"\'',
                          ["--nodes=2", "--ntasks-per-node=1"])
    job = cluster.submit(script)
    [info] = cluster.wait_for([job], timeout=60, progress=False)
    assert info.state == "COMPLETED"
    lines = sorted(job.stdout_path.read_text().split("\n")[:-1])
    assert lines == ["node1 rank 0", "node2 rank 1"]
    assert job.accounting().node_list == "node[1-2]"


def test_ibex_a100_request_accepted_and_v100_rejected(local_cluster, job_dir):
    good = job_dir / "a100.sh"
    good.write_text(IBEX_A100_SHAPE.format(constraint="a100"))
    assert "node1" in cluster.test_only(good)
    bad = job_dir / "v100.sh"
    bad.write_text(IBEX_A100_SHAPE.format(constraint="v100"))
    with pytest.raises(SubmitError, match="Invalid feature"):
        cluster.test_only(bad)
    with pytest.raises(SubmitError, match="Invalid feature"):
        cluster.submit(bad)  # rejected at submit time, not left pending


def test_submit_rejection_carries_sbatch_stderr(local_cluster, job_dir):
    script = write_script(job_dir, "huge.sh", "hostname", ["--gpus-per-node=16"])
    with pytest.raises(SubmitError) as refused:
        cluster.submit(script)
    assert "sbatch" in str(refused.value) and "huge.sh" in str(refused.value)


def test_missing_script_is_a_clear_error(tmp_path):
    with pytest.raises(SubmitError, match="does not exist"):
        cluster.submit(tmp_path / "nope.sh", backend="slurm")


# TIMEOUT (state, sacct, explanation) is covered by tests/runs/test_fault_injection.py through the real submit
# path, overlapped with the other fault cases.


def test_down_stops_every_daemon_and_up_restarts(local_cluster):
    import os

    before = local_cluster.status()
    pids = [d.pid for d in before.daemons if d.running]
    assert len(pids) == 6  # munged, mariadbd, slurmdbd, slurmctld, 2 x slurmd
    import socket
    import subprocess
    import time

    running = subprocess.run(["sbatch", "--parsable", "--wrap", "sleep 120", "-o", "/dev/null"], capture_output=True,
                             text=True, check=True).stdout.strip()
    deadline = time.monotonic() + 30
    while "RUNNING" not in subprocess.run(["squeue", "-h", "-j", running, "-o", "%T"], capture_output=True,
                                         text=True).stdout and time.monotonic() < deadline:
        time.sleep(0.3)
    stopped = local_cluster.down()
    assert set(stopped) >= {"slurmctld", "slurmd-node1", "slurmd-node2", "slurmdbd", "mariadbd", "munged"}
    assert (running, "RUNNING") in local_cluster.cancelled  # said, not done silently
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split(") ")[1][0] == "Z"
    ports = local_cluster.ports
    for port in (ports.slurmctld, ports.slurmdbd, ports.mariadb):  # gone, not still exiting: `up` may follow
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", port)) != 0, port
    assert not local_cluster.status().running
    with pytest.raises(SubmitError):  # nobody answers sbatch now
        cluster.submit(__file__, backend="slurm")
    status = local_cluster.up(nodes=2)  # bring it back for the tests that follow
    assert status.running and set(status.nodes.values()) == {"idle"}


def test_an_unreachable_accounting_is_an_error_not_a_state(local_cluster, job_dir):
    from workshop_lib.core.errors import ClusterError

    job = cluster.job_from_id("999999", "slurm")  # not in squeue: the answer must come from sacct
    local_cluster._stop("slurmdbd")
    try:
        with pytest.raises(ClusterError, match="(?s)sacct failed.*is slurmdbd running"):
            job.info()
        [info] = cluster.wait_for([job], timeout=1, progress=False)
        assert info.state == "UNKNOWN" and "sacct failed" in info.reason  # a waiter keeps asking
    finally:
        local_cluster.up(nodes=2)
    assert job.info().state == "LOST"  # both answer now: neither knows it, and it has no log
