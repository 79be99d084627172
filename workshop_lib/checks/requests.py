"""Linter rules on what a hand-written job asks SLURM for: its time limit, its host memory for the ranks
that load the model, the paths it uses after a `cd`, and (for NeMo) whether the layout fits the GPUs,
by the estimate the workshop's own experiments are checked with (``checks.fit``)."""

from __future__ import annotations

import getpass
import math
import re
from functools import lru_cache
from pathlib import Path
from typing import Iterable

from workshop_lib.checks.findings import ERROR, NOTE, Finding
from workshop_lib.checks.fit import fit_findings
from workshop_lib.checks.launches import launches_of, workers_per_node
from workshop_lib.checks.layout import script_layout
from workshop_lib.checks.pitfalls import NEMO_MIXTRAL_DEFAULT_EP
from workshop_lib.checks.script import Script
from workshop_lib.core.vocabulary import NEMO
from workshop_lib.estimate.shapes import parameter_count
from workshop_lib.experiments import Experiment
from workshop_lib.sites.profiles import load_profile

# Models whose size the estimate knows, as people write them (hub ids, NeMo factories): compared with
# separators and case dropped, so meta-llama/Llama-3.1-8B, llama31_8b and llama-3.1-8b are one name.
_ESTIMATED_MODELS = ("llama-3.1-8b", "mixtral-8x7b", "bloom-560m")


def _squash(text: str) -> str:
    return re.sub(r"[-_.\s]", "", text.lower())


def model_in_script(script: Script) -> str | None:
    """The estimated model the script trains (by name, in its code), or None."""
    code = _squash(script.code)
    found = [name for name in _ESTIMATED_MODELS if _squash(name) in code]
    return found[0] if len(found) == 1 else None


# ---------------------------------------------------------------------------------------------
# A script saved with Windows line breaks
# ---------------------------------------------------------------------------------------------
def _dos_line_breaks(script: Script) -> Iterable[Finding]:
    if "\r\n" in script.text:
        yield Finding(
            "dos-line-breaks", ERROR,
            f"the script has Windows line breaks (CR LF, {script.text.count(chr(13) + chr(10))} lines): sbatch "
            "refuses it ('Batch script contains DOS line breaks'), and bash would read `train.py\\r`.",
            "convert it: dos2unix SCRIPT (or sed -i 's/\\r$//' SCRIPT), and save with Unix line endings.",
            script.text.count("\n", 0, script.text.index("\r\n")) + 1)


# ---------------------------------------------------------------------------------------------
# --time
# ---------------------------------------------------------------------------------------------
def _time_limit(script: Script) -> Iterable[Finding]:
    value = script.header.get("time")
    match = re.fullmatch(r"(\d+):(\d+)", value or "")
    if not match or int(match.group(1)) >= 10:
        return  # `30:00` is half an hour, as it looks; `04:00:00`, `1-00:00` and `120` say what they mean
    minutes, seconds = int(match.group(1)), int(match.group(2))
    yield Finding(
        "time-looks-like-hours", ERROR,
        f"--time={value} is minutes:seconds to SLURM ({minutes} min {seconds} s), not {minutes} h {seconds} min: "
        f"the job is killed after {minutes * 60 + seconds} seconds, before training gets far.",
        f"write hours:minutes:seconds: --time={minutes}:{seconds:02d}:00 (or minutes alone: --time={minutes * 60 + seconds}).",
        script.header.line("time"))


# ---------------------------------------------------------------------------------------------
# --mem and the ranks that each load the model in CPU memory
# ---------------------------------------------------------------------------------------------
_MEM = re.compile(r"^(\d+(?:\.\d+)?)([KMGT]?)B?$", re.IGNORECASE)
_MEM_GIB = {"K": 1 / 1024 ** 2, "M": 1 / 1024, "": 1 / 1024, "G": 1, "T": 1024}  # sbatch's default unit is MB


def mem_gib(value: str | None) -> float | None:
    match = _MEM.match((value or "").strip())
    return float(match.group(1)) * _MEM_GIB[match.group(2).upper()] if match else None


