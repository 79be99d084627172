"""Catch the seeds' pitfalls before SLURM does: rules for experiments and a linter for any sbatch script.

``validate_experiment`` checks an Experiment (and the Profile that will realise it) before rendering;
``lint_script`` reads a job script, rendered or hand-written, line by line. Both return Findings:
a line, a rule id, what is wrong and how to fix it. Errors stop a submission; warnings do not.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from .errors import WorkshopError

if TYPE_CHECKING:  # imported for annotations only: profiles imports experiments, not the other way
    from .experiments import Experiment
    from .profiles import Profile

ERROR = "error"
WARNING = "warning"
DS_CONFIGS_DIR = Path(__file__).resolve().parent.parent / "slurm" / "ds_configs"


@dataclass(frozen=True)
class Finding:
    """One problem: where, which rule, what is wrong, and the fix."""

    rule: str
    severity: str
    message: str
    fix: str
    line: int | None = None

    @property
    def is_error(self) -> bool:
        return self.severity == ERROR

    def format(self, source: str = "") -> str:
        where = f"{source}:{self.line}" if self.line else (source or "experiment")
        return f"{where}: {self.severity} [{self.rule}] {self.message} Fix: {self.fix}"


class ValidationError(WorkshopError):
    """An experiment or a script breaks a rule that would make the job fail."""

    def __init__(self, subject: str, findings: list[Finding]):
        self.findings = findings
        details = "\n".join("  " + finding.format() for finding in findings)
        super().__init__(f"{subject} cannot run as declared:\n{details}")


# ---------------------------------------------------------------------------------------------
# Rules on experiments
# ---------------------------------------------------------------------------------------------
def validate_experiment(experiment: "Experiment", profile: "Profile | None" = None) -> list[Finding]:
    """Every rule an experiment breaks, on its own and as realised by ``profile``."""
    from .experiments import ENGINES, FSDP_STRATEGIES, NEMO

    findings: list[Finding] = []

    def error(rule: str, message: str, fix: str) -> None:
        findings.append(Finding(rule, ERROR, message, fix))

    if experiment.engine not in ENGINES:
        error("unknown-engine", f"engine={experiment.engine!r} is not one of {ENGINES}.",
              "use nemo, hf or gpt.")
    if experiment.nodes < 1 or experiment.gpus_per_node < 1:
        error("no-resources", f"nodes={experiment.nodes}, gpus_per_node={experiment.gpus_per_node}.",
              "ask for at least one node and one GPU per node.")
    model_parallel = experiment.tensor_parallel * (experiment.expert_parallel or 1) * experiment.pipeline_parallel
    if experiment.engine == NEMO:
        # Megatron: data parallel = GPUs / (TP x PP), and the EP ranks are carved out of it, so both
        # TP x PP and TP x EP x PP must divide the GPUs (they need not equal them).
        if experiment.gpus % model_parallel:
            error("parallel-sizes-mismatch",
                  f"TP x EP x PP = {model_parallel} does not divide the {experiment.gpus} GPUs.",
                  "choose parallel sizes whose product divides the GPU count.")
        if "mixtral" in experiment.model and experiment.expert_parallel is None:
            error("mixtral-without-ep", f"{experiment.model} has no expert-parallel size; NeMo refuses to start.",
                  "set expert_parallel (trainer.strategy.expert_model_parallel_size).")
        if experiment.peft == "lora" and (experiment.tensor_parallel > 1 or experiment.pipeline_parallel > 1):
            error("model-parallel-with-lora",
                  f"TP={experiment.tensor_parallel}, PP={experiment.pipeline_parallel} with LoRA still on: LoRA "
                  "hides the memory behaviour model parallelism is meant to show.",
                  "set peft='none' (peft=none) for model-parallel runs, or TP=PP=1 for LoRA runs.")
        if experiment.sequence_parallel and experiment.tensor_parallel < 2:
            error("sequence-parallel-without-tp", "sequence parallelism splits activations along the tensor-"
                  "parallel group, and TP is 1.", "use TP >= 2 or turn sequence_parallel off.")
        if profile is not None and profile.nemo.enabled and (profile.scheduler.constraint or "") != "a100":
            error("nemo-needs-a100", f"profile {profile.name!r} asks for constraint="
                  f"{profile.scheduler.constraint!r}; NeMo's container fails on anything but A100.",
                  "set scheduler.constraint: a100 in the profile.")
    if experiment.zero_stage is not None and experiment.zero_stage not in (0, 1, 2, 3):
        error("unknown-zero-stage", f"zero_stage={experiment.zero_stage}.", "use a ZeRO stage 0, 1, 2 or 3.")
    if experiment.offload and experiment.zero_stage == 0:
        error("offload-with-zero0", "CPU offload with ZeRO stage 0: stage 0 partitions nothing, so there is "
              "nothing to offload.", "use ZeRO stage 1, 2 or 3 with offload.")
    if experiment.offload and experiment.zero_stage is None and experiment.fsdp is None:
        error("offload-without-sharding", "offload is on but neither DeepSpeed ZeRO nor FSDP is used.",
              "set zero_stage >= 1 or an FSDP strategy, or turn offload off.")
    if experiment.pin_memory and not experiment.offload:
        error("pinned-without-offload", "pinned memory only applies to offloaded states.",
              "turn offload on, or pin_memory off.")
    if experiment.fsdp is not None:
        if experiment.fsdp not in FSDP_STRATEGIES:
            error("unknown-fsdp-strategy", f"fsdp={experiment.fsdp!r}.", f"use one of {FSDP_STRATEGIES}.")
        if experiment.zero_stage is not None:
            error("fsdp-and-deepspeed", "FSDP and DeepSpeed both shard the model; the Trainer takes one.",
                  "choose either fsdp or zero_stage.")
        if experiment.fsdp == "HYBRID_SHARD" and experiment.nodes < 2:
            error("hybrid-shard-single-node", "HYBRID_SHARD shards inside a node and replicates across nodes; "
                  "on one node it is FULL_SHARD under another name.", "use 2+ nodes or FULL_SHARD.")
    if experiment.samples is not None and experiment.samples_per_gpu is not None:
        error("two-dataset-sizes", "both samples (fixed) and samples_per_gpu (weak scaling) are set.",
              "keep one of them.")
    if profile is not None:
        reason = profile.unsupported_reason(experiment)
        if reason:
            error("outside-profile-grid", reason + ".", "pick a profile with larger limits (e.g. ibex).")
        from .fit_check import fit_findings  # the fit rule (predicted memory per GPU) has its own module

        findings += fit_findings(experiment, profile)
    return findings


def raise_for_experiment(experiment: "Experiment", profile: "Profile | None" = None) -> list[Finding]:
    """Raise ValidationError when the experiment breaks a rule; return the warnings otherwise."""
    findings = validate_experiment(experiment, profile)
    errors = [finding for finding in findings if finding.is_error]
    if errors:
        raise ValidationError(f"experiment {experiment.id}", errors)
    return findings


# ---------------------------------------------------------------------------------------------
# The linter
# ---------------------------------------------------------------------------------------------
_DIRECTIVE = re.compile(r"^#SBATCH\b")
_OPTION = re.compile(r"--([A-Za-z-]+)(?:[= ]([^\s#]+))?")
_SHORT_OPTIONS = {"N": "nodes", "n": "ntasks", "c": "cpus-per-task", "o": "output", "e": "error",
                  "G": "gpus", "t": "time", "J": "job-name", "C": "constraint", "p": "partition"}
_OVERRIDE = re.compile(r"\b(trainer\.devices|trainer\.num_nodes|trainer\.strategy\.tensor_model_parallel_size|"
                       r"trainer\.strategy\.expert_model_parallel_size|trainer\.strategy\.pipeline_model_parallel_size|"
                       r"peft)=[\"']?([^\s\"'\\]+)")
_KILL = re.compile(r"\bkill\b((?:\s+-\S+)*)\s+\"?\$\{?([A-Za-z_][A-Za-z0-9_]*)")
_ASSIGNMENT = re.compile(r"(?:^|[\s;&|(])(?:export\s+|local\s+|declare\s+\S+\s+)?([A-Za-z_][A-Za-z0-9_]*)=")
_BASH_C = re.compile(r"\bbash\s+-c\s+(['\"])")
_LIGHTNING = re.compile(r"nemo\s+llm|lightning|trainer\.devices", re.IGNORECASE)
_FIXED_PORT = re.compile(r"(MASTER_PORT=|--master_port[= ]|rdzv_endpoint[= ]\S*:)\"?29500\b")


@dataclass(frozen=True)
class Directives:
    """The #SBATCH options of a script: option -> (value, line)."""

    values: dict[str, tuple[str, int]]

    def get(self, option: str) -> str | None:
        found = self.values.get(option)
        return found[0] if found else None

    def line(self, option: str) -> int | None:
        found = self.values.get(option)
        return found[1] if found else None


