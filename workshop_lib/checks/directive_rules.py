"""Linter rules from sbatch's own semantics (sbatch(1), slurm-wlm 22.05, Debian's package): the `#!` line, words
of a directive that are no option, options that exclude each other, need another, contradict each other or are
given twice, a GPU type that contradicts the node features asked for, `$` in an #SBATCH line (sbatch expands no
variables), lines that look like directives but are comments, and the output environment variables a script reads
that its request form never sets (or reads as a count when they hold a list).

Each rule's docstring names the section of the man page it rests on; tests/checks/test_lint_on_cluster.py shows each
on the local SLURM cluster (sbatch --test-only, or a tiny job). ``RULES`` lists them in the order they run."""

from __future__ import annotations

import re
from typing import Iterable

from workshop_lib.checks.findings import ERROR, WARNING, Finding
from workshop_lib.checks.launches import launches_of
from workshop_lib.checks.script import Script
from workshop_lib.checks.steps import step_options

# ---------------------------------------------------------------------------------------------
# Options that exclude each other
# ---------------------------------------------------------------------------------------------
# (options, what sbatch 22.05 answers), from the option's entry in sbatch(1) and seen with --test-only.
_EXCLUSIVE = [
    (("mem", "mem-per-cpu", "mem-per-gpu"), "sbatch: fatal: --mem, --mem-per-cpu, and --mem-per-gpu are mutually "
                                            "exclusive."),
    (("cpus-per-gpu", "cpus-per-task"), "sbatch: error: --cpus-per-gpu is mutually exclusive with --cpus-per-task"),
    (("gpus-per-task", "ntasks-per-gpu"), "sbatch: fatal: --gpus-per-task is mutually exclusive with "
                                          "--ntasks-per-gpu"),
]


def _exclusive_options(script: Script) -> Iterable[Finding]:
    """sbatch(1) 22.05, OPTIONS --mem / --mem-per-cpu / --mem-per-gpu ("mutually exclusive"), --cpus-per-gpu
    ("Not compatible with the --cpus-per-task option") and --ntasks-per-gpu ("not compatible with
    --gpus-per-task"): sbatch refuses the job at submission (the answers below are sbatch 22.05's)."""
    given = {directive.option for directive in script.header.directives}
    for options, answer in _EXCLUSIVE:
        both = [option for option in options if option in given]
        if len(both) < 2:
            continue
        shown = " and ".join(f"--{option}={script.header.get(option)}" for option in both)
        yield Finding(
            "exclusive-options", ERROR,
            f"{shown}: sbatch accepts only one of them and refuses the job ({answer}).",
            f"keep one: {' or '.join('--' + option for option in both)}.",
            max(script.header.line(option) or 0 for option in both) or None)


def _gpus_per_task_without_tasks(script: Script) -> Iterable[Finding]:
    """sbatch(1) 22.05, --gpus-per-task ("requires an explicit task count, e.g. -n, --ntasks or ...
    --gpus=X --gpus-per-task=Y"): without --ntasks, --ntasks-per-node, --nodes or --gpus sbatch refuses the job."""
    header = script.header
    if header.get("gpus-per-task") is None or any(header.get(option) for option in (
            "ntasks", "ntasks-per-node", "nodes", "gpus")):
        return
    yield Finding(
        "gpus-per-task-without-tasks", ERROR,
        f"--gpus-per-task={header.get('gpus-per-task')} with no task count: sbatch refuses the job ('--gpus-per-task "
        "used without either --gpus or -n/--ntasks is not allowed').",
        "say how many tasks: --ntasks=N (or --ntasks-per-node=N), or ask per node: --gpus-per-node=N.",
        header.line("gpus-per-task"))


# ---------------------------------------------------------------------------------------------
# The script's first line, words of a directive, counts that contradict each other, options given twice
# ---------------------------------------------------------------------------------------------
def _missing_shebang(script: Script) -> Iterable[Finding]:
    """sbatch 22.05 refuses a script whose first line is not `#!interpreter` ('This does not look like a batch
    script. The first line must start with #! followed by the path to an interpreter'), a blank line first too."""
    first = script.lines[0] if script.lines else ""
    if first.startswith("#!"):
        return
    yield Finding(
        "missing-shebang", ERROR,
        "the first line is not `#!/bin/bash`" + (" (it is blank)" if not first.strip() else "")
        + ": sbatch refuses the script ('This does not look like a batch script').",
        "make `#!/bin/bash` the very first line (nothing, not even a blank line, above it).", 1)


