"""The linter's rules on the seeds' own scripts: the #SBATCH header (directives after a command, glued ones,
missing --output folders), Lightning/NeMo's task and GPU counts and Megatron's layout, HYBRID_SHARD on one node,
DeepSpeed offload at ZeRO-0, killing a process another shell started, a fixed rendezvous port, and `module purge`
after `module load`. Each rule is a function (Script) -> findings; ``RULES`` lists them in the order they run."""

from __future__ import annotations

import getpass
import re
from pathlib import Path
from typing import Iterable

from workshop_lib.checks import versions
from workshop_lib.checks.findings import ERROR, NOTE, WARNING, Finding
from workshop_lib.checks.layout import PARALLEL_SIZES, deepspeed_layouts, script_layout
from workshop_lib.checks.nemo_command import nemo_overrides
from workshop_lib.checks.pitfalls import (
    MEGATRON_LAYOUT,
    findings,
    hybrid_shard_single_node,
    nemo_needs_a100,
    offload_with_zero0,
)
from workshop_lib.checks.script import Script, command_words, shell_scopes

_KILL = re.compile(r"\bkill\b((?:\s+-\S+)*)\s+\"?\$\{?([A-Za-z_][A-Za-z0-9_]*)")
_ASSIGNMENT = re.compile(r"(?:^|[\s;&|(])(?:export\s+|local\s+|declare\s+\S+\s+)?([A-Za-z_][A-Za-z0-9_]*)=")
_LIGHTNING = re.compile(r"nemo\s+llm|lightning|trainer\.devices", re.IGNORECASE)
_FIXED_PORT = re.compile(r"(MASTER_PORT=|--master_port[= ]|rdzv_endpoint[= ]\S*:)\"?29500\b")
_MODULE = re.compile(r"^\s*module\s+(load|add|purge|restore)\b(.*)$")


def _directives(script: Script) -> Iterable[Finding]:
    header = script.header
    for number in header.after_command_lines:
        yield Finding(
            "directive-after-command", ERROR,
            f"this #SBATCH line comes after the first command (line {header.first_command_line}); sbatch stops "
            "reading directives there and silently ignores it.", "move every #SBATCH line above the first command.",
            number)
    for number in header.glued_lines:
        kept = ", ".join(f"--{d.option}" for d in header.on_line(number)) or "nothing"
        dropped = script.lines[number - 1].split("#SBATCH")[2].strip()
        yield Finding(
            "glued-directives", ERROR,
            f"two #SBATCH directives on one line: sbatch reads {kept} and takes `#SBATCH {dropped}` as a comment, "
            "so that request is silently dropped.", "put each #SBATCH directive on its own line.", number)
    for number in sorted({d.line for d in header.directives}):
        options = header.on_line(number)
        if len(options) > 1:
            yield Finding(
                "several-options-per-line", WARNING,
                f"{len(options)} options on one #SBATCH line ({', '.join(d.option for d in options)}).",
                "one option per #SBATCH line keeps the request readable and diffable.", number)


def _output_folders(script: Script) -> Iterable[Finding]:
    """sbatch(1) 22.05, --output ("connect the batch script's standard output directly to the file name specified
    in the filename pattern": slurmd opens it before the script runs and creates no folder; a missing folder fails
    the job at launch, seen on the local cluster) and "filename pattern" (replacement symbols, "%" followed by a
    letter): %u and %x are expanded here as SLURM will (the user, the job name); a folder named by a per-job
    symbol (%j, %A, %a, %N ...) cannot exist before the job. `$VAR` is no replacement symbol (rule
    variable-in-directive)."""
    for option in ("output", "error"):
        value = script.header.get(option)
        if not value or "$" in value or value.startswith("~"):
            continue  # taken literally by sbatch: rule variable-in-directive
        written = str(Path(value).parent)
        folder = _expand_patterns(written, script)
        if folder is None or folder in ("", "."):
            continue
        per_job = re.search(r"%[0-9]*[jJAaNnstb]", folder)
        submit_dir = script.submit_dir
        if per_job is None and submit_dir is None and not Path(folder).is_absolute():
            if not re.search(rf"mkdir\s+(-p\s+)?[\"']?{re.escape(folder)}\b", script.text):
                continue  # where sbatch will run is unknown: nothing to say
        where = Path(folder) if Path(folder).is_absolute() or submit_dir is None else Path(submit_dir) / folder
        if per_job is None and where.is_dir():
            continue
        if per_job is None and where.is_absolute() and not Path(*where.parts[:2]).exists():
            yield Finding(  # another machine's file system (/ibex/... linted on a laptop)
                "output-folder-missing", NOTE,
                f"--{option}={value}: {where.parts[1]}/ is not on this machine, so whether {folder}/ exists cannot be "
                "checked here; SLURM creates no folder, and the job fails at launch if it is missing.",
                f"check on the cluster: ls -d {folder}", script.header.line(option))
            continue
        reason = (f"names a folder by {per_job.group(0)}, which SLURM fills in per job, so that folder cannot exist "
                  "before the job starts" if per_job else f"writes into {folder}/, which does not exist")
        yield Finding(
            "output-folder-missing", ERROR,
            f"--{option}={value} {reason}; SLURM opens this file before the script runs (a mkdir inside the script is "
            "too late) and the job fails at launch.",
            "put the per-job pattern in the file name (logs/%x-%j.out) and create the folder before sbatch."
            if per_job else f"create {folder}/ before sbatch, or write the log into the submission directory.",
            script.header.line(option))


