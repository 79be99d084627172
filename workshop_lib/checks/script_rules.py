"""The linter's rules on the seeds' own scripts: the #SBATCH header (directives after a command, glued ones,
missing --output folders), Lightning/NeMo's task and GPU counts and Megatron's layout, HYBRID_SHARD on one node,
DeepSpeed offload at ZeRO-0, killing a process another shell started, a fixed rendezvous port, and `module purge`
after `module load`. Each rule is a function (Script) -> findings; ``RULES`` lists them in the order they run."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterable

from workshop_lib.checks.findings import ERROR, WARNING, Finding
from workshop_lib.checks.nemo_command import STRATEGY, NemoOverrides, nemo_overrides
from workshop_lib.checks.pitfalls import mixtral_default_ep_problem
from workshop_lib.checks.script import Script, command_words, shell_scopes
from workshop_lib.core.paths import DS_CONFIGS_DIR

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
    for option in ("output", "error"):
        value = script.header.get(option)
        if not value:
            continue
        folder = Path(value).parent
        if str(folder) in ("", ".") or "%" in str(folder) or "$" in str(folder):
            continue
        submit_dir = script.submit_dir
        if submit_dir is None and not folder.is_absolute():
            if not re.search(rf"mkdir\s+(-p\s+)?[\"']?{re.escape(str(folder))}\b", script.text):
                continue  # where sbatch will run is unknown: nothing to say
        where = folder if folder.is_absolute() or submit_dir is None else Path(submit_dir) / folder
        if not where.is_dir():
            yield Finding(
                "output-folder-missing", ERROR,
                f"--{option}={value} writes into {folder}/, which does not exist; SLURM opens this file before "
                "the script runs (a mkdir inside the script is too late) and the job fails at launch.",
                f"create {folder}/ before sbatch, or write the log into the submission directory.",
                script.header.line(option))


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
    yield from _nemo_layout_in_script(script, command, known.get("--gpus-per-node") or known.get("trainer.devices"))
    if "nemo llm" in script.code:
        constraint = (header.get("constraint") or "").lower()
        if "a100" not in constraint:
            yield Finding(
                "nemo-needs-a100", ERROR,
                f"a NeMo job with constraint={constraint or 'none'}: the container's kernels need A100 and fail "
                "at start-up on V100.", "add #SBATCH --constraint=a100.", header.line("constraint") or 1)


def _nemo_layout_in_script(script: Script, command: NemoOverrides, per_node: int | None) -> Iterable[Finding]:
    sizes = {}
    for name in ("tensor", "expert", "pipeline", "context"):
        key = f"{STRATEGY}{name}_model_parallel_size" if name != "context" else f"{STRATEGY}context_parallel_size"
        written = command.value(key)
        sizes[name] = script.number(written) if written is not None else 1
    if None in sizes.values():
        return  # a size the linter cannot know (a variable set at run time): say nothing rather than guess
    tp, ep, pp, cp = sizes["tensor"], sizes["expert"], sizes["pipeline"], sizes["context"]
    peft_none = (command.value("peft") == "none"
                 or re.search(r"peft_scheme\s*=\s*(['\"]none['\"]|None)", script.code) is not None)
    tp_line = command.line(f"{STRATEGY}tensor_model_parallel_size")
    nodes = script.number(script.header.get("nodes") or "1") or 1
    total = per_node * nodes if per_node else None
    if total and total % (tp * ep * pp * cp):
        sizes_text = "TP x EP x PP" + (" x CP" if cp > 1 else "")
        values = f"{tp} x {ep} x {pp}" + (f" x {cp}" if cp > 1 else "")
        yield Finding(
            "parallel-sizes-mismatch", ERROR,
            f"{sizes_text} = {values} = {tp * ep * pp * cp} does not divide the {total} GPUs of the job "
            f"({per_node} per node x {nodes} node{'s' if nodes > 1 else ''}): Megatron stops at start-up.",
            f"request a multiple of {sizes_text} GPUs (the rest is data parallel), or smaller sizes.",
            tp_line or command.line(f"{STRATEGY}context_parallel_size") or script.header.line("gpus-per-node"))
    factory = re.search(r"--factory\s+[\"']?mixtral", script.code)
    if factory and command.value(f"{STRATEGY}expert_model_parallel_size") is None and total:
        problem = mixtral_default_ep_problem(total, tp, pp)
        if problem:
            yield Finding("mixtral-without-ep", ERROR, f"a Mixtral run: {problem}.",
                          f"add {STRATEGY}expert_model_parallel_size=<EP> with TP x EP x PP dividing {total}.",
                          script.line_of("--factory"))
    if (tp > 1 or pp > 1) and not peft_none:
        yield Finding(
            "model-parallel-with-lora", ERROR,
            f"model parallel (TP={tp}, PP={pp}) with LoRA still on (the factory's default PEFT).",
            "use the recipe's full fine-tune (--factory 'llama31_8b(peft_scheme=None)') for a "
            "model-parallel run.",
            tp_line or command.line(f"{STRATEGY}pipeline_model_parallel_size"))
    sequence_parallel = command.value(f"{STRATEGY}sequence_parallel")
    if sequence_parallel is not None and sequence_parallel.lower() in ("true", "1") and tp < 2:
        yield Finding(
            "sequence-parallel-without-tp", ERROR,
            "sequence_parallel=True with tensor parallel size 1: sequence parallelism splits activations along "
            "the tensor-parallel group, so there is nothing to split (Megatron refuses it).",
            f"set {STRATEGY}tensor_model_parallel_size >= 2, or drop sequence_parallel.",
            command.line(f"{STRATEGY}sequence_parallel"))


def _hybrid_shard(script: Script) -> Iterable[Finding]:
    match = re.search(r"hybrid_shard", script.code, re.IGNORECASE)
    if match and script.number(script.header.get("nodes") or "1") == 1:
        yield Finding(
            "hybrid-shard-single-node", ERROR,
            "HYBRID_SHARD on one node: it shards inside a node and replicates across nodes, so here it is "
            "FULL_SHARD under another name and the comparison means nothing.",
            "request --nodes=2 or more, or use FULL_SHARD.", script.line_of(match.group(0)))


def _deepspeed_offload(script: Script) -> Iterable[Finding]:
    for match in re.finditer(r"--deepspeed[= ]+[\"']?([^\s\"']+\.json)", script.code):
        config = _read_json(match.group(1), script.submit_dir)
        if not config:
            continue
        zero = config.get("zero_optimization") or {}
        offloaded = any((zero.get(key) or {}).get("device") in ("cpu", "nvme")
                        for key in ("offload_optimizer", "offload_param"))
        if offloaded and int(zero.get("stage", 0)) == 0:
            yield Finding(
                "offload-with-zero0", ERROR,
                f"{match.group(1)} offloads to CPU at ZeRO stage 0, which partitions nothing to offload.",
                "use a stage 1-3 config with offload, or drop the offload block.", script.line_of(match.group(1)))


def _read_json(name: str, submit_dir: Path | None) -> dict | None:
    candidates = [Path(name)]
    if submit_dir is not None:
        candidates.insert(0, Path(submit_dir) / name)
    candidates.append(DS_CONFIGS_DIR / Path(name).name)
    for candidate in candidates:
        if candidate.is_file():
            try:
                return json.loads(candidate.read_text())
            except (OSError, ValueError):
                return None
    return None


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
    match = _FIXED_PORT.search(script.code)
    if match:
        yield Finding(
            "fixed-rendezvous-port", WARNING,
            "rendezvous on the fixed port 29500: a second job on the same node fails with 'address in use'.",
            "derive the port from the job id, the same on every node of the job: "
            "MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000)) (before srun, so every node gets it).",
            script.line_of(match.group(0)))


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
            f"`module purge` unloads every module loaded before it ("
            + "; ".join(f"line {n}: {name}" for n, name in undone)
            + f"), and `{word}` on line {number} runs after it without them.",
            "purge first, then load: move `module purge` above the `module load` lines (or load again after it).",
            purge_line)
        return


RULES = [_directives, _output_folders, _lightning, _hybrid_shard, _deepspeed_offload, _killed_pids, _fixed_port,
         _module_purge]
