"""Linter rules for hand-written multi-GPU, multi-node launches (torchrun, DeepSpeed's and Accelerate's launchers,
and NeMo), each launch read by ``checks.launches`` with where it runs. ``RULES`` lists the rules in the order they
run."""

from __future__ import annotations

import re
from typing import Iterable

from workshop_lib.checks.findings import ERROR, WARNING, Finding
from workshop_lib.checks.launches import (
    _DEVICES_PREFIX,
    _LAUNCHER,
    _LOCAL_HOSTS,
    _RANK_VARIABLE,
    _SRUN,
    ONE_HOST_PRAGMA,
    Launch,
    ScriptLaunches,
    _has_flag,
    _in_background,
    _launchers,
    _logical_lines,
    _name,
    _option,
    _segment_before,
    _short,
    accelerate_setting,
    launches_of,
    own_gpus,
    workers_per_node,
)
from workshop_lib.checks.nemo_command import nemo_overrides
from workshop_lib.checks.script import Script


# ---------------------------------------------------------------------------------------------
# Where the launchers run
# ---------------------------------------------------------------------------------------------
def _launch_placement(script: Script) -> Iterable[Finding]:
    job = launches_of(script)
    nodes = job.nodes
    tasks = job.tasks_per_node() or 1
    for launch in job.launches:
        if launch.kind == "nemo":
            if not launch.under_srun and ((nodes or 1) > 1 or tasks > 1):
                yield Finding(
                    "launcher-without-srun", ERROR,
                    f"nemo llm runs in the batch shell of a job with {nodes} node(s) x {tasks} task(s) per node: "
                    "Lightning reads SLURM's task layout and waits for ranks that srun never starts (the job hangs "
                    "until the time limit).",
                    "start it with srun (srun singularity exec ... nemo llm ...): srun starts one rank per task.",
                    launch.line)
            continue
        if nodes and nodes > 1 and not launch.under_srun and launch.kind != "deepspeed":
            yield Finding(
                "launcher-without-srun", ERROR,
                f"{_name(launch.kind)} runs in the batch shell of a --nodes={nodes} job: the batch shell runs on "
                "the first node only, so "
                + ("the other node sits" if nodes == 2 else f"the other {nodes - 1} nodes sit")
                + " idle (and a multi-node rendezvous waits for them until the time limit).",
                f"start it once per node: srun --ntasks-per-node=1 {launch.args.split()[0]} ...", launch.line)
        if launch.under_srun and nodes and nodes > 1 and not _has_flag(launch.srun_text, "-w", "--nodelist"):
            # srun(1): -n/--ntasks and -N/--nodes of a step; fewer than the job's nodes leave nodes without a launcher
            tasks = _option(launch.srun_text, "--ntasks") or _short(launch.srun_text, "n")
            step_nodes = _option(launch.srun_text, "--nodes") or _short(launch.srun_text, "N")
            counts = [script.number(found[0]) for found in (tasks, step_nodes) if found]
            reach = min((count for count in counts if count), default=None)
            if reach is not None and reach < nodes:
                yield Finding(
                    "launcher-missing-on-nodes", ERROR,
                    f"srun starts {_name(launch.kind)} on {reach} of the job's {nodes} nodes (its "
                    f"{'--ntasks' if tasks else '--nodes'} is {reach}): the other "
                    f"node{'s run' if nodes - reach > 1 else ' runs'} no launcher, so a multi-node rendezvous waits "
                    "until the time limit.",
                    f"start one per node: srun --nodes={nodes} --ntasks-per-node=1 {launch.args.split()[0]} ...",
                    launch.line)
        if launch.under_srun:
            per_node = job.tasks_per_node(launch.srun_text)
            if per_node and per_node > 1:
                yield Finding(
                    "launchers-per-task", ERROR,
                    f"srun starts {_name(launch.kind)} once per task, and the step has {per_node} tasks per node: "
                    f"{per_node} launchers per node, each starting its own workers on the same GPUs "
                    f"({per_node} x workers processes, which collide on ports and GPUs).",
                    f"run one launcher per node: srun --ntasks-per-node=1 {launch.args.split()[0]} ... (keep "
                    "--ntasks-per-node=N only when srun itself starts the N workers, without a launcher).",
                    launch.line)