def _invalid_directive_word(script: Script) -> Iterable[Finding]:
    """sbatch(1) 22.05: an #SBATCH line holds options only; a word that is neither an option nor its value (an
    unquoted space inside a value: `--job-name=my run`) makes sbatch refuse the script ('Invalid directive found
    in batch script: run')."""
    for number, word in script.header.stray_words:
        yield Finding(
            "invalid-directive", ERROR,
            f"`{word}` on this #SBATCH line is neither an option nor an option's value: sbatch refuses the script "
            f"('Invalid directive found in batch script: {word}').",
            "quote a value with spaces (--job-name=\"my run\") or join it (--job-name=my-run).", number)


def _counts_contradict(script: Script) -> Iterable[Finding]:
    """sbatch(1) 22.05, --ntasks-per-node (with --ntasks, the task count is a maximum per node) and --gpus
    (the job's total, with --gpus-per-node on each node): a total that the per-node count times --nodes cannot
    give is refused ('Requested node configuration is not available'; 'required nodes (2) doesn't fall between
    min_nodes (1) and max_nodes (1)')."""
    header, number = script.header, script.number
    nodes = number(header.get("nodes")) if header.get("nodes") else None  # a range (2-4): nothing certain
    if not nodes:
        return
    pairs = [("ntasks", "ntasks-per-node", lambda total, per_node: total > per_node * nodes),
             ("gpus", "gpus-per-node", lambda total, per_node: total != per_node * nodes)]
    for total_option, per_node_option, contradicts in pairs:
        total = _trailing_number(header.get(total_option))
        per_node = _trailing_number(header.get(per_node_option))
        if total is None or per_node is None or not contradicts(total, per_node):
            continue
        yield Finding(
            "counts-contradict", ERROR,
            f"--{total_option}={header.get(total_option)} with --{per_node_option}={header.get(per_node_option)} on "
            f"--nodes={header.get('nodes')}: {per_node} per node x {nodes} nodes cannot give {total}, so SLURM refuses "
            "the job.",
            f"keep the per-node form (--{per_node_option}) and drop --{total_option}, or make {total_option} = "
            f"{per_node_option} x nodes.", header.line(total_option))


def _ntasks_caps_tasks_per_node(script: Script) -> Iterable[Finding]:
    """sbatch(1) 22.05, --ntasks-per-node ("If used with the --ntasks option, the --ntasks option will take
    precedence and the --ntasks-per-node will be treated as a maximum count of tasks per node"): fewer tasks in all
    than per node x nodes leaves task slots, and the GPUs meant for them, unused (NumTasks=2 for --ntasks=2
    --ntasks-per-node=4 --nodes=2 on the local cluster)."""
    header, number = script.header, script.number
    nodes = number(header.get("nodes") or "1")  # a range (2-4): nothing certain
    total, per_node = number(header.get("ntasks")), number(header.get("ntasks-per-node"))
    if not nodes or not total or not per_node or total >= per_node * nodes:
        return
    yield Finding(
        "ntasks-caps-tasks-per-node", WARNING,
        f"--ntasks={total} with --ntasks-per-node={per_node} on {nodes} node{'s' if nodes > 1 else ''}: --ntasks wins, "
        f"so the job has {total} tasks, not {per_node * nodes} (--ntasks-per-node is only a maximum).",
        f"drop --ntasks (the per-node count x --nodes gives {per_node * nodes}), or make it {per_node * nodes}.",
        header.line("ntasks"))


def _trailing_number(value: str | None) -> int | None:
    match = re.search(r"(\d+)$", (value or "").split(",")[0])
    return int(match.group(1)) if value and match else None


def _option_given_twice(script: Script) -> Iterable[Finding]:
    """sbatch(1) 22.05: an option given twice takes its last value (a script's line cannot tell which one its
    author meant: a line added at the bottom silently replaces the request above)."""
    seen: dict[str, tuple[str, int | None]] = {}
    for directive in script.header.directives:
        earlier = seen.get(directive.option)
        if earlier is not None and earlier[0] != directive.value:
            yield Finding(
                "option-given-twice", WARNING,
                f"--{directive.option} is given twice ({earlier[0]} on line {earlier[1]}, {directive.value} here): "
                f"sbatch uses the last, {directive.value}.",
                f"keep one --{directive.option} line.", directive.line)
        seen[directive.option] = (directive.value, directive.line)