def lint_file(path: Path) -> list[Finding]:
    """Lint a script on disk; --output folders are checked relative to the script's directory."""
    path = Path(path)
    if not path.is_file():
        raise WorkshopError(f"no script at {path}: give the path of an sbatch script")
    return lint_script(path.read_text(), submit_dir=path.parent)


def lint_script(text: str, submit_dir: Path | None = None) -> list[Finding]:
    """Every finding for one script, sorted by line. ``submit_dir`` is where sbatch will be called."""
    lines = text.splitlines()
    findings: list[Finding] = []
    directives = _read_directives(lines, findings)
    _check_output_folders(directives, text, submit_dir, findings)
    if _LIGHTNING.search(_code_only(text)):
        _check_lightning(directives, text, findings)
    _check_hybrid_shard(directives, text, findings)
    _check_deepspeed_offload(text, submit_dir, findings)
    _check_killed_pids(text, findings)
    _check_fixed_port(text, findings)
    return sorted(findings, key=lambda finding: (finding.line or 0, finding.rule))


def _read_directives(lines: list[str], findings: list[Finding]) -> Directives:
    values: dict[str, tuple[str, int]] = {}
    first_command: int | None = None
    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        if number == 1 and stripped.startswith("#!"):
            continue
        if _DIRECTIVE.match(stripped):
            if first_command is not None:
                findings.append(Finding(
                    "directive-after-command", ERROR,
                    f"this #SBATCH line comes after the first command (line {first_command}); sbatch stops "
                    "reading directives there and silently ignores it.",
                    "move every #SBATCH line above the first command.", number))
                continue
            body = stripped[len("#SBATCH"):]
            if "#SBATCH" in body:
                findings.append(Finding(
                    "glued-directives", ERROR,
                    "two #SBATCH directives on one line: everything after the first is read as a comment.",
                    "put each #SBATCH directive on its own line.", number))
                body = body.split("#SBATCH")[0]
            options = _parse_options(body.split(" #")[0])
            if len(options) > 1:
                findings.append(Finding(
                    "several-options-per-line", WARNING,
                    f"{len(options)} options on one #SBATCH line ({', '.join(name for name, _ in options)}).",
                    "one option per #SBATCH line keeps the request readable and diffable.", number))
            for name, value in options:
                values[name] = (value, number)
        elif stripped and not stripped.startswith("#") and first_command is None:
            first_command = number
    return Directives(values)


