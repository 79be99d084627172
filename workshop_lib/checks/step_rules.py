"""Linter rules on job steps and job arrays, from srun's and sbatch's own semantics (srun(1), sbatch(1),
slurm-wlm 22.05): what `--export` leaves a step, steps started in the background, steps that cannot run side by
side, and array tasks that share a log, a port or a folder.

Each rule's docstring names the section of the man page it rests on; tests/checks/test_lint_on_cluster.py shows each
on the local SLURM cluster. ``RULES`` lists them in the order they run."""

from __future__ import annotations

import re
import shlex
from typing import Iterable

from workshop_lib.checks.findings import ERROR, Finding
from workshop_lib.checks.launches import launches_of
from workshop_lib.checks.script import Script, command_words
from workshop_lib.checks.steps import batch_code, exported, logical_lines, steps_of


# ---------------------------------------------------------------------------------------------
# srun --export
# ---------------------------------------------------------------------------------------------
def _export_drops_environment(script: Script) -> Iterable[Finding]:
    """srun(1) 22.05, --export: `NONE` defines none of the user's environment ("User must use absolute path to
    the binary"); a list without `ALL` propagates "only ... EDITOR ..., SLURM_* environment variables and ARG1"
    (no PATH: `srun --export=MASTER_PORT=1 bash` fails with 'execve(): bash: No such file or directory').
    sbatch(1) --export=NONE also sets SLURM_EXPORT_ENV=NONE, which every srun of the job inherits."""
    job_export = (script.header.get("export") or "").upper()
    job_none = job_export == "NONE" and (exported(script, "SLURM_EXPORT_ENV") or "").upper() != "ALL"
    for step in steps_of(script):
        value = step.options.get("export")
        if value is None and not job_none:
            continue
        words = [word.split("=")[0] for word in (value or "NONE").split(",")]
        if "ALL" in (word.upper() for word in words):
            continue
        needs_path = step.program and not step.program.startswith("/")
        lost_exports = [name for name in _exports_before(script, step.line) if name not in words]
        if not needs_path and not lost_exports:
            continue  # an absolute program that needs nothing the script exported
        said = f"srun --export={value}" if value is not None else "#SBATCH --export=NONE (inherited by this srun)"
        lost = ("the script's own exports and the user's PATH" if "NONE" in (w.upper() for w in words)
                else f"every variable but {', '.join(words)} and SLURM_* (PATH, the conda/module environment, "
                     "MASTER_ADDR ...)")
        yield Finding(
            "srun-export-drops-environment", ERROR,
            f"{said}: the step starts without {lost}, so "
            + (f"`{step.program}` is not found ('execve(): {step.program}: No such file or directory')."
               if needs_path else "what the script exported before srun is not there."),
            "keep the environment and add to it: srun --export=ALL,NAME=value ... (or leave --export out)"
            + (", and drop #SBATCH --export=NONE (or export SLURM_EXPORT_ENV=ALL before srun)." if value is None
               else "."),
            step.line if value is not None else script.header.line("export"))
        if value is None:
            return  # one finding for the job-wide setting


def _exports_before(script: Script, line: int) -> list[str]:
    """The variables the batch shell exports before ``line``."""
    names = []
    for number, text in enumerate(script.code.split("\n")[:line - 1], start=1):
        names += re.findall(r"^\s*export\s+([A-Za-z_]\w*)", text)
    return names


def _step_exceeds_job(script: Script) -> Iterable[Finding]:
    """srun(1) 22.05, -N/--nodes (a step is created inside the job's allocation, which it cannot outgrow): a step
    that asks for more nodes than the job holds is not started ('srun: error: Only allocated 1 nodes asked for 2'
    on the local cluster), typically an srun line kept from a two-node script."""
    job_nodes = _nodes(script)
    if not job_nodes:
        return
    for step in steps_of(script):
        asked = script.number((step.options.get("nodes") or "").split("-")[0] or None)
        if asked and asked > job_nodes:
            yield Finding(
                "step-exceeds-job", ERROR,
                f"srun --nodes={step.options['nodes']} in a job of {job_nodes} node{'s' if job_nodes > 1 else ''}: "
                f"srun refuses the step ('Only allocated {job_nodes} nodes asked for {asked}').",
                f"ask the job for {asked} nodes (#SBATCH --nodes={asked}), or drop --nodes from srun (it takes the "
                "job's).", step.line)
            return


# ---------------------------------------------------------------------------------------------
# Background steps
# ---------------------------------------------------------------------------------------------
_LONG_RUNNING = re.compile(r"(?<![\w./-])(?:srun|torchrun|accelerate|deepspeed|python[\d.]*|singularity|apptainer|"
                           r"nemo|bash\s+\S+\.sh)\b")


