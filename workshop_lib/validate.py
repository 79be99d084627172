"""Catch the seeds' pitfalls before SLURM does: rules for experiments and a linter for any sbatch script.

``validate_experiment`` checks an Experiment (and the Profile that will realise it) before rendering;
``lint_script`` reads a job script, rendered or hand-written, line by line. Both return Findings:
a line, a rule id, what is wrong and how to fix it. Errors stop a submission; warnings do not.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

from workshop_lib.checks.findings import ERROR, WARNING, Finding, ValidationError, errors_in
from workshop_lib.core.errors import WorkshopError
from workshop_lib.core.paths import DS_CONFIGS_DIR
from workshop_lib.checks.sbatch import SbatchHeader, heredoc_lines, read_header

if TYPE_CHECKING:  # imported for annotations only: profiles imports experiments, not the other way
    from workshop_lib.experiments import Experiment
    from workshop_lib.profiles import Profile

# ---------------------------------------------------------------------------------------------
# Rules on experiments
# ---------------------------------------------------------------------------------------------
ExperimentRule = Callable[["Experiment", "Profile | None"], Iterable[Finding]]
EXPERIMENT_RULES: list[ExperimentRule] = []
# NeMo's Mixtral 8x7B recipe sets expert_model_parallel_size = 8 when the command does not.
NEMO_MIXTRAL_DEFAULT_EP = 8


def experiment_rule(rule: ExperimentRule) -> ExperimentRule:
    """Register a rule on experiments: a function (experiment, profile or None) -> findings.
    Another module adds its own rule by decorating it (the module must be imported)."""
    EXPERIMENT_RULES.append(rule)
    return rule


def validate_experiment(experiment: "Experiment", profile: "Profile | None" = None) -> list[Finding]:
    """Every rule an experiment breaks, on its own and as realised by ``profile``."""
    return [finding for rule in EXPERIMENT_RULES for finding in rule(experiment, profile)]


def _error(rule: str, message: str, fix: str) -> Finding:
    return Finding(rule, ERROR, message, fix)


def mixtral_default_ep_problem(gpus: int, tensor_parallel: int, pipeline_parallel: int) -> str | None:
    """Why NeMo's default EP for Mixtral cannot run on this many GPUs, or None when it can.
    Megatron carves the expert-parallel group out of the data-parallel ranks (with the expert
    tensor-parallel size equal to TP), so TP x EP x PP must divide the GPU count."""
    needed = tensor_parallel * NEMO_MIXTRAL_DEFAULT_EP * pipeline_parallel
    if gpus % needed == 0:
        return None
    return (f"without an expert-parallel size, NeMo's Mixtral recipe uses EP = {NEMO_MIXTRAL_DEFAULT_EP}, and "
            f"TP x EP x PP = {tensor_parallel} x {NEMO_MIXTRAL_DEFAULT_EP} x {pipeline_parallel} = {needed} does not "
            f"divide the {gpus} GPUs, so NeMo stops at start-up")


@experiment_rule
def _engine_and_resources(experiment, profile):
    from workshop_lib.experiments import ENGINES

    if experiment.engine not in ENGINES:
        yield _error("unknown-engine", f"engine={experiment.engine!r} is not one of {ENGINES}.", "use nemo, hf or gpt.")
    if experiment.nodes < 1 or experiment.gpus_per_node < 1:
        yield _error("no-resources", f"nodes={experiment.nodes}, gpus_per_node={experiment.gpus_per_node}.",
                     "ask for at least one node and one GPU per node.")


@experiment_rule
def _nemo_layout(experiment, profile):
    from workshop_lib.experiments import NEMO

    if experiment.engine != NEMO:
        return
    tp, pp = experiment.tensor_parallel, experiment.pipeline_parallel
    model_parallel = tp * (experiment.expert_parallel or 1) * pp
    # Megatron: data parallel = GPUs / (TP x PP), and the EP ranks are carved out of it, so both
    # TP x PP and TP x EP x PP must divide the GPUs (they need not equal them).
    if experiment.gpus % model_parallel:
        yield _error("parallel-sizes-mismatch",
                     f"TP x EP x PP = {model_parallel} does not divide the {experiment.gpus} GPUs.",
                     "choose parallel sizes whose product divides the GPU count.")
    if "mixtral" in experiment.model and experiment.expert_parallel is None:
        problem = mixtral_default_ep_problem(experiment.gpus, tp, pp)
        if problem:
            yield _error("mixtral-without-ep", f"{experiment.model}: {problem}.",
                         "set expert_parallel (trainer.strategy.expert_model_parallel_size) to a size that divides "
                         "the GPU count.")
    if experiment.peft == "lora" and (tp > 1 or pp > 1):
        yield _error("model-parallel-with-lora",
                     f"TP={tp}, PP={pp} with LoRA still on: LoRA hides the memory behaviour model parallelism is "
                     "meant to show.", "set peft='none' (peft=none) for model-parallel runs, or TP=PP=1 for LoRA runs.")
    if experiment.sequence_parallel and tp < 2:
        yield _error("sequence-parallel-without-tp", "sequence parallelism splits activations along the tensor-"
                     "parallel group, and TP is 1.", "use TP >= 2 or turn sequence_parallel off.")
    # The container's kernels are the A100 constraint's reason; NeMo installed without it (a workstation) is not.
    if (profile is not None and profile.nemo.enabled and profile.nemo.image
            and (profile.scheduler.constraint or "") != "a100"):
        yield _error("nemo-needs-a100", f"profile {profile.name!r} asks for constraint="
                     f"{profile.scheduler.constraint!r}; NeMo's container fails on anything but A100.",
                     "set scheduler.constraint: a100 in the profile.")


@experiment_rule
def _sharding_and_offload(experiment, profile):
    from workshop_lib.experiments import FSDP_STRATEGIES

    if experiment.zero_stage is not None and experiment.zero_stage not in (0, 1, 2, 3):
        yield _error("unknown-zero-stage", f"zero_stage={experiment.zero_stage}.", "use a ZeRO stage 0, 1, 2 or 3.")
    if experiment.offload and experiment.zero_stage == 0:
        yield _error("offload-with-zero0", "CPU offload with ZeRO stage 0: stage 0 partitions nothing, so there is "
                     "nothing to offload.", "use ZeRO stage 1, 2 or 3 with offload.")
    if experiment.offload and experiment.zero_stage is None and experiment.fsdp is None:
        yield _error("offload-without-sharding", "offload is on but neither DeepSpeed ZeRO nor FSDP is used.",
                     "set zero_stage >= 1 or an FSDP strategy, or turn offload off.")
    if experiment.pin_memory and not experiment.offload:
        yield _error("pinned-without-offload", "pinned memory only applies to offloaded states.",
                     "turn offload on, or pin_memory off.")
    if experiment.fsdp is not None:
        if experiment.fsdp not in FSDP_STRATEGIES:
            yield _error("unknown-fsdp-strategy", f"fsdp={experiment.fsdp!r}.", f"use one of {FSDP_STRATEGIES}.")
        if experiment.zero_stage is not None:
            yield _error("fsdp-and-deepspeed", "FSDP and DeepSpeed both shard the model; the Trainer takes one.",
                         "choose either fsdp or zero_stage.")
        if experiment.fsdp == "HYBRID_SHARD" and experiment.nodes < 2:
            yield _error("hybrid-shard-single-node", "HYBRID_SHARD shards inside a node and replicates across nodes; "
                         "on one node it is FULL_SHARD under another name.", "use 2+ nodes or FULL_SHARD.")


@experiment_rule
def _dataset_and_profile(experiment, profile):
    if experiment.samples is not None and experiment.samples_per_gpu is not None:
        yield _error("two-dataset-sizes", "both samples (fixed) and samples_per_gpu (weak scaling) are set.",
                     "keep one of them.")
    if profile is not None:
        reason = profile.unsupported_reason(experiment)
        if reason:
            yield _error("outside-profile-grid", reason + ".", "pick a profile with larger limits (e.g. ibex).")
        from workshop_lib.checks.fit import fit_findings  # the fit rule (predicted memory per GPU) has its own module

        yield from fit_findings(experiment, profile)


def raise_for_experiment(experiment: "Experiment", profile: "Profile | None" = None) -> list[Finding]:
    """Raise ValidationError when the experiment breaks a rule; return the warnings otherwise."""
    findings = validate_experiment(experiment, profile)
    errors = errors_in(findings)
    if errors:
        raise ValidationError(f"experiment {experiment.id}", errors)
    return findings


# ---------------------------------------------------------------------------------------------
# The linter
# ---------------------------------------------------------------------------------------------
_STRATEGY = "trainer.strategy."
_OVERRIDE = re.compile(r"(?<![\w.])(trainer\.devices|trainer\.num_nodes|trainer\.strategy\.(?:tensor|expert|pipeline)"
                       r"_model_parallel_size|trainer\.strategy\.context_parallel_size|trainer\.strategy\."
                       r"sequence_parallel|peft)=(\"[^\"]*\"|'[^']*'|[^\s\\]+)")
_KILL = re.compile(r"\bkill\b((?:\s+-\S+)*)\s+\"?\$\{?([A-Za-z_][A-Za-z0-9_]*)")
_ASSIGNMENT = re.compile(r"(?:^|[\s;&|(])(?:export\s+|local\s+|declare\s+\S+\s+)?([A-Za-z_][A-Za-z0-9_]*)=")
_NUMBER_ASSIGNMENT = re.compile(r"^\s*(?:export\s+)?([A-Za-z_]\w*)=[\"']?(\d+)[\"']?\s*(?:#.*)?$", re.MULTILINE)
_BASH_C = re.compile(r"\bbash\s+-c\s+(['\"])")
_LIGHTNING = re.compile(r"nemo\s+llm|lightning|trainer\.devices", re.IGNORECASE)
_FIXED_PORT = re.compile(r"(MASTER_PORT=|--master_port[= ]|rdzv_endpoint[= ]\S*:)\"?29500\b")
_MODULE = re.compile(r"^\s*module\s+(load|add|purge|restore)\b(.*)$")
# SLURM's variables for what the directives asked, by the directive that sets them.
_SLURM_VARIABLES = {"SLURM_GPUS_PER_NODE": "gpus-per-node", "SLURM_GPUS_ON_NODE": "gpus-per-node",
                    "SLURM_NTASKS_PER_NODE": "ntasks-per-node", "SLURM_JOB_NUM_NODES": "nodes",
                    "SLURM_NNODES": "nodes"}


@dataclass(frozen=True)
class Script:
    """A job script as the rules see it."""

    text: str
    header: SbatchHeader
    submit_dir: Path | None = None

    @cached_property
    def lines(self) -> list[str]:
        return self.text.splitlines()

    @cached_property
    def code(self) -> str:
        """The script without full-line comments (so explanations do not trip the rules), and without the
        bodies of heredocs that write a job script of their own (their #SBATCH lines are another job's)."""
        other_jobs = self.other_job_lines
        return "\n".join("" if line.lstrip().startswith("#") or number in other_jobs else line
                         for number, line in enumerate(self.lines, start=1))

    @cached_property
    def other_job_lines(self) -> set[int]:
        """Lines of heredocs whose body holds #SBATCH directives: a second job, linted on its own."""
        body = heredoc_lines(self.text)
        blocks: list[list[int]] = []
        for number in sorted(body):
            if blocks and blocks[-1][-1] == number - 1:
                blocks[-1].append(number)
            else:
                blocks.append([number])
        return {number for block in blocks if any(self.lines[n - 1].lstrip().startswith("#SBATCH") for n in block)
                for number in block}

    def line_of(self, needle: str) -> int | None:
        for number, line in enumerate(self.lines, start=1):
            if needle in line and not line.lstrip().startswith("#") and number not in self.other_job_lines:
                return number
        return None

    def number(self, value: str | None) -> int | None:
        """An integer from a literal, a SLURM variable the directives set, or a number assigned in the script."""
        if value is None:
            return None
        value = value.strip("\"'")
        if value.isdigit():
            return int(value)
        match = re.fullmatch(r"\$\{?([A-Za-z_]\w*)\}?", value)
        if not match:
            return None
        name = match.group(1)
        if name in _SLURM_VARIABLES:
            directive = _SLURM_VARIABLES[name]
            if directive == "gpus-per-node":
                return self.header.gpus_per_node or None
            return self.number(self.header.get(directive) or ("1" if directive == "nodes" else None))
        assigned = [int(found[1]) for found in _NUMBER_ASSIGNMENT.findall(self.text) if found[0] == name]
        return assigned[-1] if len(set(assigned)) == 1 else None


ScriptRule = Callable[[Script], Iterable[Finding]]
SCRIPT_RULES: list[ScriptRule] = []


def script_rule(rule: ScriptRule) -> ScriptRule:
    """Register a linter rule: a function (Script) -> findings."""
    SCRIPT_RULES.append(rule)
    return rule


class NotAJobScript(WorkshopError):
    """The linter was given something that is not a shell job script (binary data, Python, JSON, empty)."""


_SHELL_SHEBANG = re.compile(r"^#!\s*\S*(?:/|env\s+)(?:ba|z|k|da)?sh\b")


def read_job_script(path: Path) -> str:
    """The text of a job script; NotAJobScript (saying what the file is instead) for anything else, so a
    wrong file is never reported as a script without findings."""
    path = Path(path)
    if not path.is_file():
        raise WorkshopError(f"no script at {path}: give the path of an sbatch script (or a folder of them)")
    data = path.read_bytes()
    if b"\0" in data[:65536]:
        raise NotAJobScript(f"{path}: a binary file (it holds NUL bytes), not a job script; give the sbatch "
                            "script itself (a text file starting with #!/bin/bash and #SBATCH lines)")
    text = data.decode("utf-8", errors="replace")
    if text.count("\ufffd") > max(8, len(text) // 100):
        raise NotAJobScript(f"{path}: not UTF-8 text ({text.count(chr(0xFFFD))} undecodable bytes), not a job "
                            "script; give the sbatch script itself")
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if not first:
        raise NotAJobScript(f"{path}: empty, nothing to check; give an sbatch script with #SBATCH lines")
    if first.startswith("#!") and not _SHELL_SHEBANG.match(first):
        raise NotAJobScript(f"{path}: starts with {first[:60]!r}, a script for another interpreter; sbatch runs "
                            "shell scripts: check the job script that starts it (#!/bin/bash, #SBATCH lines)")
    if not first.startswith("#!") and "#SBATCH" not in text:
        raise NotAJobScript(f"{path}: neither a #! line nor any #SBATCH directive, so not a job script "
                            "(sbatch refuses a script without #!); give the sbatch script itself")
    return text


def lint_file(path: Path) -> list[Finding]:
    """Lint a script on disk; --output folders are checked relative to the script's directory."""
    path = Path(path)
    return lint_script(read_job_script(path), submit_dir=path.parent)


def lint_script(text: str, submit_dir: Path | None = None) -> list[Finding]:
    """Every finding for one script, sorted by line. ``submit_dir`` is where sbatch will be called."""
    script = Script(text, read_header(text), submit_dir)
    findings = [finding for rule in SCRIPT_RULES for finding in rule(script)]
    return sorted(findings, key=lambda finding: (finding.line or 0, finding.rule))


@script_rule
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


@script_rule
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


@dataclass(frozen=True)
class _NemoCommand:
    """The overrides of a `nemo llm finetune` command: key -> (value as written, line)."""

    overrides: dict[str, tuple[str, int]]

    def value(self, key: str) -> str | None:
        found = self.overrides.get(key)
        return found[0].strip("\"'") if found else None

    def line(self, key: str) -> int | None:
        found = self.overrides.get(key)
        return found[1] if found else None


def nemo_command(script: Script) -> _NemoCommand:
    code = script.code
    return _NemoCommand({match.group(1): (match.group(2), code.count("\n", 0, match.start()) + 1)
                         for match in _OVERRIDE.finditer(code)})


@script_rule
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
    command = nemo_command(script)
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


def _nemo_layout_in_script(script: Script, command: _NemoCommand, per_node: int | None) -> Iterable[Finding]:
    sizes = {}
    for name in ("tensor", "expert", "pipeline", "context"):
        key = f"{_STRATEGY}{name}_model_parallel_size" if name != "context" else f"{_STRATEGY}context_parallel_size"
        written = command.value(key)
        sizes[name] = script.number(written) if written is not None else 1
    if None in sizes.values():
        return  # a size the linter cannot know (a variable set at run time): say nothing rather than guess
    tp, ep, pp, cp = sizes["tensor"], sizes["expert"], sizes["pipeline"], sizes["context"]
    peft_none = (command.value("peft") == "none"
                 or re.search(r"peft_scheme\s*=\s*(['\"]none['\"]|None)", script.code) is not None)
    tp_line = command.line(f"{_STRATEGY}tensor_model_parallel_size")
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
            tp_line or command.line(f"{_STRATEGY}context_parallel_size") or script.header.line("gpus-per-node"))
    factory = re.search(r"--factory\s+[\"']?mixtral", script.code)
    if factory and command.value(f"{_STRATEGY}expert_model_parallel_size") is None and total:
        problem = mixtral_default_ep_problem(total, tp, pp)
        if problem:
            yield Finding("mixtral-without-ep", ERROR, f"a Mixtral run: {problem}.",
                          f"add {_STRATEGY}expert_model_parallel_size=<EP> with TP x EP x PP dividing {total}.",
                          script.line_of("--factory"))
    if (tp > 1 or pp > 1) and not peft_none:
        yield Finding(
            "model-parallel-with-lora", ERROR,
            f"model parallel (TP={tp}, PP={pp}) with LoRA still on (the factory's default PEFT).",
            "use the recipe's full fine-tune (--factory 'llama31_8b(peft_scheme=None)') for a "
            "model-parallel run.",
            tp_line or command.line(f"{_STRATEGY}pipeline_model_parallel_size"))
    sequence_parallel = command.value(f"{_STRATEGY}sequence_parallel")
    if sequence_parallel is not None and sequence_parallel.lower() in ("true", "1") and tp < 2:
        yield Finding(
            "sequence-parallel-without-tp", ERROR,
            "sequence_parallel=True with tensor parallel size 1: sequence parallelism splits activations along "
            "the tensor-parallel group, so there is nothing to split (Megatron refuses it).",
            f"set {_STRATEGY}tensor_model_parallel_size >= 2, or drop sequence_parallel.",
            command.line(f"{_STRATEGY}sequence_parallel"))


@script_rule
def _hybrid_shard(script: Script) -> Iterable[Finding]:
    match = re.search(r"hybrid_shard", script.code, re.IGNORECASE)
    if match and script.number(script.header.get("nodes") or "1") == 1:
        yield Finding(
            "hybrid-shard-single-node", ERROR,
            "HYBRID_SHARD on one node: it shards inside a node and replicates across nodes, so here it is "
            "FULL_SHARD under another name and the comparison means nothing.",
            "request --nodes=2 or more, or use FULL_SHARD.", script.line_of(match.group(0)))


@script_rule
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


@script_rule
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


def shell_scopes(text: str) -> list[tuple[str, int]]:
    """The batch shell's text and the text of each `bash -c '...'` child shell, with their offsets."""
    children: list[tuple[int, int]] = []
    position = 0
    while True:
        match = _BASH_C.search(text, position)
        if not match:
            break
        quote, start = match.group(1), match.end()
        end = start
        while end < len(text):
            if text[end] == quote and (quote == "'" or text[end - 1] != "\\"):
                break
            end += 1
        children.append((start, end))
        position = end + 1
    scopes = [(text[start:end], start) for start, end in children]
    outer, cursor = [], 0
    for start, end in children:
        outer.append(text[cursor:start])
        outer.append("\n" * text.count("\n", start, end))  # keep line numbers
        cursor = end
    outer.append(text[cursor:])
    return [("".join(outer), 0)] + scopes


@script_rule
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
_HEREDOC = re.compile(r"<<-?\s*['\"]?(\w+)['\"]?")


def _commands(code: str) -> Iterable[tuple[int, str]]:
    """(line, command word) for the commands a script runs, `$(...)` ones included, heredoc bodies skipped."""
    delimiter = None
    for number, line in enumerate(code.splitlines(), start=1):
        if delimiter is not None:
            delimiter = None if line.strip() == delimiter else delimiter
            continue
        words = line.split()
        if words and not re.match(r"^[A-Za-z_]\w*(\[[^]]*\])?=", words[0]):
            yield number, words[0]
        for word in re.findall(r"\$\(\s*([\w./-]+)", line):
            yield number, word
        if match := _HEREDOC.search(line):
            delimiter = match.group(1)


@script_rule
def _module_purge(script: Script) -> Iterable[Finding]:
    loaded: list[tuple[int, str]] = []  # every `module load` so far
    purged: tuple[int, list[tuple[int, str]]] | None = None  # the last purge and what it undid
    for number, word in _commands(script.code):
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


# Rules in their own modules, registered on import: hand-written launches (torchrun, DeepSpeed, Accelerate,
# NeMo on several nodes) and what a job asks SLURM for (time, host memory, paths, NeMo memory fit).
from workshop_lib.checks import launches, requests  # noqa: E402,F401