def _expand_patterns(text: str, script: Script) -> str | None:
    """%u and %x (and %%) as SLURM expands them; None when the job name is needed and unknown."""
    if "%x" in text:
        name = script.header.get("job-name") or script.name  # SLURM's default job name: the script's file name
        if name is None:
            return None  # a script given as text, with no name: nothing certain to say
        text = text.replace("%x", name)
    return text.replace("%u", getpass.getuser()).replace("%%", "%")


def _lightning(script: Script) -> Iterable[Finding]:
    if not _LIGHTNING.search(script.code):
        return
    header = script.header
    if header.get("ntasks") is not None:
        yield Finding(
            "ntasks-with-lightning", ERROR,
            "--ntasks with a Lightning/NeMo job: Lightning refuses it ('use --ntasks-per-node instead').",
            "replace --ntasks=N by --ntasks-per-node=<GPUs per node>.", header.line("ntasks"))
    if header.get("gpus-per-task") is not None:
        yield Finding(
            "gpus-per-task-with-lightning", ERROR,
            "--gpus-per-task with Lightning/NeMo: each task then sees one GPU while Lightning asks for all "
            "of them ('You requested gpu: [0, 1] But your machine only has: [0]').",
            "use --gpus-per-node=N with --ntasks-per-node=N.", header.line("gpus-per-task"))
    command = nemo_overrides(script.code)
    numbers = {"--ntasks-per-node": script.number(header.get("ntasks-per-node")),
               "--gpus-per-node": header.gpus_per_node or None,
               "trainer.devices": script.number(command.value("trainer.devices"))}
    known = {name: value for name, value in numbers.items() if value is not None}
    if len(set(known.values())) > 1:
        shown = ", ".join(f"{name}={value}" for name, value in known.items())
        yield Finding(
            "tasks-gpus-devices-mismatch", ERROR,
            f"{shown}: Lightning needs one task per GPU and trainer.devices equal to both.",
            "make --ntasks-per-node, --gpus-per-node and trainer.devices the same number.",
            header.line("ntasks-per-node") or header.line("gpus-per-node") or command.line("trainer.devices"))
    layout = script_layout(script)
    if not layout.unknown & set(PARALLEL_SIZES):  # a size known only at run time: say nothing rather than guess
        yield from findings(layout, MEGATRON_LAYOUT)
    yield from findings(layout, [nemo_needs_a100])


def _hybrid_shard(script: Script) -> Iterable[Finding]:
    yield from findings(script_layout(script), [hybrid_shard_single_node])


def _deepspeed_offload(script: Script) -> Iterable[Finding]:
    for layout in deepspeed_layouts(script):
        yield from findings(layout, [offload_with_zero0])