# ---------------------------------------------------------------------------------------------
# GPUs and workers
# ---------------------------------------------------------------------------------------------
def _gpus_and_workers(script: Script) -> Iterable[Finding]:
    job = launches_of(script)
    launchers = _launchers(job)
    if not launchers:
        return
    header, nodes = script.header, job.nodes
    first = launchers[0]
    if job.gpus_total and nodes and nodes > 1 and not header.get("gpus-per-node") and not header.get("gres"):
        yield Finding(
            "gpus-total-over-nodes", ERROR,
            f"--gpus={header.get('gpus')} is a total for the job: over --nodes={nodes} SLURM may place them "
            f"unevenly (e.g. {job.gpus_total - 1} + 1), while {_name(first.kind)} starts the same number of "
            "workers on every node.",
            f"ask per node: --gpus-per-node={max(job.gpus_total // nodes, 1)} (and drop --gpus).", header.line("gpus"))
        return
    job_visible = job.gpus_per_task if job.gpus_per_task else job.gpus_per_node
    side_by_side = [launch for launch in launchers if _in_background(launch)]
    for launch in launchers:
        workers = workers_per_node(script, launch)
        own = own_gpus(script, launch)
        visible = own or job_visible
        if workers is None or visible is None:
            continue
        number, offset, said = workers
        if number == visible:
            continue
        if own is None and len(side_by_side) > 1 and launch in side_by_side:
            yield Finding(
                "workers-gpus-mismatch", ERROR,
                f"{len(side_by_side)} launches run side by side and each sees all {visible} GPUs of the node: every "
                f"one numbers its workers from 0, so all of them use the first {number} GPU{'s' if number > 1 else ''} "
                "and the rest sit idle.",
                "give each launch its own GPUs: CUDA_VISIBLE_DEVICES=0,1 torchrun ... & CUDA_VISIBLE_DEVICES=2,3 "
                "torchrun ... & (or srun --exact --gres=gpu:2 ... &), then wait.", launch.line_of(offset))
            return
        if job.gpus_per_task and own is None and launch.kind != "accelerate":
            yield Finding(
                "gpus-per-task-with-launcher", ERROR,
                f"--gpus-per-task={header.get('gpus-per-task')}: the task that runs {_name(launch.kind)} sees only "
                f"its own {visible} GPU{'s' if visible > 1 else ''}, while {said} starts {number} "
                "workers on the node (CUDA error: invalid device ordinal).",
                f"ask per node for a launcher: --ntasks-per-node=1 and --gpus-per-node={number}.",
                header.line("gpus-per-task"))
            continue
        yield Finding(
            "workers-gpus-mismatch", ERROR,
            f"{said} where the job holds {visible} GPU{'s' if visible > 1 else ''} per node: "
            + (f"{visible - number} GPUs per node sit idle." if number < visible
               else f"{number - visible} workers have no GPU (CUDA error: invalid device ordinal).")
            + (" Accelerate's --num_processes is the total over all machines." if launch.kind == "accelerate" else ""),
            _workers_fix(launch.kind, visible, nodes), launch.line_of(offset))



def _workers_fix(kind: str, per_node: int, nodes: int | None) -> str:
    if kind == "torchrun":
        return f"use --nproc_per_node={per_node} (or --nproc_per_node=gpu: one worker per GPU the node holds)."
    if kind == "deepspeed":
        return (f"use --num_gpus={per_node} (and slots={per_node} in the hostfile), or leave it out with "
                f"slots={per_node}.")
    total = per_node * (nodes or 1)
    return (f"use --num_processes={total} (GPUs per node x nodes = {per_node} x {nodes or 1}) with "
            f"--num_machines={nodes or 1}.")