# ---------------------------------------------------------------------------------------------
# GPU type and node features
# ---------------------------------------------------------------------------------------------
GPU_TYPES = ("a100", "v100", "p100", "h100", "h200", "a6000", "rtx2080ti", "gtx1080ti", "t4", "l40", "l40s", "a40",
             "p6000", "rtx6000", "mi250", "mi300")


def _gpu_type_contradicts_constraint(script: Script) -> Iterable[Finding]:
    """sbatch(1) 22.05, --constraint (all features joined by `&` must hold on each node; `|` is either) and
    --gres (`gpu:<type>:<count>` names the GPU model): a typed request whose type the constraint excludes asks
    for nodes that do not exist, and SLURM refuses the job ('Requested node configuration is not available' or
    'Invalid feature specification')."""
    typed, constraint = script.header.gpu_type, (script.header.get("constraint") or "").lower()
    if not typed or not constraint or "|" in constraint or "[" in constraint:
        return  # either-or expressions may include the type: nothing certain to say
    features = {feature.strip("() ") for feature in re.split(r"[&,]", constraint)}
    other = sorted(features & set(GPU_TYPES) - {typed})
    if not other:
        return
    yield Finding(
        "gpu-type-contradicts-constraint", ERROR,
        f"the GPUs are typed {typed} but --constraint={script.header.get('constraint')} asks for {other[0]} nodes: no "
        "node has both, so SLURM refuses the job (or it pends forever).",
        f"name one GPU model: --constraint={typed} with --gres=gpu:{typed}:N, or drop the type from the GPU request.",
        script.header.line("constraint"))


# ---------------------------------------------------------------------------------------------
# #SBATCH lines: no variables, and only `#SBATCH` at the start of a line
# ---------------------------------------------------------------------------------------------
_PATH_OPTIONS = ("output", "error", "chdir", "input")
_NUMBER_OPTIONS = ("nodes", "ntasks", "ntasks-per-node", "cpus-per-task", "gpus", "gpus-per-node", "gpus-per-task",
                   "gres", "mem", "mem-per-cpu", "mem-per-gpu", "time", "array", "cpus-per-gpu")
_VARIABLE = re.compile(r"\$\{?[A-Za-z_]\w*\}?|\$\(")


def _variable_in_directive(script: Script) -> Iterable[Finding]:
    """sbatch(1) 22.05, DESCRIPTION (options "preceded with #SBATCH before any executable commands" are read by
    sbatch, not by the shell) and "filename pattern" (only replacement symbols, "%" followed by a letter, are
    replaced): no `$VAR` (and no `~`) is expanded, so the value is taken literally (seen on the local cluster). A
    path becomes a folder named `$HOME` that does not exist (the job fails at launch without a log); a number is
    refused ('"$NODES" is not a valid node count')."""
    for directive in script.header.directives:
        option, value = directive.option, directive.value
        tilde = option in _PATH_OPTIONS and value.startswith("~")
        if not _VARIABLE.search(value) and not tilde:
            continue
        if option in _PATH_OPTIONS:
            literal = "~" if tilde else _VARIABLE.search(value).group(0)
            effect = (f"SLURM opens the literal path {value!r} (a folder named {literal!r} that does not exist), so "
                      "the job fails at launch, without a log")
            severity, fix = ERROR, (f"write the path out, or use sbatch's own patterns (%u user, %x job name, %j job "
                                    f"id): e.g. --{option}=/path/to/logs/%x-%j.out; or pass it on the command line "
                                    f"(sbatch --{option}=\"$HOME/...\" job.sbatch), where the shell expands it.")
        elif option in _NUMBER_OPTIONS:
            effect = f"sbatch refuses the job ('\"{value}\" is not a valid' value)"
            severity, fix = ERROR, (f"write the number in the script, or pass it when submitting: sbatch "
                                    f"--{option}=\"$VALUE\" job.sbatch (the shell expands it there).")
        else:
            effect = f"the job gets the literal text {value!r}"
            severity, fix = WARNING, f"write the value out, or pass it when submitting: sbatch --{option}=\"...\"."
        yield Finding(
            "variable-in-directive", severity,
            f"--{option}={value} in an #SBATCH line: sbatch does not expand shell variables (nor `~`) there, so "
            f"{effect}.",
            fix, directive.line)