def _ranks_per_node(script: Script) -> int | None:
    """Processes per node that each load the model: the launcher's workers, else srun's tasks."""
    job = launches_of(script)
    for launch in job.launches:
        if launch.kind == "nemo":
            continue
        workers = workers_per_node(script, launch)
        if workers:
            return workers[0]
        return job.gpus_per_node  # --nproc_per_node=gpu, or a launcher's default: one per GPU
    if re.search(r"(?<![\w./-])srun\b[^\n]*\bpython", script.code):
        return job.tasks_per_node()
    return None


def _node_memory(script: Script) -> tuple[float, str, int | None] | None:
    """(GiB per node, the directive as written, its line) from --mem, --mem-per-gpu or --mem-per-cpu."""
    header, job = script.header, launches_of(script)
    if header.get("mem"):
        gib = mem_gib(header.get("mem"))
        return (gib, f"--mem={header.get('mem')}", header.line("mem")) if gib is not None else None
    per_gpu, gpus = mem_gib(header.get("mem-per-gpu")), job.gpus_per_node
    if per_gpu and gpus:
        return per_gpu * gpus, f"--mem-per-gpu={header.get('mem-per-gpu')} x {gpus} GPUs", header.line("mem-per-gpu")
    per_cpu, tasks = mem_gib(header.get("mem-per-cpu")), job.tasks_per_node()
    cpus = script.number(header.get("cpus-per-task") or "1")
    if per_cpu and tasks and cpus:
        return (per_cpu * cpus * tasks, f"--mem-per-cpu={header.get('mem-per-cpu')} x {cpus * tasks} CPUs",
                header.line("mem-per-cpu"))
    return None


def _host_memory(script: Script) -> Iterable[Finding]:
    node = _node_memory(script)
    mem = node[0] if node else None
    if not mem or "nemo llm" in script.code or "--random-init" in script.code:
        return  # --mem=0 is the whole node; NeMo loads its distributed checkpoint shard by shard; the
        # workshop's stand-in with --random-init builds the model on the meta device, never in CPU memory
    model = model_in_script(script)
    ranks = _ranks_per_node(script)
    if model is None or not ranks or ranks < 2:
        return
    per_rank = parameter_count(model) * 2 / 1024 ** 3  # 16-bit weights: the least each rank holds while loading
    need = per_rank * ranks
    if need <= mem:
        return
    yield Finding(
        "host-memory-too-small", ERROR,
        f"{node[1]} per node for {ranks} ranks that each load {model} "
        f"({per_rank:.1f} GiB in 16-bit) into CPU memory before moving it to their GPU: at least {need:.0f} GiB, "
        "so the node runs out of memory while loading and SLURM kills the job (OUT_OF_MEMORY).",
        f"ask for --mem={math.ceil(need * 1.25)}G or more (or --mem=0 for the whole node's memory).",
        node[2])


# ---------------------------------------------------------------------------------------------
# Relative paths after `cd`
# ---------------------------------------------------------------------------------------------
_CD = re.compile(r"^\s*cd\s+(\"[^\"]*\"|'[^']*'|[^\s;&|]+)")
_RELATIVE_FILE = re.compile(r"(?<![\w/$.~-])((?:\./)?[\w.-]+(?:/[\w.-]+)*\.(?:py|sh|json|ya?ml|txt|csv|jsonl))\b")
_SUBMIT_DIR = ("$SLURM_SUBMIT_DIR", "${SLURM_SUBMIT_DIR}", ".", "-", "$OLDPWD")


def _relative_after_cd(script: Script) -> Iterable[Finding]:
    submit = script.submit_dir
    if submit is None:
        return  # where sbatch runs is unknown: nothing to compare with
    target: str | None = None
    for number, line in enumerate(script.code.split("\n"), start=1):
        if match := _CD.match(line):
            written = match.group(1).strip("\"'")
            target = None if written in _SUBMIT_DIR else written
            continue
        if target is None:
            continue
        where = _folder(script, target, Path(submit))
        relative = [path for path in _RELATIVE_FILE.findall(line) if (Path(submit) / path).is_file()]
        if relative and (where is None or not where.is_dir()):
            yield Finding(  # a folder known only at run time, or not on this machine
                "relative-path-after-cd", NOTE,
                f"{relative[0]} is relative and is looked up in the folder of `cd {target}`, which cannot be "
                + ("known before the job runs" if where is None else "seen from this machine")
                + "; it is next to the job script, so it is found there only if that folder holds a copy.",
                f"use \"$SLURM_SUBMIT_DIR/{relative[0].removeprefix('./')}\" to be sure.", number)
            target = None  # said once per cd
            continue
        if where is None:
            continue
        for path in _RELATIVE_FILE.findall(line):
            if (Path(submit) / path).is_file() and not (where / path).exists():
                yield Finding(
                    "relative-path-after-cd", ERROR,
                    f"{path} is relative, and after `cd {target}` it is looked up in {target}/, where it is not "
                    "(it is next to the job script): the command fails with 'No such file or directory'.",
                    f"use \"$SLURM_SUBMIT_DIR/{path.removeprefix('./')}\", or run it before the cd.", number)