def _parse_options(body: str) -> list[tuple[str, str]]:
    options = []
    tokens = body.split()
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if token.startswith("--"):
            name, _, value = token[2:].partition("=")
            if not value and index + 1 < len(tokens) and not tokens[index + 1].startswith("-"):
                value, index = tokens[index + 1], index + 1
            options.append((name, value))
        elif token.startswith("-") and len(token) >= 2 and token[1] in _SHORT_OPTIONS:
            value = token[2:]
            if not value and index + 1 < len(tokens):
                value, index = tokens[index + 1], index + 1
            options.append((_SHORT_OPTIONS[token[1]], value))
        index += 1
    # --tasks-per-node is an alias sbatch accepts for --ntasks-per-node
    return [("ntasks-per-node" if name == "tasks-per-node" else name, value) for name, value in options]


def _check_output_folders(directives: Directives, text: str, submit_dir: Path | None,
                          findings: list[Finding]) -> None:
    for option in ("output", "error"):
        value = directives.get(option)
        if not value:
            continue
        folder = Path(value.strip("\"'")).parent
        if str(folder) in ("", ".") or "%" in str(folder) or "$" in str(folder):
            continue
        where = folder if folder.is_absolute() or submit_dir is None else Path(submit_dir) / folder
        if submit_dir is None and not folder.is_absolute():
            made_inside = re.search(rf"mkdir\s+(-p\s+)?[\"']?{re.escape(str(folder))}\b", text)
            if not made_inside:
                continue  # where sbatch will run is unknown: nothing to say
        if not where.is_dir():
            findings.append(Finding(
                "output-folder-missing", ERROR,
                f"--{option}={value} writes into {folder}/, which does not exist; SLURM opens this file before "
                "the script runs (a mkdir inside the script is too late) and the job fails at launch.",
                f"create {folder}/ before sbatch, or write the log into the submission directory.",
                directives.line(option)))