def _directive_look_alike(script: Script) -> Iterable[Finding]:
    """sbatch(1) 22.05, DESCRIPTION: options are lines "preceded with #SBATCH"; sbatch compares the start of the
    line with `#SBATCH` exactly, so `  #SBATCH` (indented), `# SBATCH` or `#sbatch` is a comment and its request
    is silently dropped (an indented `#SBATCH --comment=x` sets no comment on slurm 22.05)."""
    for number in script.header.look_alike_lines:
        line = script.lines[number - 1]
        spaced = line.startswith("# ")
        yield Finding(
            "directive-look-alike", WARNING if spaced else ERROR,
            f"`{line.strip()[:60]}` is a comment to sbatch (only a line starting with exactly `#SBATCH` is a "
            "directive), so this request is silently dropped"
            + (" (if that is meant, `##SBATCH` says so more clearly)." if spaced else "."),
            "write it as `#SBATCH --option=value` at the very start of the line.", number)


# ---------------------------------------------------------------------------------------------
# Output environment variables: which request form sets which
# ---------------------------------------------------------------------------------------------
# sbatch(1) 22.05, OUTPUT ENVIRONMENT VARIABLES: each is set only when its option is given (checked on
# the local cluster for every GPU request form).
SET_ONLY_BY = {
    "SLURM_GPUS_PER_NODE": ("gpus-per-node",),
    "SLURM_GPUS": ("gpus",),
    "SLURM_GPUS_PER_TASK": ("gpus-per-task",),
    "SLURM_CPUS_PER_TASK": ("cpus-per-task",),
    "SLURM_CPUS_PER_GPU": ("cpus-per-gpu",),
    "SLURM_NTASKS_PER_NODE": ("ntasks-per-node",),
    "SLURM_NTASKS": ("ntasks", "ntasks-per-node"),
    "SLURM_NPROCS": ("ntasks", "ntasks-per-node"),
    "SLURM_MEM_PER_GPU": ("mem-per-gpu",),
    "SLURM_MEM_PER_CPU": ("mem-per-cpu",),
    "SLURM_MEM_PER_NODE": ("mem",),
    "SLURM_ARRAY_TASK_ID": ("array",),
    "SLURM_ARRAY_JOB_ID": ("array",),
    "SLURM_ARRAY_TASK_COUNT": ("array",),
    "SLURM_ARRAY_TASK_MIN": ("array",),
    "SLURM_ARRAY_TASK_MAX": ("array",),
}
_READ = re.compile(r"\$\{?(" + "|".join(SET_ONLY_BY) + r")\b(\}|:?[-=?+][^}]*\})?")


def _unset_slurm_variable(script: Script) -> Iterable[Finding]:
    """sbatch(1) 22.05, OUTPUT ENVIRONMENT VARIABLES (e.g. SLURM_GPUS_PER_NODE "Requested GPU count per allocated
    node. Only set if the --gpus-per-node option is specified"): a script that reads a variable its request form
    does not set gets an empty string, so `--nproc_per_node=$SLURM_GPUS_PER_NODE` under `--gres=gpu:4` is
    `--nproc_per_node=` and the launcher stops (inside `$(( ))` it reads as 0)."""
    given = {directive.option for directive in script.header.directives}
    reported = set()
    in_steps = _lines_run_by_srun(script)
    for number, line in enumerate(script.code.split("\n"), start=1):
        if number in script.other_job_lines or re.match(r"\s*(?:echo|printf)\b", line):
            continue
        for match in [*_READ.finditer(line), *_arithmetic_reads(line)]:
            name, modifier = match.group(1), match.group(2) or ""
            if modifier[:2].lstrip(":")[:1] in ("-", "=", "?", "+") or name in reported:
                continue  # ${VAR:-default} says what happens when it is unset
            if given & set(SET_ONLY_BY[name]) or re.search(rf"(?<![\w$]){name}=", script.code):
                continue
            if number in in_steps and (name in _SET_IN_EVERY_STEP or in_steps[number] & set(SET_ONLY_BY[name])):
                continue  # srun sets it for the step: its task count, or the option the srun line gives
            if re.search(rf"-[zn]\s+\"?\$\{{?{name}\b", script.code):
                continue  # the script tests whether it is set
            reported.add(name)
            options = " or ".join(f"--{option}" for option in SET_ONLY_BY[name])
            # an array is often asked for when submitting (sbatch --array=0-3 job.sbatch): said, not refused
            yield Finding(
                "slurm-variable-unset", WARNING if name.startswith("SLURM_ARRAY") else ERROR,
                f"${name} is set only when the job asks with {options}, which this script does not: it expands "
                "to an empty string here"
                + (f" (the GPUs are asked with --{_gpu_form(script)})" if "GPU" in name and _gpu_form(script) else "")
                + ", and the command that reads it gets no value.",
                _unset_fix(name, script), number)


