"""Each rule derived from SLURM's semantics, shown on the real local cluster (Debian's slurm-wlm 22.05): the
defect as the linter sees it, then what sbatch or the job does with it; and the correct look-alike, clean to
the linter and accepted by SLURM. Scripts are tiny (`sbatch --test-only`, `env`, `sleep 0`); the cluster
starts once per test session (the `local_cluster` fixture).

The local cluster differs from Ibex in one way that matters here: its partition gives a job whole nodes
(8 GPUs each, OverSubscribe=EXCLUSIVE), so a job sees every GPU of its node; the tests compare steps, not jobs,
where GPU counts matter."""

from __future__ import annotations

import re
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from workshop_lib.checks.directive_rules import SET_ONLY_BY
from workshop_lib.checks.lint import lint_file

pytestmark = pytest.mark.cluster


def write(folder: Path, name: str, *lines: str, output: str | None = "%x-%j.out") -> Path:
    """A job script: #!/bin/bash, its log next to it (unless a line sets --output), then ``lines``."""
    path = folder / name
    head = ["#!/bin/bash"] + ([f"#SBATCH --output={folder}/{output}"] if output else [])
    path.write_text("\n".join(head + list(lines)) + "\n")
    return path


def rules(path: Path) -> set[str]:
    return {finding.rule for finding in lint_file(path)}


@dataclass(frozen=True)
class Ended:
    """A job that ran: its id, its final state, and its log (`<job name>-<job id>.out` next to the script)."""

    job_id: str
    state: str
    log: str


def run(*scripts: Path) -> list[Ended]:
    """Submit ``scripts`` together and wait until SLURM has none of them queued or running (polling squeue, which
    answers at once, rather than `sbatch --wait`, which sleeps seconds between its checks)."""
    ids = [subprocess.run(["sbatch", "--parsable", str(path)], capture_output=True, text=True, check=True,
                          cwd=path.parent, timeout=60).stdout.strip().split(";")[0] for path in scripts]
    deadline = time.monotonic() + 120
    while subprocess.run(["squeue", "--noheader", "--jobs", ",".join(ids)], capture_output=True, text=True,
                         timeout=60).stdout.strip():
        assert time.monotonic() < deadline, f"jobs {ids} still queued after 120 s"
        time.sleep(0.2)
    ended = []
    for path, job_id in zip(scripts, ids):
        shown = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=60).stdout
        state = re.search(r"JobState=(\w+)", shown)
        logs = list(path.parent.glob(f"*-{job_id}.out"))
        ended.append(Ended(job_id, state.group(1) if state else "UNKNOWN", logs[0].read_text() if logs else ""))
    return ended


def sbatch_test_only(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["sbatch", "--test-only", str(path)], capture_output=True, text=True, cwd=path.parent,
                          timeout=60)


# ---------------------------------------------------------------------------------------------
# Options that exclude or need each other; GPU types (sbatch --test-only)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rule, bad, good, refusal", [
    ("exclusive-options", ["--mem=8G", "--mem-per-gpu=8G", "--gpus-per-node=1"], ["--mem-per-gpu=8G",
     "--gpus-per-node=1"], "mutually exclusive"),
    ("exclusive-options", ["--gpus=1", "--cpus-per-gpu=2", "--cpus-per-task=2"], ["--gpus=1", "--cpus-per-gpu=2"],
     "mutually exclusive"),
    ("exclusive-options", ["--gpus=2", "--gpus-per-task=1", "--ntasks-per-gpu=1"], ["--gpus=2", "--gpus-per-task=1"],
     "mutually exclusive"),
    ("gpus-per-task-without-tasks", ["--gpus-per-task=1"], ["--gpus-per-task=1", "--ntasks=2"], "without either"),
    ("gpu-type-contradicts-constraint", ["--gres=gpu:a100:1", "--constraint=v100"],
     ["--gres=gpu:a100:1", "--constraint=a100"], "Invalid feature"),
    ("variable-in-directive", ["--nodes=$NODES"], ["--nodes=1"], "not a valid node count"),
    ("invalid-directive", ["--job-name=zero3 offload"], ["--job-name=\"zero3 offload\""], "Invalid directive"),
    ("counts-contradict", ["--nodes=1", "--gpus=8", "--gpus-per-node=4"], ["--nodes=2", "--gpus=8",
     "--gpus-per-node=4"], "required nodes (2)"),
    ("counts-contradict", ["--nodes=1", "--ntasks=8", "--ntasks-per-node=4"], ["--nodes=2", "--ntasks=8",
     "--ntasks-per-node=4"], "not available"),
])
def test_request_rules_match_what_sbatch_refuses(local_cluster, job_dir, rule, bad, good, refusal):
    refused = write(job_dir, "bad.sh", *(f"#SBATCH {option}" for option in bad), "sleep 0")
    accepted = write(job_dir, "good.sh", *(f"#SBATCH {option}" for option in good), "sleep 0")
    assert rule in rules(refused) and rule not in rules(accepted)
    answer = sbatch_test_only(refused)
    assert answer.returncode != 0 and refusal in answer.stderr
    assert sbatch_test_only(accepted).returncode == 0