def _killed_pids(script: Script) -> Iterable[Finding]:
    text = script.text
    for scope_text, offset in shell_scopes(text):
        assigned = {match.group(1) for match in _ASSIGNMENT.finditer(scope_text)}
        assigned |= set(re.findall(r"\bread\s+(?:-\w+\s+)*([A-Za-z_]\w*)", scope_text))
        assigned |= set(re.findall(r"\bfor\s+([A-Za-z_]\w*)\s+in\b", scope_text))
        for match in _KILL.finditer(scope_text):
            name = match.group(2)
            if name not in assigned:
                # The outer scope keeps every line where it was (child shells blanked to newlines);
                # a child scope starts at its offset in the script.
                line = text.count("\n", 0, offset) + scope_text.count("\n", 0, match.start()) + 1
                yield Finding(
                    "kill-unset-pid", ERROR,
                    f"kill ${name}: this shell never set {name}; it was set (if anywhere) in another shell, e.g. "
                    "inside `bash -c` on another node, so the process is never stopped.",
                    f"stop a background process in the same shell that started it: {name}=$! right after it.",
                    line)


def _fixed_port(script: Script) -> Iterable[Finding]:
    """torchrun (torch 2.13, torch/distributed/run.py): --master_port is read from the command line or
    PET_MASTER_PORT, never from MASTER_PORT, and a single-node static launch without a port gets a free one
    (``run()``: max_nodes == 1 -> c10d at localhost:0). So 29500 is bound only where a launcher is handed it, or
    where MASTER_PORT is read (by `$MASTER_PORT`, or by processes srun starts, which init from the environment)."""
    match = next((found for found in _FIXED_PORT.finditer(script.code)
                  if found.group(1) != "MASTER_PORT=" or _master_port_read(script)), None)
    if match is None:
        return
    yield Finding(
        "fixed-rendezvous-port", WARNING,
        "rendezvous on the fixed port 29500: a second job on the same node fails with 'address in use'.",
        "derive the port from the job id, the same on every node of the job: "
        "MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000)) (before srun, so every node gets it).",
        script.line_of(match.group(0)))


def _master_port_read(script: Script) -> bool:
    """True when something uses MASTER_PORT: `$MASTER_PORT` in the script, or programs that read it from the
    environment (srun-started Python, Lightning/NeMo, torch.distributed's env:// init); torchrun on torch >= 2.13
    alone does not."""
    code = script.code
    if re.search(r"\$\{?MASTER_PORT\b", code):
        return True
    if re.search(r"(?<![\w./-])srun\b[^\n]*\b(?:python[\d.]*|singularity|apptainer|nemo)\b", code):
        return True
    if re.search(r"(?<![\w.-])(?:accelerate\s+launch|deepspeed)\b", code) or _LIGHTNING.search(code):
        return True
    return not versions.at_least("torch", (2, 13))


# Commands that need no module (shell builtins, coreutils, SLURM's own tools): a `module purge`
# before them alone does no harm.
_NEEDS_NO_MODULE = {"echo", "printf", "export", "cd", "mkdir", "set", "date", "sleep", "hostname", "source", ".",
                    "unset", "trap", "wait", "rm", "cp", "mv", "ls", "cat", "touch", "true", "false", "exit", "if",
                    "then", "fi", "else", "for", "do", "done", "while", "awk", "sed", "grep", "cut", "tr", "head",
                    "tail", "wc", "bc", "sort", "scontrol", "squeue", "sacct", "sinfo", "nvidia-smi", "[[", "[", "((",
                    "local", "declare", "readonly", "return", "kill", "dirname", "basename", "pwd", "tee", "env"}


def _module_purge(script: Script) -> Iterable[Finding]:
    loaded: list[tuple[int, str]] = []  # every `module load` so far
    purged: tuple[int, list[tuple[int, str]]] | None = None  # the last purge and what it undid
    for number, word in command_words(script.code):
        line = script.lines[number - 1]
        if word == "module" and (match := _MODULE.match(line)):
            if match.group(1) == "purge":
                purged = (number, list(loaded)) if loaded else purged
            else:
                loaded.append((number, match.group(2).split("#")[0].strip()))
                purged = None  # modules loaded again after the purge
            continue
        if purged is None or word in _NEEDS_NO_MODULE:
            continue
        purge_line, undone = purged
        yield Finding(
            "module-purge-after-load", ERROR,
            "`module purge` unloads every module loaded before it ("
            + "; ".join(f"line {n}: {name}" for n, name in undone)
            + f"), and `{word}` on line {number} runs after it without them.",
            "purge first, then load: move `module purge` above the `module load` lines (or load again after it).",
            purge_line)
        return


RULES = [_directives, _output_folders, _lightning, _hybrid_shard, _deepspeed_offload, _killed_pids, _fixed_port,
         _module_purge]