def _background_not_waited(script: Script) -> Iterable[Finding]:
    """sbatch(1) 22.05, DESCRIPTION (the batch script is the job: when it exits, the job ends) and srun(1) (a step
    belongs to the job): a step started with `&` and never waited for is killed when the script reaches its end,
    moments after it started ('Unable to create step for job: Job/step already completing or completed')."""
    code = batch_code(script)
    commands = list(logical_lines(code))
    waits = [number for number, word in command_words(code) if word == "wait"]
    for index, (number, text) in enumerate(commands):
        if not re.search(r"(?<![&>|])&\s*(?:#.*)?$", text.rstrip()) or not _LONG_RUNNING.search(text):
            continue
        if any(line > number for line in waits) or re.search(r"\bwait\b", text):
            continue
        later = [t for n, t in commands[index + 1:] if t.strip()]
        if any(_LONG_RUNNING.search(t) and not re.search(r"(?<![&>|])&\s*$", t.rstrip()) for t in later):
            continue  # a foreground command keeps the job alive (a monitor next to the training)
        yield Finding(
            "background-step-not-waited", ERROR,
            "this command runs in the background (`&`) and nothing waits for it: the batch script reaches its end "
            "at once, the job ends, and SLURM kills the step (the training never runs).",
            "add `wait` after the last background command (or drop the `&`).", number)
        return


def _parallel_steps_serialize(script: Script) -> Iterable[Finding]:
    """srun(1) 22.05, --exact ("By default, all non-GRES resources on each node in the step allocation will be
    used ... Parallel steps will either be blocked or rejected until requested step resources are available unless
    --overlap is specified"): on one node, a second background step without --exact (or -c, which implies it)
    waits for the first to end ('step creation temporarily disabled'), so steps meant to share the node's GPUs run
    one after the other."""
    if _nodes(script) != 1 or exported(script, "SLURM_EXACT") or exported(script, "SLURM_OVERLAP") \
            or exported(script, "SRUN_CPUS_PER_TASK"):
        return
    steps = steps_of(script)
    loose = next((step for step in steps if step.background
                  and not step.has("exact", "overlap", "cpus-per-task", "nodelist")), None)
    if loose is None:
        return
    others = [step for step in steps if step.line > loose.line or (step is loose and step.in_loop)]
    if not others:
        return
    waiting = others[0]
    if waiting.background or waiting is loose:
        what = ("srun steps in the background on one node without --exact: a step takes all the job's CPUs on the "
                "node, so the next waits until it ends ('step creation temporarily disabled') and they run one after "
                "the other.")
    else:
        what = (f"this step runs in the background without --exact and takes all the job's CPUs on the node, so the "
                f"step on line {waiting.line} waits until it ends ('step creation temporarily disabled'); a monitor "
                "that runs as long as the job makes the job hang until its time limit.")
    yield Finding(
        "parallel-steps-serialize", ERROR, what[0].upper() + what[1:],
        "give each step only what it needs: srun --exact --ntasks=1 --cpus-per-task=N --gres=gpu:K ... & "
        "(--exact, or -c, which implies it); a monitor that needs no GPU: srun --overlap ... &.", loose.line)


