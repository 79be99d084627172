"""Run a job script with bash on this machine, the way SLURM would, where there is no scheduler.

Each job gets a record (JSON) in the state folder and a detached runner process
(`python -m workshop_lib.jobs.local run ID`) that sets SLURM-like variables, honours
--output, --time and the GPU count of the #SBATCH lines, and writes the final state.

A ``--nodes=N`` job runs as N emulated nodes on this machine: the job claims N × its GPUs per node,
and ``srun`` starts each node's tasks with that node's ``SLURM_NODEID``, its own node name and its
own slice of the GPUs, so torchrun's multi-node rendezvous, HYBRID_SHARD's node groups and the
per-node monitor files behave as on a cluster. What it cannot emulate is the network between nodes:
NCCL goes over this machine's NVLink or shared memory instead.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from workshop_lib.checks.sbatch import sbatch_request
from workshop_lib.core.durations import parse_duration
from workshop_lib.core.errors import ClusterError, SubmitError
from workshop_lib.jobs import slurm_output
from workshop_lib.jobs.backend import CLOCK_SKEW_S, PollPolicy, Submission, python_environment_path
from workshop_lib.jobs.states import (
    CANCELLED,
    COMPLETED,
    FAILED,
    FINAL_STATES,
    FORGOTTEN,
    HELD,
    NODE_FAIL,
    PENDING,
    RUNNING,
    TIMEOUT,
    JobInfo,
)

SHIMS = Path(__file__).resolve().parent / "local_shims"
JOB_ID_PREFIX = "local-"  # this executor's job ids: local-1, local-2, ... (SLURM's are plain numbers)


def jobs_dir() -> Path:
    from workshop_lib.jobs.local_cluster import default_state_dir

    folder = default_state_dir().parent / "local-jobs"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _record_path(job_id: str) -> Path:
    return jobs_dir() / f"{job_id}.json"


def _read(job_id: str) -> dict:
    try:
        return json.loads(_record_path(job_id).read_text())
    except FileNotFoundError:
        raise ClusterError(f"no local job {job_id} (records live in {jobs_dir()})") from None


def _write(record: dict) -> None:
    path = _record_path(record["job_id"])
    temporary = path.with_suffix(f".{os.getpid()}.tmp")  # one per writer: two writers never share it
    temporary.write_text(json.dumps(record, indent=1))
    os.replace(temporary, path)  # readers never see half a record


def _update(job_id: str, changes: dict | None = None, change=None) -> dict:
    """Read, change and write a job's record under a lock, so that the runner, `release` and `cancel`
    never write back a stale copy over each other's fields. `change(record)` may edit it in place."""
    with open(jobs_dir() / "records.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        record = _read(job_id)
        if change is not None:
            change(record)
        record.update(changes or {})
        _write(record)
    return record


def _next_job_id() -> str:
    with open(jobs_dir() / "counter.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        counter = jobs_dir() / "counter"
        number = int(counter.read_text()) + 1 if counter.exists() else 1
        counter.write_text(str(number))
    return f"{JOB_ID_PREFIX}{number}"


def submit(script: Path, workdir: Path, sbatch_args: Sequence[str] = (), hold: bool = False) -> Submission:
    """Start the script in the background (held until `release` with `hold`, like `sbatch --hold`)."""
    request = sbatch_request(script.read_text(errors="replace"), sbatch_args)
    nodes_text = request.get("nodes") or "1"
    try:
        nodes = int(nodes_text.split("-")[0])
        if nodes < 1:
            raise ValueError
    except ValueError:
        raise SubmitError(f"{script.name}: cannot read --nodes={nodes_text!r}; give a count such as --nodes=2") from None
    try:
        time_limit = parse_duration(request.get("time"))
    except ValueError:
        raise SubmitError(f"{script.name}: cannot read --time={request.get('time')!r}; "
                          "use MM, HH:MM:SS or D-HH:MM:SS") from None
    job_id = _next_job_id()
    name = request.get("job-name") or script.name
    stdout = slurm_output.expected_stdout(script, workdir, job_id, sbatch_args)
    if not stdout.parent.is_dir():
        # SLURM fails such a job at launch; say so before it runs.
        raise SubmitError(f"--output folder {stdout.parent} does not exist; create it before submitting "
                          "(SLURM would fail the job at launch with JobLaunchFailure)")
    # Like sbatch, keep a copy of the script as submitted: the file may move or change before the job runs.
    copy = jobs_dir() / f"{job_id}.sbatch"
    copy.write_text(script.read_text(errors="replace"))
    record = {
        "job_id": job_id, "name": name, "script": str(copy), "workdir": str(workdir), "stdout": str(stdout),
        "time_limit_s": time_limit, "nodes": nodes, "gpus_per_node": request.gpus_per_node,
        "ntasks_per_node": int(request.get("ntasks-per-node") or 1),
        "cpus_per_task": int(request.get("cpus-per-task") or 1),
        "state": PENDING, "submitted_at": time.time(), "held": hold,
    }
    _write(record)
    # The runner's own errors (it cannot import, say) go to a file of its own: job_info reads it back.
    with open(_runner_log(job_id), "wb") as errors:
        runner = subprocess.Popen([*RUNNER_COMMAND, job_id], stdin=subprocess.DEVNULL, stdout=errors, stderr=errors,
                                  start_new_session=True, cwd=workdir, env=_runner_environment())
    _update(job_id, change=lambda record: record.setdefault("runner_pid", runner.pid))
    return Submission(job_id, stdout, name)


RUNNER_COMMAND = [sys.executable, "-m", "workshop_lib.jobs.local", "run"]


def _runner_log(job_id: str) -> Path:
    return jobs_dir() / f"{job_id}.runner.log"


def _runner_environment() -> dict[str, str]:
    """The submitter's environment, with this workshop_lib importable by the runner even where the package
    is neither installed nor on PYTHONPATH (a notebook started from the checkout's folder)."""
    package_parent = str(Path(__file__).resolve().parents[2])
    paths = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, package_parent])}