def _check_lightning(directives: Directives, text: str, findings: list[Finding]) -> None:
    if directives.get("ntasks") is not None:
        findings.append(Finding(
            "ntasks-with-lightning", ERROR,
            "--ntasks with a Lightning/NeMo job: Lightning refuses it ('use --ntasks-per-node instead').",
            "replace --ntasks=N by --ntasks-per-node=<GPUs per node>.", directives.line("ntasks")))
    if directives.get("gpus-per-task") is not None:
        findings.append(Finding(
            "gpus-per-task-with-lightning", ERROR,
            "--gpus-per-task with Lightning/NeMo: each task then sees one GPU while Lightning asks for all "
            "of them ('You requested gpu: [0, 1] But your machine only has: [0]').",
            "use --gpus-per-node=N with --ntasks-per-node=N.", directives.line("gpus-per-task")))
    overrides = {match.group(1): (match.group(2), text.count("\n", 0, match.start()) + 1)
                 for match in _OVERRIDE.finditer(text)}
    tasks = directives.get("ntasks-per-node")
    gpus = directives.get("gpus-per-node")
    devices = overrides.get("trainer.devices", (None, None))[0]
    numbers = {"--ntasks-per-node": _as_int(tasks), "--gpus-per-node": _as_int(gpus)}
    if devices is not None and not _refers_to_slurm_gpus(devices):
        numbers["trainer.devices"] = _as_int(devices)
    known = {name: value for name, value in numbers.items() if value is not None}
    if len(set(known.values())) > 1:
        shown = ", ".join(f"{name}={value}" for name, value in known.items())
        findings.append(Finding(
            "tasks-gpus-devices-mismatch", ERROR,
            f"{shown}: Lightning needs one task per GPU and trainer.devices equal to both.",
            "make --ntasks-per-node, --gpus-per-node and trainer.devices the same number.",
            directives.line("ntasks-per-node") or directives.line("gpus-per-node")))
    sizes = {key.rsplit(".", 1)[-1]: _as_int(value) for key, (value, _) in overrides.items()}
    tp = sizes.get("tensor_model_parallel_size") or 1
    ep = sizes.get("expert_model_parallel_size") or 1
    pp = sizes.get("pipeline_model_parallel_size") or 1
    nodes = _as_int(directives.get("nodes") or "1") or 1
    per_node = known.get("--gpus-per-node") or known.get("trainer.devices")
    peft_none = (overrides.get("peft", ("", 0))[0] == "none"
                 or re.search(r"peft_scheme\s*=\s*(['\"]none['\"]|None)", text) is not None)
    if per_node:
        total = per_node * nodes
        if total % (tp * ep * pp):
            findings.append(Finding(
                "parallel-sizes-mismatch", ERROR,
                f"TP x EP x PP = {tp} x {ep} x {pp} = {tp * ep * pp} does not fit the {total} GPUs of the job.",
                "request a multiple of TP x EP x PP GPUs (the rest is data parallel).",
                _override_line(overrides, "trainer.strategy.tensor_model_parallel_size")
                or directives.line("gpus-per-node")))
    if re.search(r"--factory\s+[\"']?mixtral", text) and "trainer.strategy.expert_model_parallel_size" not in overrides:
        findings.append(Finding(
            "mixtral-without-ep", ERROR,
            "a Mixtral (mixture-of-experts) run without trainer.strategy.expert_model_parallel_size: NeMo "
            "stops at start-up.", "add trainer.strategy.expert_model_parallel_size=<EP>.",
            _line_of(text, "--factory")))
    if (tp > 1 or pp > 1) and not peft_none:
        findings.append(Finding(
            "model-parallel-with-lora", ERROR,
            f"model parallel (TP={tp}, PP={pp}) with LoRA still on (the factory's default PEFT).",
            "use the recipe's full fine-tune (--factory 'llama31_8b(peft_scheme=None)') for a "
            "model-parallel run.",
            _override_line(overrides, "trainer.strategy.tensor_model_parallel_size")))
    if "nemo llm" in text:
        constraint = (directives.get("constraint") or "").lower()
        if "a100" not in constraint:
            findings.append(Finding(
                "nemo-needs-a100", ERROR,
                f"a NeMo job with constraint={constraint or 'none'}: the container's kernels need A100 and fail "
                "at start-up on V100.", "add #SBATCH --constraint=a100.",
                directives.line("constraint") or 1))