def test_a_script_without_its_interpreter_line_is_refused(local_cluster, job_dir):
    blank_first = job_dir / "blank.sh"
    blank_first.write_text("\n#!/bin/bash\nsleep 0\n")
    no_line = job_dir / "none.sh"
    no_line.write_text("#SBATCH --nodes=1\nsleep 0\n")
    good = write(job_dir, "good.sh", "sleep 0")
    for path in (blank_first, no_line):
        assert "missing-shebang" in rules(path)
        assert "does not look like a batch script" in sbatch_test_only(path).stderr
    assert rules(good) == set() and sbatch_test_only(good).returncode == 0


def test_an_option_given_twice_takes_the_last_value(local_cluster, job_dir):
    twice = write(job_dir, "twice.sh", "#SBATCH --gpus-per-node=4", "#SBATCH --gpus-per-node=2",
                  "count=$SLURM_GPUS_PER_NODE; echo \"per_node=$count\"")
    assert "option-given-twice" in rules(twice)
    [ended] = run(twice)
    assert "per_node=2" in ended.log


def test_ntasks_wins_over_tasks_per_node(local_cluster, job_dir):
    capped = write(job_dir, "capped.sh", "#SBATCH --nodes=2", "#SBATCH --ntasks=2", "#SBATCH --ntasks-per-node=4",
                   "srun hostname | wc -l")
    full = write(job_dir, "full.sh", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4", "srun hostname | wc -l")
    assert "ntasks-caps-tasks-per-node" in rules(capped) and rules(full) == set()
    two, eight = run(capped, full)
    assert two.log.split() == ["2"] and eight.log.split() == ["8"]


def test_a_typed_a100_request_needs_no_constraint(local_cluster, job_dir):
    """The false alarm of issue 38: `--gres=gpu:a100:8` picks A100 nodes by itself (a v100 type finds none)."""
    nemo = ["#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=8", "srun singularity exec --nv \"$NEMO_IMAGE\" "
            "nemo llm finetune --factory llama31_8b trainer.devices=8 -y"]
    typed = write(job_dir, "typed.sh", "#SBATCH --gres=gpu:a100:8", *nemo)
    other = write(job_dir, "other.sh", "#SBATCH --gres=gpu:v100:8", *nemo)
    assert rules(typed) == set() and "nemo-needs-a100" in rules(other)
    assert sbatch_test_only(typed).returncode == 0
    assert "not available" in sbatch_test_only(other).stderr


# ---------------------------------------------------------------------------------------------
# #SBATCH lines: no variables, only `#SBATCH` at the start of a line, per-job patterns in folders
# ---------------------------------------------------------------------------------------------
def test_variable_in_an_output_path_is_taken_literally_and_the_job_fails(local_cluster, job_dir):
    bad = write(job_dir, "dollar.sh", f"#SBATCH --output={job_dir}/$USER/%j.out", "echo ran", output=None)
    tilde = write(job_dir, "tilde.sh", "#SBATCH --output=~/logs/%j.out", "echo ran", output=None)
    good = write(job_dir, "plain.sh", f"#SBATCH --output={job_dir}/%u-%j.out", "echo ran", output=None)
    assert "variable-in-directive" in rules(bad) & rules(tilde) and rules(good) == set()
    failed, failed_too, ran = run(bad, tilde, good)
    assert failed.state == failed_too.state == "FAILED" and not (job_dir / "$USER").exists()
    assert ran.state == "COMPLETED" and ran.log.strip() == "ran"


def test_a_folder_named_by_the_job_id_cannot_exist_and_the_job_fails(local_cluster, job_dir):
    (job_dir / "logs-known").mkdir()
    bad = write(job_dir, "perjob.sh", "#SBATCH --output=logs/%j/run.out", "echo ran", output=None)
    good = write(job_dir, "named.sh", "#SBATCH --job-name=known", "#SBATCH --output=logs-%x/%j.out", "echo ran",
                 output=None)
    assert "output-folder-missing" in rules(bad) and rules(good) == set()
    failed, ran = run(bad, good)
    assert failed.state == "FAILED" and not (job_dir / "logs").exists()
    assert ran.state == "COMPLETED" and len(list((job_dir / "logs-known").iterdir())) == 1


def test_directive_look_alikes_are_comments_to_sbatch(local_cluster, job_dir):
    """An indented `#SBATCH` or `#sbatch` sets nothing (and does not stop the directives after it)."""
    bad = write(job_dir, "look.sh", "  #SBATCH --comment=indented", "#sbatch --job-name=lower",
                "#SBATCH --time=7", "scontrol show job \"$SLURM_JOB_ID\" | grep -oE 'Comment=\\S*|TimeLimit=\\S*'",
                "echo \"name=$SLURM_JOB_NAME\"")
    good = write(job_dir, "real.sh", "#SBATCH --comment=indented", "#SBATCH --job-name=lower",
                 "scontrol show job \"$SLURM_JOB_ID\" | grep -oE 'Comment=\\S*'", "echo \"name=$SLURM_JOB_NAME\"")
    assert "directive-look-alike" in rules(bad) and rules(good) == set()
    ignored, read = run(bad, good)
    assert "Comment=indented" not in ignored.log and "TimeLimit=00:07:00" in ignored.log
    assert "name=look.sh" in ignored.log
    assert "Comment=indented" in read.log and "name=lower" in read.log


# ---------------------------------------------------------------------------------------------
# Output environment variables: the linter's table against what the jobs get
# ---------------------------------------------------------------------------------------------
_FORMS = {  # request form -> the variables of SET_ONLY_BY it must set (all others unset)
    ("--gres=gpu:1",): set(),
    ("--gpus-per-node=1", "--ntasks-per-node=2", "--cpus-per-task=1", "--mem-per-cpu=100M", "--array=0-0"):
        {"SLURM_GPUS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_CPUS_PER_TASK",
         "SLURM_MEM_PER_CPU", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_COUNT",
         "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_MAX"},
    ("--gpus=1", "--gpus-per-task=1", "--ntasks=1", "--mem-per-gpu=100M", "--cpus-per-gpu=1"):
        {"SLURM_GPUS", "SLURM_GPUS_PER_TASK", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_MEM_PER_GPU",
         "SLURM_CPUS_PER_GPU"},
    ("--mem=100M",): {"SLURM_MEM_PER_NODE"},
}


def test_each_output_variable_is_set_only_by_its_options(local_cluster, job_dir):
    """sbatch(1) OUTPUT ENVIRONMENT VARIABLES, as the jobs see them: the table slurm-variable-unset reads."""
    report = [f"for name in {' '.join(SET_ONLY_BY)}; do [ -n \"${{!name+x}}\" ] && echo \"set $name\"; done",
              "echo \"gpus_on_node=$SLURM_GPUS_ON_NODE\""]
    scripts = [write(job_dir, f"env{index}.sh", *(f"#SBATCH {option}" for option in form), *report)
               for index, form in enumerate(_FORMS)]
    for ended, (form, expected) in zip(run(*scripts), _FORMS.items()):
        assert set(re.findall(r"^set (\S+)", ended.log, re.M)) == expected, form
        assert re.search(r"gpus_on_node=\d", ended.log), form  # set under every GPU request form


def test_the_gpu_id_variables_hold_a_list_not_a_count(local_cluster, job_dir):
    bad = write(job_dir, "list.sh", "#SBATCH --gres=gpu:2", "torchrun --nproc_per_node=$SLURM_JOB_GPUS train.py")
    good = write(job_dir, "count.sh", "#SBATCH --gres=gpu:2", "torchrun --nproc_per_node=$SLURM_GPUS_ON_NODE train.py")
    assert "gpu-list-as-count" in rules(bad) and rules(good) == set()
    probe = write(job_dir, "probe.sh", "#SBATCH --gres=gpu:2", "gpus=$SLURM_JOB_GPUS; echo \"ids=$gpus\"")
    [ended] = run(probe)
    assert re.search(r"^ids=\d+(,\d+)+$", ended.log, re.M)


def test_a_variable_the_request_form_does_not_set_is_empty(local_cluster, job_dir):
    body = "workers=$SLURM_GPUS_PER_NODE; echo \"nproc=[$workers] on_node=[$SLURM_GPUS_ON_NODE]\""
    bad = write(job_dir, "gres.sh", "#SBATCH --gres=gpu:2", "#SBATCH --cpus-per-task=2", body)
    good = write(job_dir, "pernode.sh", "#SBATCH --gpus-per-node=2", body)
    assert "slurm-variable-unset" in rules(bad) and rules(good) == set()
    unset, set_ = run(bad, good)
    assert "nproc=[] on_node=[" in unset.log and "nproc=[2]" in set_.log


# ---------------------------------------------------------------------------------------------
# Job steps: --export, background steps, steps side by side, step-level GPUs
# ---------------------------------------------------------------------------------------------
def test_srun_export_without_all_loses_path_and_exports(local_cluster, job_dir):
    lines = ["export MASTER_ADDR=head-node"]
    named = write(job_dir, "named.sh", *lines, "srun --export=MASTER_PORT=1234 bash -c 'echo \"addr=$MASTER_ADDR\"'")
    none = write(job_dir, "none.sh", *lines, "srun --export=NONE /bin/bash -c 'echo \"addr=[$MASTER_ADDR]\"'")
    job_none = write(job_dir, "jobnone.sh", "#SBATCH --export=NONE", "srun bash -c 'echo reached'")
    good = write(job_dir, "all.sh", *lines, "srun --export=ALL,MASTER_PORT=1234 bash -c 'echo \"addr=$MASTER_ADDR\"'")
    for path in (named, none, job_none):
        assert "srun-export-drops-environment" in rules(path), path.name
    assert rules(good) == set()
    named, none, job_none, good = run(named, none, job_none, good)
    assert "execve(): bash: No such file or directory" in named.log
    assert "addr=[]" in none.log
    assert "reached" not in job_none.log and "execve(): bash" in job_none.log
    assert "addr=head-node" in good.log


def test_a_step_with_fewer_tasks_than_nodes_leaves_nodes_without_a_launcher(local_cluster, job_dir):
    launch = "srun {}torchrun --nnodes=2 --nproc_per_node=4 --rdzv_backend=c10d --rdzv_endpoint=\"$HEAD:29400\" t.py"
    head = ["#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=4",
            "HEAD=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)"]
    assert "launcher-missing-on-nodes" in rules(write(job_dir, "one.sh", *head, launch.format("--ntasks=1 ")))
    assert rules(write(job_dir, "each.sh", *head, launch.format("--ntasks-per-node=1 "))) == set()
    probe = "srun {}bash -c 'echo \"launcher on $SLURMD_NODENAME\"'"
    one, each = run(write(job_dir, "probe1.sh", *head, probe.format("--ntasks=1 ")),
                    write(job_dir, "probe2.sh", *head, probe.format("--ntasks-per-node=1 ")))
    # srun says "can't run 1 processes on 2 nodes, setting nnodes to 1"
    assert sorted(re.findall(r"launcher on (\S+)", one.log)) == ["node1"], one.log
    assert sorted(re.findall(r"launcher on (\S+)", each.log)) == ["node1", "node2"]


def test_a_step_cannot_ask_for_more_nodes_than_the_job(local_cluster, job_dir):
    bad = write(job_dir, "twonode.sh", "#SBATCH --nodes=1", "srun --nodes=2 --ntasks-per-node=1 hostname")
    good = write(job_dir, "onenode.sh", "#SBATCH --nodes=1", "srun --ntasks-per-node=1 hostname")
    assert "step-exceeds-job" in rules(bad) and rules(good) == set()
    refused, ran = run(bad, good)
    assert "Only allocated 1 nodes asked for 2" in refused.log and ran.state == "COMPLETED" and ran.log.strip()


def test_a_background_step_nobody_waits_for_is_killed(local_cluster, job_dir):
    step = "srun bash -c 'sleep 1; echo step-finished' &"
    bad = write(job_dir, "nowait.sh", step, "echo batch-done")
    good = write(job_dir, "wait.sh", step, "echo batch-done", "wait")
    assert "background-step-not-waited" in rules(bad) and rules(good) == set()
    killed, waited = run(bad, good)
    assert "batch-done" in killed.log and "step-finished" not in killed.log
    assert "step-finished" in waited.log


@pytest.mark.slow
def test_background_steps_without_exact_run_one_after_the_other(local_cluster, job_dir):
    """Each step waits (at most 5 s) for a marker the other writes: side by side they meet, one after the other
    they do not, and srun says 'step creation temporarily disabled'."""
    def steps(extra: str) -> list[str]:
        return ["#SBATCH --nodes=1", "#SBATCH --ntasks=2", "#SBATCH --gres=gpu:4"] + [
            f"srun {extra}--ntasks=1 --gres=gpu:2 bash -c 'touch {me}; for i in $(seq 50); do "
            f"[ -e {other} ] && {{ echo met-$CUDA_VISIBLE_DEVICES; exit 0; }}; sleep 0.1; done; echo alone' &"
            for me, other in (("$PWD/m.$SLURM_JOB_ID.a", "$PWD/m.$SLURM_JOB_ID.b"),
                              ("$PWD/m.$SLURM_JOB_ID.b", "$PWD/m.$SLURM_JOB_ID.a"))] + ["wait"]
    bad = write(job_dir, "serial.sh", *steps(""))
    good = write(job_dir, "exact.sh", *steps("--exact "))
    assert "parallel-steps-serialize" in rules(bad) and rules(good) == set()
    serial, side_by_side = run(bad, good)
    assert "alone" in serial.log and "step creation temporarily disabled" in serial.log
    devices = re.findall(r"met-(\S+)", side_by_side.log)
    assert len(devices) == 2 and set(devices[0].split(",")).isdisjoint(devices[1].split(","))


@pytest.mark.slow
def test_a_foreground_step_waits_for_a_background_step_without_exact(local_cluster, job_dir):
    """A monitor step started with `srun ... &` and the training step after it cannot run at once: one waits for
    the other to end. With --overlap the monitor sees (within 5 s) the marker the training step writes."""
    monitor = ("srun{} bash -c 'for i in $(seq 50); do [ -e \"$PWD/started.$SLURM_JOB_ID\" ] && "
               "{{ echo monitor-met; exit 0; }}; sleep 0.1; done; echo monitor-alone' &")
    training = "srun bash -c 'touch \"$PWD/started.$SLURM_JOB_ID\"'"
    bad = write(job_dir, "monitor.sh", "#SBATCH --nodes=1", "#SBATCH --ntasks=1", monitor.format(""), training, "wait")
    good = write(job_dir, "overlap.sh", "#SBATCH --nodes=1", "#SBATCH --ntasks=1", monitor.format(" --overlap"),
                 training, "wait")
    assert "parallel-steps-serialize" in rules(bad) and rules(good) == set()
    serial, overlapped = run(bad, good)
    # whichever srun is created first, the other waits for it to end
    assert "step creation temporarily disabled" in serial.log, serial.log
    assert "monitor-met" in overlapped.log and "temporarily disabled" not in overlapped.log, overlapped.log


def test_a_step_s_own_gpu_request_is_what_its_launcher_sees(local_cluster, job_dir):
    """srun's --gres on a step wins over the job's: torchrun --nproc_per_node=4 there would get one GPU."""
    bad = write(job_dir, "onegpu.sh", "#SBATCH --ntasks=1", "#SBATCH --gpus-per-node=4",
                "srun --ntasks=1 --gres=gpu:1 torchrun --nproc_per_node=4 train.py",
                output="%x-%j.out")
    assert "workers-gpus-mismatch" in rules(bad)
    probe = write(job_dir, "probe.sh", "#SBATCH --ntasks=1", "#SBATCH --gpus-per-node=4",
                  "srun --ntasks=1 --gres=gpu:1 bash -c 'echo \"visible=$CUDA_VISIBLE_DEVICES\"'")
    [ended] = run(probe)
    assert re.search(r"visible=\d+$", ended.log, re.M)  # one GPU, not four


def test_a_task_bound_to_its_gpu_sees_one_device(local_cluster, job_dir):
    """--gpus-per-task binds each task to its GPU: task 1 sees one device, so device $SLURM_LOCALID = 1 is not there."""
    report = "srun bash -c 'echo \"task $SLURM_LOCALID sees $CUDA_VISIBLE_DEVICES\"'"
    use = "srun bash -c 'LOCAL_RANK=$SLURM_LOCALID python3 train.py'"
    bound = ["#SBATCH --nodes=1", "#SBATCH --ntasks=2", "#SBATCH --gpus-per-task=1"]
    unbound = ["#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=2", "#SBATCH --gpus-per-node=2"]
    assert "local-rank-vs-bound-gpu" in rules(write(job_dir, "bad.sh", *bound, use))
    assert rules(write(job_dir, "good.sh", *unbound, use)) == set()
    seen_bound, seen_unbound = run(write(job_dir, "bound.sh", *bound, report),
                                   write(job_dir, "all.sh", *unbound, report))
    visible = dict(re.findall(r"task (\d) sees (\S+)", seen_bound.log))
    assert len(visible["1"].split(",")) == 1  # device index 1 does not exist for task 1
    visible = dict(re.findall(r"task (\d) sees (\S+)", seen_unbound.log))
    assert len(visible["1"].split(",")) == 2


# ---------------------------------------------------------------------------------------------
# Job arrays: one log, one port, one folder
# ---------------------------------------------------------------------------------------------
def test_array_tasks_sharing_an_output_file_lose_logs(local_cluster, job_dir):
    # one task at a time (%1), so what the second does to the first's log is the same on every run
    bad = write(job_dir, "shared.sh", "#SBATCH --array=0-1%1", "#SBATCH --output=shared.out",
                "echo \"task $SLURM_ARRAY_TASK_ID\"", output=None)
    good = write(job_dir, "apart.sh", "#SBATCH --array=0-1%1", "#SBATCH --output=apart-%A_%a.out",
                 "echo \"task $SLURM_ARRAY_TASK_ID\"", output=None)
    assert "array-shared-output" in rules(bad) and rules(good) == set()
    run(bad, good)
    shared = (job_dir / "shared.out").read_text()
    assert shared == "task 1\n"  # the second task truncated the first's log
    assert len(list(job_dir.glob("apart-*_*.out"))) == 2


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# Binds the port, writes a marker, and waits (at most 5 s) for the other task's marker before letting go.
_BIND = """import os, socket, sys, time
sock = socket.socket()
try:
    sock.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit("bind-failed")
open(f"bound.{os.environ['SLURM_ARRAY_TASK_ID']}", "w").close()
for _ in range(50):
    if len([name for name in os.listdir() if name.startswith("bound.")]) == 2:
        break
    time.sleep(0.1)
print("bound")
"""


@pytest.mark.slow
def test_array_tasks_on_a_fixed_port_collide(local_cluster, job_dir):
    """Both tasks of the array run at once (the cluster's two nodes share this host, as array tasks share an Ibex
    node); each binds the port, then waits (at most 5 s) for the other's marker."""
    (job_dir / "bind.py").write_text(_BIND)
    bind = f"python3 {job_dir}/bind.py \"$MASTER_PORT\" 2>&1"
    port = _free_port()
    bad = write(job_dir, "fixed.sh", "#SBATCH --array=0-1", "#SBATCH --output=fixed-%a.out",
                f"export MASTER_PORT={port}", f"cd {job_dir}/fixed", bind, output=None)
    good = write(job_dir, "perjob.sh", "#SBATCH --array=0-1", "#SBATCH --output=perjob-%a.out",
                 "export MASTER_PORT=$((40000 + SLURM_JOB_ID % 20000))", f"cd {job_dir}/perjob", bind, output=None)
    (job_dir / "fixed").mkdir()
    (job_dir / "perjob").mkdir()
    assert "array-shared-port" in rules(bad) and rules(good) == set()
    run(bad)  # the two arrays one after the other: each needs both nodes at once
    outcomes = sorted((job_dir / f"fixed-{task}.out").read_text().split()[-1] for task in (0, 1))
    assert outcomes == ["bind-failed", "bound"]
    run(good)
    assert [(job_dir / f"perjob-{task}.out").read_text().split()[-1] for task in (0, 1)] == ["bound", "bound"]


def test_an_array_index_past_the_end_of_its_list_reads_nothing(local_cluster, job_dir):
    lines = ["#SBATCH --array={}", "#SBATCH --output=%x-%a.out", "LRS=(1e-4 3e-4)",
             "LR=${{LRS[$SLURM_ARRAY_TASK_ID]}}", "echo \"lr=[$LR]\""]
    bad = write(job_dir, "from1.sh", *(line.format("1-2") for line in lines), output=None)
    good = write(job_dir, "from0.sh", *(line.format("0-1") for line in lines), output=None)
    (job_dir / "params.txt").write_text("a\nb\n")
    sed = ["#SBATCH --array={}", "#SBATCH --output=%x-%a.out",
           "echo \"param=[$(sed -n \"${{SLURM_ARRAY_TASK_ID}}p\" params.txt)]\" 2>&1"]
    sed_bad = write(job_dir, "sed0.sh", *(line.format("0-1") for line in sed), output=None)
    sed_good = write(job_dir, "sed1.sh", *(line.format("1-2") for line in sed), output=None)
    for path in (bad, sed_bad):
        assert "array-index-out-of-range" in rules(path), path.name
    for path in (good, sed_good):
        assert rules(path) == set(), path.name
    run(bad, good, sed_bad, sed_good)
    assert (job_dir / "from1.sh-2.out").read_text().strip() == "lr=[]"
    assert {(job_dir / f"from0.sh-{task}.out").read_text().strip() for task in (0, 1)} == {"lr=[1e-4]", "lr=[3e-4]"}
    assert "line address 0" in (job_dir / "sed0.sh-0.out").read_text()
    assert {(job_dir / f"sed1.sh-{task}.out").read_text().strip() for task in (1, 2)} == {"param=[a]", "param=[b]"}


def test_array_tasks_writing_one_folder_overwrite_each_other(local_cluster, job_dir):
    write_result = "mkdir -p \"$RUN\" && echo \"$SLURM_ARRAY_TASK_ID\" > \"$RUN/result.txt\""
    bad = write(job_dir, "onefolder.sh", "#SBATCH --array=0-1", "#SBATCH --output=one-%a.out",
                f"RUN={job_dir}/runs", f"python3 -c pass --output_dir {job_dir}/runs; {write_result}", output=None)
    good = write(job_dir, "folders.sh", "#SBATCH --array=0-1", "#SBATCH --output=many-%a.out",
                 f"RUN={job_dir}/runs-$SLURM_ARRAY_TASK_ID", f"python3 -c pass --output_dir \"$RUN\"; {write_result}",
                 output=None)
    assert "array-shared-folder" in rules(bad) and rules(good) == set()
    run(bad, good)
    assert len(list((job_dir / "runs").iterdir())) == 1  # two tasks, one result left
    assert len(list(job_dir.glob("runs-*/result.txt"))) == 2


# ---------------------------------------------------------------------------------------------
# Paths with variables: what the shell expands, the linter expands
# ---------------------------------------------------------------------------------------------
def test_a_relative_path_after_cd_into_a_user_folder(local_cluster, job_dir):
    (job_dir / "train.py").write_text("print('trained')\n")
    scratch = job_dir / f"scratch-{__import__('getpass').getuser()}"
    scratch.mkdir()
    bad = write(job_dir, "cdrel.sh", f"cd {job_dir}/scratch-$USER", "python3 train.py")
    good = write(job_dir, "cdabs.sh", f"cd {job_dir}/scratch-$USER", "python3 \"$SLURM_SUBMIT_DIR/train.py\"")
    assert "relative-path-after-cd" in rules(bad) and rules(good) == set()
    relative, absolute = run(bad, good)
    assert "No such file or directory" in relative.log and "trained" in absolute.log