def _launcher_nodes(script: Script) -> Iterable[Finding]:
    job = launches_of(script)
    nodes = job.nodes
    if not nodes:
        return
    for launch in _launchers(job):
        option = {"torchrun": "--nnodes", "accelerate": "--num_machines", "deepspeed": "--num_nodes"}.get(launch.kind)
        if option is None:
            continue
        found = accelerate_setting(script, launch, "num_machines") if launch.kind == "accelerate" else \
            _option(launch.args, option)
        if found and ":" in found[0]:
            continue  # an elastic range (min:max): torchrun waits for what it gets
        # no --num_nodes: the deepspeed launcher uses every host of its hostfile (rule deepspeed-without-hostfile)
        written = script.number(found[0]) if found else (None if launch.kind == "deepspeed" else 1)
        if written is None or written == nodes:
            continue
        said = f"{option}={found[0]}" if found else f"no {option} (so 1)"
        yield Finding(
            "launcher-nodes-mismatch", ERROR,
            f"{_name(launch.kind)} with {said} in a --nodes={nodes} job: "
            + (f"it starts workers on {written} of the {nodes} nodes of its hostfile and the others sit idle."
               if launch.kind == "deepspeed" and written < nodes else
               "each node forms a group of its own and trains alone (or the rendezvous waits for nodes that "
               "never come)." if written < nodes else "the rendezvous waits for nodes the job does not have, "
               "until the time limit."),
            f"use {option}=$SLURM_NNODES (or {option}={nodes}).", launch.line_of(found[1]) if found else launch.line)
    command = nemo_overrides(script.code)
    num_nodes = command.value("trainer.num_nodes")
    nemo = "nemo llm" in script.code or num_nodes is not None
    written = script.number(num_nodes) if num_nodes is not None else (1 if nemo else None)
    if nemo and written is not None and written != nodes:
        said = f"trainer.num_nodes={num_nodes}" if num_nodes is not None else "no trainer.num_nodes (the recipe's 1)"
        yield Finding(
            "launcher-nodes-mismatch", ERROR,
            f"NeMo with {said} in a --nodes={nodes} job: Lightning's world size is trainer.devices x "
            "trainer.num_nodes, so the ranks of the other nodes do not fit it and NeMo stops at start-up "
            "(or every node trains alone).",
            f"pass trainer.num_nodes=$SLURM_NNODES (or {nodes}).",
            command.line("trainer.num_nodes") or script.line_of("nemo llm") or script.header.line("nodes"))


# ---------------------------------------------------------------------------------------------
# Rendezvous
# ---------------------------------------------------------------------------------------------
def _rendezvous(script: Script) -> Iterable[Finding]:
    job = launches_of(script)
    if not job.nodes or job.nodes < 2 or ONE_HOST_PRAGMA in script.text:
        return
    for launch in _launchers(job):
        if launch.kind == "deepspeed":
            continue  # its hostfile names the nodes (rule deepspeed-without-hostfile)
        if launch.kind == "torchrun":
            if _has_flag(launch.args, "--standalone"):
                yield _localhost(launch, "--standalone", "a rendezvous on each node's own localhost")
                continue
            found = _option(launch.args, "--rdzv_endpoint")
            option = "--rdzv_endpoint"
            if found is None:
                found, option = _option(launch.args, "--master_addr"), "--master_addr"
            exported = job.value_of("PET_RDZV_ENDPOINT") or job.value_of("PET_MASTER_ADDR")
            names = "--rdzv_endpoint (or --master_addr)"
        else:
            if _has_flag(launch.args, "--config_file"):
                continue  # the config file may name the main machine
            found = _option(launch.args, "--main_process_ip")
            exported, names, option = None, "--main_process_ip", "--main_process_ip"
        if found is None and exported is None:
            yield Finding(
                "rendezvous-missing", ERROR,
                f"{_name(launch.kind)} on {job.nodes} nodes without {names}: it rendezvous at 127.0.0.1 (its "
                "default; MASTER_ADDR in the environment is not read by the launcher), so each node waits for "
                "the others on itself until the time limit.",
                _rendezvous_fix(launch.kind), launch.line)
            continue
        value = found[0] if found else exported
        resolved = _resolve(job, value)
        said = f"{option}={value}" if found else f"PET_RDZV_ENDPOINT/PET_MASTER_ADDR={value}"
        if any(host in resolved for host in _LOCAL_HOSTS):
            yield _localhost(launch, said + (f" (so {resolved})" if resolved != value else ""),
                             "an address that means a different machine on every node",
                             launch.line_of(found[1]) if found else launch.line)
            continue
        unset = _never_set(script, value.split(":")[0] if option == "--rdzv_endpoint" else value)
        if unset:
            yield Finding(
                "rendezvous-missing", ERROR,
                f"{_name(launch.kind)} with {said}: this script never sets {unset} (nor sources a file that could), "
                "so the launcher gets an empty address and every node waits until the time limit.",
                _rendezvous_fix(launch.kind), launch.line_of(found[1]) if found else launch.line)
            continue
        yield from _node_rank(launch, job)