def _folder(script: Script, target: str, submit: Path) -> Path | None:
    """The folder a `cd` goes to, with what the shell would expand here ($USER, $HOME, ~, $SLURM_SUBMIT_DIR, and
    a variable the script assigns once); None when a part is known only at run time."""
    known = {"USER": getpass.getuser(), "HOME": str(Path.home()), "SLURM_SUBMIT_DIR": str(submit)}

    def expand(text: str, depth: int = 0) -> str | None:
        def value(match: re.Match) -> str:
            name = match.group(1)
            if name in known:
                return known[name]
            values = re.findall(rf"^\s*(?:export\s+)?{name}=[\"']?([^\"'\s`]+)[\"']?\s*$", script.code, re.M)
            found = expand(values[0], depth + 1) if len(values) == 1 and depth < 3 else None
            return found if found is not None else "\0"
        expanded = re.sub(r"\$\{?([A-Za-z_]\w*)\}?", value, text)
        return None if "\0" in expanded or "$" in expanded or "`" in expanded else expanded

    target = known["HOME"] + target[1:] if target.startswith("~") else target
    expanded = expand(target)
    if expanded is None:
        return None
    folder = Path(expanded)
    return folder if folder.is_absolute() else submit / folder


# ---------------------------------------------------------------------------------------------
# NeMo: does the layout fit the GPUs (the estimate the experiments are checked with)
# ---------------------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def _site():
    """The workshop's site profile: its NeMo factory names and its GPUs' memory."""
    return load_profile("ibex")


def _nemo_fit(script: Script) -> Iterable[Finding]:
    layout = script_layout(script)  # the one reading of a script's layout, the pitfalls' too
    if not layout.model or not layout.nemo_container:
        return
    site = _site()
    models = {name: model for model, name in site.nemo.factories.items()}
    model = models.get(layout.model)
    if model is None or site.gpu_memory_gib is None:
        return
    if layout.context_parallel != 1 or "context_parallel" in layout.unknown:
        return  # the estimate has no context parallelism: say nothing rather than guess
    if layout.unknown & {"tensor_parallel", "pipeline_parallel", "num_layers"} or layout.num_layers == 0 \
            or not layout.gpus_per_node or not layout.nodes:
        return  # a size or depth known only at run time
    tensor, pipeline, expert = layout.tensor_parallel, layout.pipeline_parallel, layout.expert_parallel
    if expert is None and "mixtral" in model:
        expert = NEMO_MIXTRAL_DEFAULT_EP  # the recipe's EP (mixtral-without-ep says when it cannot be)
    if (layout.gpus % (tensor * pipeline * (expert or 1))
            or (layout.sequence_parallel and tensor < 2)
            or (layout.lora and (tensor > 1 or pipeline > 1))):
        return  # a layout NeMo refuses anyway: the layout rules say why, the estimate would not add to it
    experiment = Experiment(id=f"this {model} job", chapter=0, group="script", title="", engine=NEMO, model=model,
                            nodes=layout.nodes, gpus_per_node=layout.gpus_per_node,
                            peft="lora" if layout.lora else "none", tensor_parallel=tensor, pipeline_parallel=pipeline,
                            expert_parallel=expert, sequence_parallel=layout.sequence_parallel,
                            num_layers=layout.num_layers)
    for finding in fit_findings(experiment, site):
        yield Finding(finding.rule, finding.severity,
                      finding.message.replace("the profile's", f"{site.name}'s"), finding.fix,
                      layout.line("tensor_parallel", "model"))


RULES = [_dos_line_breaks, _time_limit, _host_memory, _relative_after_cd, _nemo_fit]