def _check_hybrid_shard(directives: Directives, text: str, findings: list[Finding]) -> None:
    match = re.search(r"hybrid_shard", _code_only(text), re.IGNORECASE)
    nodes = _as_int(directives.get("nodes") or "1")
    if match and nodes == 1:
        findings.append(Finding(
            "hybrid-shard-single-node", ERROR,
            "HYBRID_SHARD on one node: it shards inside a node and replicates across nodes, so here it is "
            "FULL_SHARD under another name and the comparison means nothing.",
            "request --nodes=2 or more, or use FULL_SHARD.", _line_of(text, match.group(0))))


def _check_deepspeed_offload(text: str, submit_dir: Path | None, findings: list[Finding]) -> None:
    for match in re.finditer(r"--deepspeed[= ]+[\"']?([^\s\"']+\.json)", _code_only(text)):
        config = _read_json(match.group(1), submit_dir)
        if not config:
            continue
        zero = config.get("zero_optimization") or {}
        offloaded = any((zero.get(key) or {}).get("device") in ("cpu", "nvme")
                        for key in ("offload_optimizer", "offload_param"))
        if offloaded and int(zero.get("stage", 0)) == 0:
            findings.append(Finding(
                "offload-with-zero0", ERROR,
                f"{match.group(1)} offloads to CPU at ZeRO stage 0, which partitions nothing to offload.",
                "use a stage 1-3 config with offload, or drop the offload block.",
                _line_of(text, match.group(1))))


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


def _check_killed_pids(text: str, findings: list[Finding]) -> None:
    for scope_text, offset in _shell_scopes(text):
        assigned = {match.group(1) for match in _ASSIGNMENT.finditer(scope_text)}
        assigned |= set(re.findall(r"\bread\s+(?:-\w+\s+)*([A-Za-z_]\w*)", scope_text))
        assigned |= set(re.findall(r"\bfor\s+([A-Za-z_]\w*)\s+in\b", scope_text))
        for match in _KILL.finditer(scope_text):
            name = match.group(2)
            if name not in assigned:
                line = text.count("\n", 0, offset + match.start()) + 1
                findings.append(Finding(
                    "kill-unset-pid", ERROR,
                    f"kill ${name}: this shell never set {name}; it was set (if anywhere) in another shell, e.g. "
                    "inside `bash -c` on another node, so the process is never stopped.",
                    f"stop a background process in the same shell that started it: {name}=$! right after it.",
                    line))


def _shell_scopes(text: str) -> list[tuple[str, int]]:
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


def _check_fixed_port(text: str, findings: list[Finding]) -> None:
    match = _FIXED_PORT.search(_code_only(text))
    if match:
        findings.append(Finding(
            "fixed-rendezvous-port", WARNING,
            "rendezvous on the fixed port 29500: a second job on the same node fails with 'address in use'.",
            "pick a free port in the job (bind port 0 in Python) or use torchrun --standalone.",
            _line_of(text, match.group(0))))


def _code_only(text: str) -> str:
    """The script without full-line comments (so explanations do not trip the rules)."""
    return "\n".join("" if line.lstrip().startswith("#") else line for line in text.splitlines())


def _line_of(text: str, needle: str) -> int | None:
    for number, line in enumerate(text.splitlines(), start=1):
        if needle in line and not line.lstrip().startswith("#"):
            return number
    return None


def _override_line(overrides: dict, key: str) -> int | None:
    found = overrides.get(key)
    return found[1] if found else None


def _as_int(value: str | None) -> int | None:
    if value is None:
        return None
    value = value.strip("\"'")
    return int(value) if value.isdigit() else None


def _refers_to_slurm_gpus(value: str) -> bool:
    return bool(re.fullmatch(r"\$\{?SLURM_(GPUS_PER_NODE|NTASKS_PER_NODE|GPUS_ON_NODE)\}?", value.strip("\"'")))


def errors_in(findings: Iterable[Finding]) -> list[Finding]:
    return [finding for finding in findings if finding.is_error]