def _nodes(script: Script) -> int | None:
    """The job's node count: --nodes, else what --ntasks over --ntasks-per-node implies, else 1."""
    header = script.header
    if header.get("nodes"):
        return script.number(header.get("nodes").split("-")[-1])
    tasks, per_node = script.number(header.get("ntasks")), script.number(header.get("ntasks-per-node"))
    return -(-tasks // per_node) if tasks and per_node else 1


_LOCAL_INDEX = re.compile(r"(LOCAL_RANK=|CUDA_VISIBLE_DEVICES=|--local[_-]rank[= ]|cuda:)[\"']?\$\{?SLURM_LOCALID\b")


def _bound_gpu_by_local_rank(script: Script) -> Iterable[Finding]:
    """srun(1) 22.05, --gpus-per-task ("will implicitly set --gpu-bind=per_task:<gpus_per_task>") and --gpu-bind
    per_task / single ("Each task will be bound to the number of gpus specified"): a bound task sees only its own
    GPU (CUDA_VISIBLE_DEVICES holds one index, seen on the local cluster), so a device chosen by SLURM_LOCALID
    (LOCAL_RANK, cuda:N, CUDA_VISIBLE_DEVICES=N) does not exist for every task but the first on each node
    ('CUDA error: invalid device ordinal')."""
    job = launches_of(script)
    job_per_task = script.header.get("gpus-per-task")
    for step in steps_of(script):
        bind = step.options.get("gpu-bind", "")
        bound = (step.has("gpus-per-task") or bind.split(":")[0].replace("verbose,", "") in ("per_task", "single")
                 or (job_per_task is not None and bind != "none" and not step.has("gres", "gpus", "gpus-per-node")))
        match = _LOCAL_INDEX.search(" ".join(step.words))
        if not bound or not match:
            continue
        options = " ".join(f"--{name}={value}" for name, value in step.options.items() if value)
        per_node = job.tasks_per_node(options) if options else job.tasks_per_node()
        if not per_node or per_node < 2:
            continue
        yield Finding(
            "local-rank-vs-bound-gpu", ERROR,
            f"each of the {per_node} tasks per node is bound to its own GPU (--gpus-per-task / --gpu-bind), so it sees "
            f"one GPU, numbered 0; {match.group(1)}$SLURM_LOCALID asks for GPU 1, 2 ... in the other tasks, which "
            "they do not have (CUDA error: invalid device ordinal).",
            "either keep the binding and use device 0 in every task (LOCAL_RANK=0), or drop --gpus-per-task "
            "(ask --gpus-per-node) so every task sees all the node's GPUs and picks its own by SLURM_LOCALID.",
            step.line)
        return


# ---------------------------------------------------------------------------------------------
# Job arrays: every task is a job of its own, started at once, often on the same node
# ---------------------------------------------------------------------------------------------
def _array_shared_output(script: Script) -> Iterable[Finding]:
    """sbatch(1) 22.05, --array and filename pattern (%A: the array's job id, the same for every task; %a: the
    task's index; default "slurm-%A_%a.out"): an --output without %a (or %j) names one file for all tasks; each
    task truncates it when it starts (on the local cluster, of two tasks run one after the other only the second's
    log is left) and tasks that run at once interleave their lines."""
    header = script.header
    if header.get("array") is None:
        return
    for option in ("output", "error"):
        value = header.get(option)
        if not value or re.search(r"%[0-9]*[aj]", value) or "$" in value:
            continue
        append = (header.get("open-mode") or "").lower() == "append"
        yield Finding(
            "array-shared-output", ERROR,
            f"--{option}={value} in a job array: every task writes the same file"
            + (", their lines interleaved." if append else
               "; each task truncates it when it starts (the logs of the tasks before it are lost), and tasks that "
               "run at once interleave their lines."),
            f"put the task's index in the name: --{option}={_with_index(value)} (%A array id, %a task index).",
            header.line(option))


def _with_index(value: str) -> str:
    stem, dot, suffix = value.rpartition(".")
    return f"{stem}-%a.{suffix}" if dot and "/" not in suffix else f"{value}-%a"


_PORT = re.compile(r"(?<![\w-])(?:MASTER_PORT|--master[_-]port|--main[_-]process[_-]port|--rdzv[_-]endpoint)(?:=|\s+)"
                   r"[\"']?(?:[\w.${}-]+:)?(\d{4,5})\b")


def _array_shared_port(script: Script) -> Iterable[Finding]:
    """sbatch(1) 22.05, --array (tasks are separate jobs that run at the same time, placed wherever they fit) and
    OUTPUT ENVIRONMENT VARIABLES (SLURM_ARRAY_JOB_ID is the same for every task): a fixed rendezvous port, or one
    derived from SLURM_ARRAY_JOB_ID, is the same for tasks that share a node, and the second fails to bind it
    ('address already in use')."""
    if script.header.get("array") is None:
        return
    code = batch_code(script)
    for number, text in logical_lines(code):
        fixed = _PORT.search(text)
        derived = re.search(r"PORT\w*=[^\n]*SLURM_ARRAY_JOB_ID", text) and "SLURM_ARRAY_TASK_ID" not in text
        if not fixed and not derived:
            continue
        said = (f"the fixed port {fixed.group(1)}" if fixed
                else "a port derived from SLURM_ARRAY_JOB_ID (the same for every task)")
        yield Finding(
            "array-shared-port", ERROR,
            f"{said} in a job array: tasks that run on the same node rendezvous on the same port, and all but the "
            "first fail with 'address already in use'.",
            "derive the port from the task's own job id: MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000)) (each array "
            "task has its own SLURM_JOB_ID).", number)
        return


_OUTPUT_FOLDER = re.compile(r"(?<![\w-])(--output[_-]dir|--save[_-]dir|--checkpoint[_-]dir|--ckpt[_-]dir|"
                            r"exp_manager\.exp_dir|log\.log_dir|--log[_-]dir)(?:=|\s+)(\"[^\"]*\"|'[^']*'|[^\s;&|]+)")


def _array_shared_folder(script: Script) -> Iterable[Finding]:
    """sbatch(1) 22.05, --array (the tasks run the same script at the same time): an output folder written without
    anything that differs between tasks (SLURM_ARRAY_TASK_ID, SLURM_JOB_ID, or a variable set from them) is shared,
    so the tasks overwrite each other's checkpoints and results."""
    if script.header.get("array") is None:
        return
    code = batch_code(script)
    per_task = _per_task_variables(code)
    for number, text in logical_lines(code):
        for match in _OUTPUT_FOLDER.finditer(text):
            value = match.group(2).strip("\"'")
            names = set(re.findall(r"\$\{?([A-Za-z_]\w*)", value))
            if names & per_task:
                continue
            yield Finding(
                "array-shared-folder", ERROR,
                f"{match.group(1)} {value} in a job array: every task writes the same folder at the same time, so "
                "they overwrite each other's checkpoints and results.",
                f"make it per task: {match.group(1)} {value.rstrip('/')}/task-$SLURM_ARRAY_TASK_ID.", number)
            return


def _per_task_variables(code: str) -> set[str]:
    """Variables whose value differs between array tasks: SLURM's and any assigned from them (transitively)."""
    per_task = {"SLURM_ARRAY_TASK_ID", "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_TASK_ID"}
    assignments = re.findall(r"^\s*(?:export\s+|local\s+|readonly\s+)?([A-Za-z_]\w*)=(.*)$", code, re.MULTILINE)
    assignments += [(name, value) for name, value in re.findall(r"\bread\b[^<\n]*?([A-Za-z_]\w*)\s*<<<\s*(.*)", code)]
    changed = True
    while changed:
        changed = False
        for name, value in assignments:
            if name not in per_task and set(re.findall(r"\$\{?([A-Za-z_]\w*)", value)) & per_task:
                per_task.add(name)
                changed = True
    return per_task


def array_indices(spec: str) -> list[int] | None:
    """The task indices of an --array value (`0-3`, `1,3,5`, `0-15:4`, `1-8%2`); None when not literal."""
    indices: list[int] = []
    for part in spec.split("%")[0].split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+)(?::(\d+))?)?", part.strip())
        if not match:
            return None
        first, last, step = int(match.group(1)), int(match.group(2) or match.group(1)), int(match.group(3) or 1)
        indices += list(range(first, last + 1, step))
    return indices or None


