"""The local executor: the same scripts run with bash where no scheduler exists."""

from __future__ import annotations

import socket
import time

import pytest

from workshop_lib import jobs as cluster
from workshop_lib.core.errors import ClusterError, JobFailed, SubmitError


@pytest.fixture(autouse=True)
def private_state(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKSHOP_STATE_DIR", str(tmp_path / "state"))


def script(folder, body, *directives):
    path = folder / "job.sh"
    path.write_text("\n".join(["#!/bin/bash", "#SBATCH --output=out-%j.txt", *(f"#SBATCH {d}" for d in directives),
                               body]) + "\n")
    return path


def run(path, timeout=30):
    job = cluster.submit(path, backend="local")
    [info] = cluster.wait_for([job], timeout=timeout, poll_interval=0.1, progress=False)
    return job, info


def test_environment_mimics_slurm(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKSHOP_LOCAL_GPUS", "2")  # as many as asked for, also on a one-GPU machine
    job, info = run(script(tmp_path, 'echo "$SLURM_JOB_ID $SLURM_NNODES $SLURM_GPUS_ON_NODE $CUDA_VISIBLE_DEVICES"',
                           "--gpus-per-node=2", "--ntasks-per-node=2"))
    assert info.state == "COMPLETED" and info.exit_code == 0
    assert job.stdout_path == tmp_path / f"out-{job.job_id}.txt"
    # A number, as SLURM gives it (Lightning reads its last digits as a port offset): local-N -> N.
    assert job.stdout_path.read_text().split() == [job.job_id.removeprefix("local-"), "1", "2", "0,1"]
    assert job.job_id.removeprefix("local-").isdigit()


def test_srun_runs_one_copy_per_task(tmp_path):
    job, info = run(script(tmp_path, "srun bash -c 'echo rank $SLURM_PROCID'", "--ntasks-per-node=3"))
    assert info.state == "COMPLETED"
    assert sorted(job.stdout_path.read_text().splitlines()) == ["rank 0", "rank 1", "rank 2"]


def test_failure_keeps_exit_code_and_log(tmp_path):
    job, info = run(script(tmp_path, "echo half way; exit 7"))
    assert (info.state, info.exit_code) == ("FAILED", 7)
    with pytest.raises(JobFailed, match="half way"):
        job.raise_for_state()


def test_time_limit_gives_timeout(tmp_path):
    job, info = run(script(tmp_path, "sleep 30", "--time=00:01"), timeout=20)  # MM:SS: one second
    assert info.state == "TIMEOUT"


def test_cancel(tmp_path):
    job = cluster.submit(script(tmp_path, "sleep 30"), backend="local")
    deadline = time.monotonic() + 10
    while job.state != "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    job.cancel()
    [info] = cluster.wait_for([job], timeout=15, poll_interval=0.1, progress=False)
    assert info.state == "CANCELLED"


def test_another_process_sees_the_job(tmp_path):
    job, _ = run(script(tmp_path, "true"))
    again = cluster.job_from_id(job.job_id)
    assert again.backend == "local" and again.info().state == "COMPLETED"


def test_refuses_a_missing_output_folder_and_an_unreadable_node_count(tmp_path):
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/bin/bash\n#SBATCH --output=nowhere/out.txt\ntrue\n")
    with pytest.raises(SubmitError, match="does not exist"):
        cluster.submit(bad, backend="local")
    with pytest.raises(SubmitError, match="--nodes='two'.*--nodes=2"):
        cluster.submit(script(tmp_path, "true", "--nodes=two"), backend="local")


def test_a_two_node_job_runs_as_two_emulated_nodes_with_their_own_gpus(tmp_path, monkeypatch):
    # 4 GPUs, 2 nodes x 2 GPUs x 2 tasks: every task learns its node, node name, rank and its node's GPUs;
    # the batch shell (node 0) sees node 0's GPUs; scontrol lists the head node first.
    monkeypatch.setenv("WORKSHOP_LOCAL_GPUS", "4")
    body = "\n".join([
        'echo "batch $SLURM_NNODES $SLURM_NTASKS $CUDA_VISIBLE_DEVICES $(scontrol show hostnames | tr "\\n" " ")"',
        "srun bash -c 'echo \"task $SLURM_PROCID $SLURM_NODEID $SLURM_LOCALID $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES\"'",
        "srun --nodes=1 --ntasks-per-node=1 bash -c 'echo \"head $SLURM_NODEID\"'",
        "srun -n 1 bash -c 'echo \"single $SLURM_PROCID\"'",
        "srun --nodes=3 true 2> too-many.txt || echo refused",
    ])
    job, info = run(script(tmp_path, body, "--nodes=2", "--ntasks-per-node=2", "--gpus-per-node=2"))
    assert info.state == "COMPLETED", job.stdout_path.read_text()
    lines = job.stdout_path.read_text().splitlines()
    batch = next(line for line in lines if line.startswith("batch")).split()
    assert batch[1:4] == ["2", "4", "0,1"]
    head, second = batch[4:]
    assert head == socket.gethostname().split(".")[0] and second == f"{head}-node1"
    tasks = sorted(line.split()[1:] for line in lines if line.startswith("task"))
    assert tasks == [["0", "0", "0", head, "0,1"], ["1", "0", "1", head, "0,1"],
                     ["2", "1", "0", second, "2,3"], ["3", "1", "1", second, "2,3"]]
    assert [line for line in lines if line.startswith("head")] == ["head 0"]
    assert [line for line in lines if line.startswith("single")] == ["single 0"]
    assert "refused" in lines and "asks for 3 nodes; the job has 2" in (tmp_path / "too-many.txt").read_text()
    assert info.node_list == f"{head},{second}"


def test_a_job_wider_than_the_machine_fails_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKSHOP_LOCAL_GPUS", "2")
    job, info = run(script(tmp_path, "true", "--nodes=2", "--gpus-per-node=2"))
    assert info.state == "FAILED" and "asks for 4 GPUs (2 node(s) × 2); this machine has 2" in info.reason


def test_backend_choice_and_errors(monkeypatch, tmp_path):
    monkeypatch.setenv("WORKSHOP_BACKEND", "local")
    assert cluster.resolve_backend() == "local"
    monkeypatch.setenv("WORKSHOP_BACKEND", "nonsense")
    with pytest.raises(ClusterError, match="unknown backend"):
        cluster.resolve_backend()
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch anywhere
    monkeypatch.setenv("WORKSHOP_BACKEND", "slurm")
    with pytest.raises(ClusterError, match="sbatch"):
        cluster.resolve_backend()
    monkeypatch.setenv("WORKSHOP_BACKEND", "auto")
    monkeypatch.setenv("WORKSHOP_ALLOW_LOCAL", "0")
    with pytest.raises(ClusterError, match="workshop cluster up"):
        cluster.resolve_backend()
    monkeypatch.setenv("WORKSHOP_ALLOW_LOCAL", "1")
    assert cluster.resolve_backend() == "local"


@pytest.mark.slow  # over 5 s on a loaded 2-core machine
def test_gpu_jobs_queue_for_free_gpus(tmp_path, monkeypatch):
    # A 2-GPU machine: two 2-GPU jobs cannot overlap; two 1-GPU jobs run side by side on different GPUs.
    monkeypatch.setenv("WORKSHOP_LOCAL_GPUS", "2")
    stamp = 'echo "$CUDA_VISIBLE_DEVICES $(date +%s.%N)"; sleep 1; date +%s.%N'
    first = tmp_path / "a"
    second = tmp_path / "b"
    for folder in (first, second):
        folder.mkdir()
    jobs = [cluster.submit(script(folder, stamp, "--gpus-per-node=2"), backend="local") for folder in (first, second)]
    infos = cluster.wait_for(jobs, timeout=30, poll_interval=0.1, progress=False)
    assert [i.state for i in infos] == ["COMPLETED", "COMPLETED"]
    (devices_a, start_a), end_a = [line.split() if " " in line else line for line in jobs[0].stdout_path.read_text().splitlines()]
    (devices_b, start_b), end_b = [line.split() if " " in line else line for line in jobs[1].stdout_path.read_text().splitlines()]
    assert devices_a == devices_b == "0,1"
    assert float(start_b) >= float(end_a) or float(start_a) >= float(end_b)  # one waited for the other

    singles = []
    for name in ("c", "d"):
        folder = tmp_path / name
        folder.mkdir()
        singles.append(cluster.submit(script(folder, stamp, "--gpus-per-node=1"), backend="local"))
    cluster.wait_for(singles, timeout=30, poll_interval=0.1, progress=False)
    devices = sorted(job.stdout_path.read_text().split()[0] for job in singles)
    assert devices == ["0", "1"]


@pytest.mark.slow  # over 5 s on a loaded 2-core machine
def test_gpu_jobs_start_in_submission_order(tmp_path, monkeypatch):
    # 2 GPUs: a 1-GPU job runs; a 2-GPU job waits for it; a 1-GPU job submitted after the 2-GPU one
    # could fit on the free GPU right away but must not jump the queue (else big jobs starve).
    monkeypatch.setenv("WORKSHOP_LOCAL_GPUS", "2")
    stamp = 'date +%s.%N; sleep 1.5; date +%s.%N'
    jobs = []
    for name, gpus in (("first", 1), ("big", 2), ("late", 1)):
        folder = tmp_path / name
        folder.mkdir()
        jobs.append(cluster.submit(script(folder, stamp, f"--gpus-per-node={gpus}"), backend="local"))
        time.sleep(0.3)  # the runners see each other in submission order
    infos = cluster.wait_for(jobs, timeout=40, poll_interval=0.1, progress=False)
    assert [i.state for i in infos] == ["COMPLETED"] * 3
    (start_first, end_first), (start_big, end_big), (start_late, _) = [
        [float(v) for v in job.stdout_path.read_text().split()] for job in jobs]
    assert start_big >= end_first and start_late >= end_big


def test_more_gpus_than_the_machine_fails_clearly(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKSHOP_LOCAL_GPUS", "2")
    job, info = run(script(tmp_path, "true", "--gpus-per-node=4"))
    assert info.state == "FAILED" and "this machine has 2" in info.reason


def test_job_finds_the_submitters_python_without_activation(tmp_path, monkeypatch):
    import sys
    from pathlib import Path

    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # the virtualenv was never activated
    job, info = run(script(tmp_path, "command -v python"))
    assert info.state == "COMPLETED"
    assert job.stdout_path.read_text().strip() == str(Path(sys.executable).parent / "python")


@pytest.mark.train
@pytest.mark.slow
def test_hybrid_shard_on_emulated_nodes_shards_inside_each_node(tmp_path):
    from workshop_lib.jobs.local import machine_gpu_count

    if machine_gpu_count():  # the executor hands a job this machine's real GPUs: 4 ranks would want 4 of them
        pytest.skip("a GPU machine: this tiny-profile job (2 nodes x 2 CPU ranks) is the CPU stand-in's test")
    # The chapter's 2 nodes x 2 processes job, run by the local executor: HYBRID_SHARD must see two
    # nodes (a shard group per node: half the parameters per rank), not one node of four.
    from workshop_lib.experiments import get_experiment
    from workshop_lib.results.parse.metrics import parse_metrics
    from workshop_lib.runs import submit_experiments, wait_for_runs

    experiment = get_experiment("fsdp/strategies/hybrid-shard")
    [run_] = submit_experiments([experiment], "tiny", root=tmp_path / "runs", backend="local")
    [info] = wait_for_runs([run_], timeout=300, progress=False, poll_interval=0.5)
    log = run_.job.stdout_path.read_text()
    assert info.state == "COMPLETED", log[-3000:]
    assert "world_size=4 nodes=2" in log
    summary = parse_metrics((run_.directory / "train" / "metrics.jsonl").read_text()).summary
    assert (summary.world_size, summary.nodes) == (4, 2)
    assert summary.local_params_per_rank == [summary.total_params // 2] * 4
    assert (summary.settings["fsdp_shard_group"], summary.settings["fsdp_replicate_group"]) == (2, 2)
    # The chapter's strategy table reads the same record: HYBRID_SHARD split over one node's 2 ranks.
    from workshop_lib.book.tables import chapter_tables

    table = {t.title: t.frame for t in chapter_tables(4, tmp_path / "runs")}["FSDP sharding strategies, 2 nodes x 2 GPUs"]
    row = table[table["Strategy"] == "HYBRID_SHARD"].iloc[0]
    assert (row["CPU Offload"], row["Nodes x GPUs"], row["Shard Group (ranks)"]) == ("no", "2 x 2", 2)
    assert row["Samples/s"] > 0


def test_a_runner_that_cannot_start_fails_its_job_with_the_reason(tmp_path, monkeypatch):
    """What a GPU machine without workshop_lib on the runner's path showed: the runner died at import and
    the job stayed PENDING forever. Here the runner dies at import the same way, on purpose."""
    import sys

    from workshop_lib.jobs import local as local_executor

    monkeypatch.setattr(local_executor, "RUNNER_COMMAND", [sys.executable, "-c", "import no_such_runner_module"])
    job = cluster.submit(script(tmp_path, "echo never"), backend="local")
    [info] = cluster.wait_for([job], timeout=30, poll_interval=0.1, progress=False)
    assert info.state == "FAILED"
    assert "runner could not start" in info.reason and "No module named 'no_such_runner_module'" in info.reason
    assert not job.stdout_path.exists()  # nothing ran


def test_the_runner_finds_this_workshop_lib_without_it_installed_or_on_the_path(tmp_path, monkeypatch):
    import subprocess
    import sys
    from pathlib import Path

    from workshop_lib.jobs import local as local_executor

    monkeypatch.delenv("PYTHONPATH", raising=False)
    # -S: no site-packages, so no installed workshop_lib; only the environment the runner gets finds it.
    found = subprocess.run([sys.executable, "-S", "-c", "import workshop_lib; print(workshop_lib.__file__)"],
                           cwd=tmp_path, env=local_executor._runner_environment(), capture_output=True, text=True)
    assert found.returncode == 0, found.stderr
    assert Path(found.stdout.strip()).parent == Path(local_executor.__file__).parents[1]