def _runner_failure(job_id: str) -> str:
    """Why a runner ended before it started the job: the last line it printed."""
    try:
        lines = [line for line in _runner_log(job_id).read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        lines = []
    said = lines[-1].strip() if lines else "it printed nothing"
    return (f"the local executor's runner could not start ({said}); its output is in {_runner_log(job_id)}. "
            f"Check that `{sys.executable} -m workshop_lib.jobs.local` runs here, then submit again")


def job_info(job_id: str) -> JobInfo:
    try:
        record = _read(job_id)
    except ClusterError as missing:
        return JobInfo(job_id=job_id, state=FORGOTTEN, reason=str(missing))
    state = record["state"]
    if state in (PENDING, RUNNING) and record.get("runner_pid") and not _alive(record.get("runner_pid")):
        if not record.get("runner_started"):
            # It died before it could run anything (at import, say): FAILED with what it printed.
            record = _update(job_id, {"state": FAILED, "reason": _runner_failure(job_id), "exit_code": 1,
                                      "ended_at": time.time(), "held": False})
            state = FAILED
        else:
            state = NODE_FAIL  # the runner vanished without writing an end state (machine rebooted, killed)
    started = record.get("started_at")
    ended = record.get("ended_at") or (time.time() if started else None)
    return JobInfo(
        job_id=job_id, state=state, exit_code=record.get("exit_code"), signal=record.get("signal"),
        elapsed_s=(ended - started) if started else None,
        reason=HELD if record.get("held") else record.get("reason"),  # squeue's word for a held job
        stdout_path=Path(record["stdout"]), name=record.get("name"),
        node_list=",".join(node_names(record.get("nodes", 1))), time_limit_s=record.get("time_limit_s"),
        workdir=Path(record["workdir"]) if record.get("workdir") else None,
    )


def release(job_id: str) -> None:
    _update(job_id, {"held": False})


def jobs_in(workdir: Path, since: float = 0.0) -> list[JobInfo]:
    """Local jobs started in `workdir` since `since` (epoch seconds), oldest first."""
    wanted = str(Path(workdir).resolve())
    found = []
    for path in jobs_dir().glob(f"{JOB_ID_PREFIX}*.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        submitted = record.get("submitted_at", 0)
        if str(Path(record.get("workdir", "")).resolve()) == wanted and submitted >= since - CLOCK_SKEW_S:
            found.append(record["job_id"])
    return [job_info(job_id) for job_id in sorted(found, key=_job_number)]


def cancel(job_id: str) -> None:
    def request(record: dict) -> None:
        if record["state"] not in FINAL_STATES:
            record["cancel_requested"] = True

    record = _update(job_id, change=request)
    if not record.get("cancel_requested"):
        return
    if record.get("script_pgid"):
        try:
            os.killpg(record["script_pgid"], signal.SIGTERM)
        except ProcessLookupError:
            pass


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a runner that died but was not yet reaped by its submitter (a zombie) is not alive
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def node_names(nodes: int) -> list[str]:
    """The job's node names: this host first (the head node, which must resolve), then emulated ones."""
    host = socket.gethostname().split(".")[0]
    return [host] + [f"{host}-node{index}" for index in range(1, nodes)]


def slurm_job_number(job_id: str) -> str:
    """`local-12` -> `12`: the number a job id of this executor stands for."""
    return job_id.removeprefix(JOB_ID_PREFIX)


def _job_environment(record: dict) -> dict[str, str]:
    nodes = record.get("nodes", 1)
    names = node_names(nodes)
    gpus = record["gpus_per_node"]
    tasks_per_node = record["ntasks_per_node"]
    env = {
        **os.environ,
        # srun / scontrol as this machine emulates them, then the submitter's interpreter (as sbatch would hand it over).
        "PATH": f"{SHIMS}{os.pathsep}{python_environment_path()}",
        # SLURM's job ids are numbers, and tools read them as such (Lightning derives its rendezvous port from
        # the last digits): the job sees the number of its `local-N` id.
        "SLURM_JOB_ID": slurm_job_number(record["job_id"]), "SLURM_JOBID": slurm_job_number(record["job_id"]),
        "SLURM_JOB_NAME": record["name"],
        "SLURM_SUBMIT_DIR": record["workdir"], "SLURM_JOB_NODELIST": ",".join(names),
        "SLURM_NODELIST": ",".join(names), "SLURM_NNODES": str(nodes), "SLURM_JOB_NUM_NODES": str(nodes),
        "SLURM_NODEID": "0", "SLURM_PROCID": "0",  # the batch shell runs on the first node
        "SLURM_NTASKS_PER_NODE": str(tasks_per_node), "SLURM_NTASKS": str(tasks_per_node * nodes),
        "SLURM_CPUS_PER_TASK": str(record["cpus_per_task"]), "SLURMD_NODENAME": names[0],
        "WORKSHOP_BACKEND": "local",
    }
    if gpus:
        env["SLURM_GPUS_ON_NODE"] = env["SLURM_GPUS_PER_NODE"] = str(gpus)
        indices = record.get("gpus") or range(gpus * nodes)  # the claimed GPUs on a GPU machine
        # All of the job's GPUs for srun to slice per node; the batch shell sees the first node's.
        env["WORKSHOP_LOCAL_JOB_GPUS"] = ",".join(str(i) for i in indices)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in list(indices)[:gpus])
    return env


def machine_gpu_count() -> int | None:
    """GPUs of this machine (nvidia-smi -L), $WORKSHOP_LOCAL_GPUS if set; None where there are none."""
    if os.environ.get("WORKSHOP_LOCAL_GPUS"):
        return int(os.environ["WORKSHOP_LOCAL_GPUS"])
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    count = sum(1 for line in listing.stdout.splitlines() if line.startswith("GPU "))
    return count or None


def _job_number(job_id: str) -> int:
    return int(job_id.rsplit("-", 1)[-1])


def _claim_gpus(job_id: str, wanted: int, available: int) -> list[int] | None:
    """Reserve `wanted` free GPUs for the job (a lock file keeps concurrent runners honest).

    Jobs start in submission order: a job does not take GPUs while an older one still waits for
    its own, so a 4-GPU job is not starved by a stream of smaller ones (SLURM without backfill)."""
    with open(jobs_dir() / "gpus.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        busy: set[int] = set()
        older_waiting = False
        for path in jobs_dir().glob(f"{JOB_ID_PREFIX}*.json"):
            try:
                other = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if other["job_id"] == job_id or not _alive(other.get("runner_pid")):
                continue
            if other.get("state") == RUNNING:
                busy.update(other.get("gpus", []))
            elif (other.get("state") == PENDING and other.get("gpus_per_node")
                  and _job_number(other["job_id"]) < _job_number(job_id)):
                older_waiting = True
        free = [index for index in range(available) if index not in busy]
        if older_waiting or len(free) < wanted:
            return None
        # Written under the claim lock: the next runner sees these GPUs as taken.
        _update(job_id, {"gpus": free[:wanted], "state": RUNNING, "runner_pid": os.getpid()})
        return free[:wanted]


def _wait_for_gpus(record: dict) -> dict:
    """On a GPU machine, stay PENDING until enough GPUs are free, like SLURM's GRES scheduling."""
    available = machine_gpu_count()
    wanted = record["gpus_per_node"] * record.get("nodes", 1)
    if not available or not wanted:
        return record  # no real GPUs: number them 0..n-1 as SLURM would on an empty node
    if wanted > available:
        return _update(record["job_id"], dict(
            state=FAILED, exit_code=1, ended_at=time.time(),
            reason=f"asks for {wanted} GPUs ({record.get('nodes', 1)} node(s) × {record['gpus_per_node']}); "
                   f"this machine has {available}"))
    while _claim_gpus(record["job_id"], wanted, available) is None:
        if _read(record["job_id"]).get("cancel_requested"):
            break
        time.sleep(0.5)
    return _read(record["job_id"])


def run(job_id: str) -> int:
    """The runner: wait for GPUs, execute the job script, enforce its time limit, record how it ended."""
    # From now on a vanished runner shows as NODE_FAIL (before, as a runner that could not start).
    record = _update(job_id, {"runner_pid": os.getpid(), "runner_started": True})
    while record.get("held") and not record.get("cancel_requested"):
        time.sleep(0.2)  # `sbatch --hold`: the submitter is still preparing the run folder
        record = _read(job_id)
    record = _wait_for_gpus(record)
    if record["state"] == FAILED:
        return 0
    if record.get("cancel_requested"):
        _update(job_id, {"state": CANCELLED, "ended_at": time.time()})
        return 0
    with open(record["stdout"], "ab") as output:
        process = subprocess.Popen(["bash", record["script"]], cwd=record["workdir"], env=_job_environment(record),
                                   stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    record = _update(job_id, {"state": RUNNING, "runner_pid": os.getpid(), "script_pgid": process.pid,
                              "started_at": time.time()})
    timed_out = False
    try:
        process.wait(timeout=record["time_limit_s"])
    except subprocess.TimeoutExpired:
        timed_out = True
        _terminate_group(process)
    code = process.returncode
    def ended(record: dict) -> None:
        record["ended_at"] = time.time()
        if timed_out:
            record.update(state=TIMEOUT, exit_code=0, signal=signal.SIGTERM.value, reason="TimeLimit")
        elif record.get("cancel_requested"):
            record.update(state=CANCELLED, exit_code=0, signal=-code if code < 0 else None)
        elif code == 0:
            record.update(state=COMPLETED, exit_code=0)
        elif code < 0:
            record.update(state=FAILED, exit_code=0, signal=-code, reason=f"killed by signal {-code}")
        else:
            record.update(state=FAILED, exit_code=code, reason="NonZeroExitCode")

    _update(job_id, change=ended)
    return 0


def _terminate_group(process: subprocess.Popen) -> None:
    """SIGTERM the job's process group, then SIGKILL after a grace period, like slurmd's KillWait."""
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


class LocalBackend:
    """The Backend that runs jobs with bash on this machine."""

    name = "local"
    submit = staticmethod(submit)
    release = staticmethod(release)
    cancel = staticmethod(cancel)
    jobs_in = staticmethod(jobs_in)

    @staticmethod
    def query(job_ids: Sequence[str]) -> dict[str, JobInfo]:
        return {job_id: job_info(job_id) for job_id in job_ids}  # one file read each: no scheduler to spare

    @staticmethod
    def poll_policy() -> PollPolicy:
        return PollPolicy(first=0.2, longest=2.0)

    @staticmethod
    def available() -> bool:
        return True

    @staticmethod
    def owns(job_id: str) -> bool:
        return job_id.startswith(JOB_ID_PREFIX)


BACKEND = LocalBackend()

if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "run":
        sys.exit(run(sys.argv[2]))
    print("usage: python -m workshop_lib.jobs.local run JOB_ID", file=sys.stderr)
    sys.exit(2)