# srun sets these for every step (a step has a task count even when the job asked for none).
_SET_IN_EVERY_STEP = {"SLURM_NTASKS", "SLURM_NPROCS"}


def _lines_run_by_srun(script: Script) -> dict[int, set[str]]:
    """Lines of code that a task of an srun step runs (`srun bash -c '...'`, a heredoc srun runs), each with the
    options of that srun (which set their variables for the step: `srun -c 8` sets SLURM_CPUS_PER_TASK)."""
    lines: dict[int, set[str]] = {}
    for region in launches_of(script).regions[1:]:
        if region.under_srun and not region.expanded:
            options = set(step_options(region.srun_text))
            for number in range(region.first_line, region.first_line + region.text.count("\n") + 1):
                lines[number] = options
    return lines


_ARITHMETIC = re.compile(r"\$\(\((.*?)\)\)")
_BARE_NAME = re.compile(r"(?<![\w$])(" + "|".join(SET_ONLY_BY) + r")\b()")


def _arithmetic_reads(line: str) -> list[re.Match]:
    """Variables read by name inside `$(( ... ))`, where bash reads an unset one as 0."""
    return [found for block in _ARITHMETIC.finditer(line) for found in _BARE_NAME.finditer(block.group(1))]


def _gpu_form(script: Script) -> str | None:
    for option in ("gres", "gpus-per-node", "gpus", "gpus-per-task"):
        if script.header.get(option):
            return f"{option}={script.header.get(option)}"
    return None


def _unset_fix(name: str, script: Script) -> str:
    if name in ("SLURM_GPUS_PER_NODE", "SLURM_GPUS", "SLURM_GPUS_PER_TASK"):
        return ("use $SLURM_GPUS_ON_NODE (the GPUs this node holds, set under every GPU request form), or ask with "
                f"the option that sets {name}.")
    if name.startswith("SLURM_ARRAY"):
        return (f"add #SBATCH --array=... (or always submit with sbatch --array=...), or do not read ${name}.")
    return f"ask with {' or '.join('--' + option for option in SET_ONLY_BY[name])}, or write ${{{name}:-<default>}}."


# Variables that hold a list of GPU indices (`0,1,2,3`), not a count, under every request form.
_GPU_LISTS = ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL")
_COUNT_OPTION = re.compile(r"(--nproc[_-]per[_-]node|--num[_-]gpus|--num[_-]processes|trainer\.devices|--gpus)(?:=|\s+)"
                           r"[\"']?\$\{?(" + "|".join(_GPU_LISTS) + r")\b")


def _gpu_list_as_count(script: Script) -> Iterable[Finding]:
    """sbatch(1) 22.05, OUTPUT ENVIRONMENT VARIABLES (SLURM_JOB_GPUS: "The global GPU IDs of the GPUs allocated to
    this job", a comma-separated list, e.g. `0,1,2,3` on the local cluster) and CUDA_VISIBLE_DEVICES (a list too):
    given where a launcher expects a number of processes, the launcher stops ('invalid literal for int()')."""
    for number, line in enumerate(script.code.split("\n"), start=1):
        match = _COUNT_OPTION.search(line)
        if match and number not in script.other_job_lines:
            yield Finding(
                "gpu-list-as-count", ERROR,
                f"{match.group(1)}=${match.group(2)}: ${match.group(2)} is a list of GPU indices (e.g. 0,1,2,3), not a "
                "count, so the launcher cannot read it as a number of processes.",
                f"use the count: $SLURM_GPUS_ON_NODE (or {match.group(1)}=gpu for torchrun).", number)


RULES = [_missing_shebang, _invalid_directive_word, _exclusive_options, _gpus_per_task_without_tasks,
         _counts_contradict, _ntasks_caps_tasks_per_node, _option_given_twice, _gpu_type_contradicts_constraint,
         _variable_in_directive, _directive_look_alike, _unset_slurm_variable, _gpu_list_as_count]