def _never_set(script: Script, host: str) -> str | None:
    """`$MASTER_ADDR` when the host is only that variable and nothing in the script can set it."""
    match = re.fullmatch(r"\$\{?([A-Za-z_]\w*)\}?", host.strip())
    if not match or match.group(1).startswith(("SLURM", "PET_")):
        return None
    name, code = match.group(1), script.code
    if re.search(r"^\s*(?:source|\.|eval)\s", code, re.M) or re.search(
            rf"(?<![\w$]){name}=|\bread\b[^\n]*\b{name}\b|\bfor\s+{name}\b|\bdeclare\b[^\n]*\b{name}\b", code):
        return None
    return f"${name}"


def _node_rank(launch: Launch, job: ScriptLaunches) -> Iterable[Finding]:
    """A static rendezvous (torchrun's default, Accelerate's) needs each node's rank; left out, every node is 0."""
    backend = _option(launch.args, "--rdzv_backend")
    if backend and backend[0] in ("c10d", "etcd", "etcd-v2"):
        return  # the rendezvous hands out node ranks itself
    option = "--node_rank" if launch.kind == "torchrun" else "--machine_rank"
    if _option(launch.args, option) or job.value_of("PET_NODE_RANK") is not None:
        return
    yield Finding(
        "node-rank-missing", ERROR,
        f"{_name(launch.kind)} with a static rendezvous on {job.nodes} nodes and no {option}: it defaults to 0 on "
        "every node, so all nodes claim rank 0 and the rendezvous hangs or fails with a duplicate rank.",
        f"pass {option}=\"$SLURM_NODEID\" inside single quotes (srun bash -c '...'), or use "
        "--rdzv_backend=c10d, which numbers the nodes itself.", launch.line)


def _resolve(job: ScriptLaunches, value: str) -> str:
    """`$MASTER_ADDR:29500` with MASTER_ADDR=localhost assigned in the script -> `localhost:29500`."""
    def substitute(match: re.Match) -> str:
        return job.value_of(match.group(1)) or match.group(0)

    return re.sub(r"\$\{?([A-Za-z_]\w*)\}?", substitute, value)


def _localhost(launch: Launch, what: str, meaning: str, line: int | None = None) -> Finding:
    return Finding(
        "rendezvous-localhost", ERROR,
        f"{_name(launch.kind)} with {what} in a multi-node job: {meaning}, so the nodes never meet (each "
        "waits, or trains alone).", _rendezvous_fix(launch.kind), line or launch.line)


def _rendezvous_fix(kind: str) -> str:
    head = 'HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1) before srun, then '
    if kind == "accelerate":
        return head + "--main_process_ip \"$HEAD_NODE\" --main_process_port <port> --machine_rank \"\\$SLURM_NODEID\" " \
                      "(inside single quotes)."
    return head + '--rdzv_backend=c10d --rdzv_endpoint="$HEAD_NODE:<port>" (the same on every node).'


def _ranks_expanded_early(script: Script) -> Iterable[Finding]:
    job = launches_of(script)
    several = (job.nodes or 1) > 1 or (job.tasks_per_node() or 1) > 1
    if not several:
        return
    for region in job.regions:
        batch = not region.under_srun and region.expanded
        for start, text in _logical_lines(region.text, region.first_line):
            on_srun_line = batch and _SRUN.search(text) is not None
            assignment = batch and re.match(r"\s*(?:export\s+)?[A-Za-z_]\w*=", text) is not None
            runs_as_task = region.under_srun and region.expanded
            if not (on_srun_line or assignment or runs_as_task):
                continue
            for match in _RANK_VARIABLE.finditer(text):
                if _protected(text, match.start(), region.under_srun):
                    continue
                variable = match.group(1)
                yield Finding(
                    "rank-expanded-in-batch-shell", ERROR,
                    f"${variable} is expanded by the batch shell, where it is 0, before srun starts the tasks: "
                    f"every node (or task) gets {variable}=0, so all claim rank 0 and the rendezvous hangs or "
                    "fails with duplicate ranks.",
                    f"let each task's shell expand it: srun bash -c '... ${variable} ...' (single quotes), or "
                    f"\\${variable} inside double quotes, or a quoted heredoc (<<'EOF').",
                    start + text.count("\n", 0, match.start()))
                break