_BASH_ARRAY = re.compile(r"^\s*(?:declare\s+-a\s+)?([A-Za-z_]\w*)=\(([^)]*)\)", re.MULTILINE)
_INDEXED = re.compile(r"\$\{([A-Za-z_]\w*)\[\$?\{?SLURM_ARRAY_TASK_ID\}?\]\}")
_SED_LINE = re.compile(r"\bsed\s+-n\s+[\"']?\$\{?SLURM_ARRAY_TASK_ID\}?p")


def _array_index_out_of_range(script: Script) -> Iterable[Finding]:
    """sbatch(1) 22.05, --array (SLURM_ARRAY_TASK_ID takes each index of the range as written, `1-4` is 1, 2, 3,
    4) and bash (arrays count from 0; `sed -n 0p` is 'invalid usage of line address 0'): an index the list does
    not have gives that task an empty value, and it trains with the wrong settings or fails (seen on the local
    cluster)."""
    spec = script.header.get("array")
    indices = array_indices(spec) if spec else None
    if not indices:
        return
    code = batch_code(script)
    lists = {name: len(shlex_words(body)) for name, body in _BASH_ARRAY.findall(code)}
    for number, line in enumerate(code.split("\n"), start=1):
        for match in _INDEXED.finditer(line):
            size = lists.get(match.group(1))
            if size is None or all(0 <= index < size for index in indices):
                continue
            yield Finding(
                "array-index-out-of-range", ERROR,
                f"--array={spec} indexes {match.group(1)}, which holds {size} values (indices 0 to {size - 1}): task "
                f"{max(indices) if max(indices) >= size else min(indices)} reads an empty value.",
                f"number the tasks as the list: --array=0-{size - 1}.", number)
            return
        if _SED_LINE.search(line) and 0 in indices:
            yield Finding(
                "array-index-out-of-range", ERROR,
                f"--array={spec} starts at 0, and `sed -n \"${{SLURM_ARRAY_TASK_ID}}p\"` numbers lines from 1: task 0 "
                "stops with 'invalid usage of line address 0' and gets no parameters.",
                f"start the array at 1 (--array=1-{max(indices) + 1}), or read line $((SLURM_ARRAY_TASK_ID + 1)).",
                number)
            return


def shlex_words(text: str) -> list[str]:
    try:
        return shlex.split(text, comments=True)
    except ValueError:
        return text.split()


RULES = [_export_drops_environment, _step_exceeds_job, _background_not_waited, _parallel_steps_serialize,
         _bound_gpu_by_local_rank, _array_shared_output, _array_shared_port, _array_shared_folder,
         _array_index_out_of_range]