def _protected(text: str, offset: int, in_task_string: bool) -> bool:
    """True when `$` at offset is escaped, or inside single quotes of the batch shell's own line."""
    if offset and text[offset - 1] == "\\":
        return True
    if in_task_string:
        return False  # a double-quoted string or heredoc: inner single quotes do not stop the batch shell
    state = None
    for char in text[:offset]:
        if state is None and char in "'\"":
            state = char
        elif state == char:
            state = None
    return state == "'"


def _deepspeed_hostfile(script: Script) -> Iterable[Finding]:
    job = launches_of(script)
    if not job.nodes or job.nodes < 2:
        return
    for launch in job.launches:
        if launch.kind != "deepspeed" or _has_flag(launch.args, "--hostfile", "-H"):
            continue
        what = ("under srun each node starts its own single-node DeepSpeed job" if launch.under_srun
                else "it looks for /job/hostfile, finds none and trains on the first node's GPUs only")
        yield Finding(
            "deepspeed-without-hostfile", ERROR,
            f"the deepspeed launcher on --nodes={job.nodes} without --hostfile: {what}.",
            "write a hostfile from the allocation (scontrol show hostnames \"$SLURM_JOB_NODELIST\" | "
            "sed 's/$/ slots=<GPUs per node>/' > hostfile) and pass --hostfile hostfile, or start one "
            "torchrun per node with srun instead.", launch.line)


def _pinned_devices(script: Script) -> Iterable[Finding]:
    """A hand-set CUDA_VISIBLE_DEVICES for the whole job (export, or a line of its own) or for a launcher.
    `CUDA_VISIBLE_DEVICES=1 python eval.py &`, one process per GPU, is left alone."""
    job = launches_of(script)
    gpus = job.gpus_per_node or job.gpus_total or 0
    if gpus < 2 and (job.nodes or 1) < 2:
        return
    shares = _device_shares(script, gpus)
    for start, text in _logical_lines(script.code, 1):
        match = re.search(r"(?<![\w$])(export\s+)?CUDA_VISIBLE_DEVICES=[\"']?(\d+(?:,\d+)*)[\"']?(\s*$|\s*;|\s+\S)", text)
        if not match or start in shares:
            continue
        whole_job = match.group(1) or not match.group(3).strip() or match.group(3).strip() == ";"
        if not whole_job and not _LAUNCHER.search(text[match.end() - 1:]):
            continue
        devices = [int(index) for index in match.group(2).split(",")]
        every_gpu = gpus > 0 and sorted(devices) == list(range(gpus))
        yield Finding(
            "cuda-visible-devices-pinned", WARNING if every_gpu else ERROR,
            f"CUDA_VISIBLE_DEVICES={match.group(2)} set by hand in a job with {gpus} GPUs per node: "
            + ("it names every GPU only where SLURM numbers a job's GPUs from 0 (nodes that confine jobs to their "
               "GPUs); elsewhere it points at another job's GPUs." if every_gpu else
               f"it hides {gpus - len(devices)} of the job's GPUs (they sit idle)" if len(devices) < gpus else
               "it names GPUs the job was not given (another job's, or none)")
            + ("" if every_gpu else ", and SLURM had already set it to the GPUs it gave this job."),
            "delete it: SLURM sets CUDA_VISIBLE_DEVICES to the job's GPUs on every node.",
            start + text.count("\n", 0, match.start()))


def _device_shares(script: Script, gpus: int) -> set[int]:
    """Lines of launches run side by side (`CUDA_VISIBLE_DEVICES=0,1 torchrun ... &`) whose device lists split
    the node's GPUs between them, each GPU once: a deliberate split, not a pinning mistake."""
    shares: dict[int, list[int]] = {}
    for launch in launches_of(script).launches:
        if launch.kind == "nemo" or not _in_background(launch):
            continue
        line = script.lines[launch.line - 1]
        prefix = _DEVICES_PREFIX.search(_segment_before(line, max(line.find(launch.args.split()[0]), 0)))
        if prefix:
            shares[launch.line] = [int(index) for index in prefix.group(1).split(",")]
    devices = sorted(index for listed in shares.values() for index in listed)
    return set(shares) if len(shares) > 1 and devices == list(range(gpus)) else set()


RULES = [_launch_placement, _gpus_and_workers, _launcher_nodes, _rendezvous, _ranks_expanded_early, _deepspeed_hostfile,
         _pinned_devices]
