"""One Layout value: how a job spreads over nodes and GPUs and how it trains the model, whether an Experiment
(with the profile that realises it) declares it or a job script writes it.

The pitfalls (``checks.pitfalls``) read only this value, so an experiment and a hand-written script are judged
by one rule. From a script, each field carries the line it came from, and a size written as a value known only
at run time is listed in ``unknown`` (the checks then say nothing rather than guess).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from workshop_lib.checks.nemo_command import STRATEGY, nemo_overrides
from workshop_lib.checks.script import Script
from workshop_lib.core.paths import DS_CONFIGS_DIR
from workshop_lib.core.vocabulary import NEMO

if TYPE_CHECKING:  # imported for annotations only: profiles imports experiments, not the other way
    from workshop_lib.experiments import Experiment
    from workshop_lib.sites.profiles import Profile

# Megatron's parallel sizes, by the NeMo override that sets each in a script.
PARALLEL_SIZES = {"tensor_parallel": f"{STRATEGY}tensor_model_parallel_size",
                  "expert_parallel": f"{STRATEGY}expert_model_parallel_size",
                  "pipeline_parallel": f"{STRATEGY}pipeline_model_parallel_size",
                  "context_parallel": f"{STRATEGY}context_parallel_size"}
_PEFT_SCHEME_NONE = re.compile(r"peft_scheme\s*=\s*(['\"]none['\"]|None)")
_FACTORY = re.compile(r"--factory\s+[\"']?([A-Za-z0-9_]+)")
_DEEPSPEED_CONFIG = re.compile(r"--deepspeed[= ]+[\"']?([^\s\"']+\.json)")


@dataclass(frozen=True)
class Layout:
    """A job's nodes, GPUs, parallel sizes and training method. None where it is not known."""

    nodes: int | None = 1
    gpus_per_node: int | None = None
    tensor_parallel: int = 1
    expert_parallel: int | None = None  # None: not set (NeMo's Mixtral recipe then picks its own)
    pipeline_parallel: int = 1
    context_parallel: int = 1
    sequence_parallel: bool = False
    lora: bool = False
    zero_stage: int | None = None
    offload: bool = False
    deepspeed_config: str | None = None  # the DeepSpeed config file a script names
    fsdp: str | None = None
    constraint: str | None = None
    nemo_container: bool = False  # NeMo runs from its container (whose kernels need A100)
    model: str | None = None  # the model, or the NeMo factory a script names
    num_layers: int | None = None  # fewer layers than the model has (a reduced depth); None: the model's own
    unknown: frozenset[str] = frozenset()  # fields a script sets to a value known only at run time
    lines: dict[str, int | None] = field(default_factory=dict)  # the script line each field came from

    @property
    def gpus(self) -> int | None:
        return self.nodes * self.gpus_per_node if self.nodes and self.gpus_per_node else None

    def line(self, *names: str) -> int | None:
        """The line of the first of ``names`` that a script wrote (None for an experiment)."""
        return next((self.lines[name] for name in names if self.lines.get(name)), None)


def experiment_layout(experiment: "Experiment", profile: "Profile | None" = None) -> Layout:
    """An experiment as ``profile`` realises it (no profile: the experiment alone)."""
    container = (experiment.engine == NEMO and profile is not None and profile.nemo.enabled
                 and bool(profile.nemo.image))
    return Layout(nodes=experiment.nodes, gpus_per_node=experiment.gpus_per_node, num_layers=experiment.num_layers,
                  tensor_parallel=experiment.tensor_parallel, expert_parallel=experiment.expert_parallel,
                  pipeline_parallel=experiment.pipeline_parallel, sequence_parallel=bool(experiment.sequence_parallel),
                  lora=experiment.peft == "lora", zero_stage=experiment.zero_stage, offload=bool(experiment.offload),
                  fsdp=experiment.fsdp,
                  constraint=profile.scheduler.constraint_for(experiment.gpus_per_node) if profile is not None else None,
                  nemo_container=container, model=experiment.model)


def script_layout(script: Script) -> Layout:
    """A job script's layout: its #SBATCH request and the Lightning/NeMo overrides it writes. GPUs per node
    come from the request, else from trainer.devices; LoRA is on unless the script turns PEFT off (NeMo's
    finetune recipes train LoRA by default); HYBRID_SHARD is the one FSDP strategy read (the one a pitfall is
    about). DeepSpeed settings come per config file: ``deepspeed_layouts``."""
    from workshop_lib.checks.launches import launches_of  # here, not at the top: the calculator ships this module

    header, code, job = script.header, script.code, launches_of(script)
    overrides = nemo_overrides(code)
    sizes: dict[str, int] = {}
    unknown = set()
    lines: dict[str, int | None] = {}
    for name, key in PARALLEL_SIZES.items():
        written = overrides.value(key)
        if written is None:
            continue
        number = script.number(written)
        if number is None:
            unknown.add(name)
        else:
            sizes[name] = number
        lines[name] = overrides.line(key)
    layers = overrides.value("model.config.num_layers")
    num_layers = script.number(layers) if layers is not None else None
    if layers is not None and num_layers is None:
        unknown.add("num_layers")
    sequence_parallel = overrides.value(f"{STRATEGY}sequence_parallel")
    lines["sequence_parallel"] = overrides.line(f"{STRATEGY}sequence_parallel")
    factory = _FACTORY.search(code)
    lines["model"] = script.line_of("--factory")
    hybrid = re.search(r"hybrid_shard", code, re.IGNORECASE)
    lines["fsdp"] = script.line_of(hybrid.group(0)) if hybrid else None
    lines["gpus_per_node"] = header.line("gpus-per-node")
    lines["constraint"] = header.line("constraint") or 1  # no constraint: the script's top is where it goes
    # The GPUs per node as the launch rules read the request (--gpus-per-node, --gres, --gpus over the nodes,
    # --gpus-per-task x tasks), else Lightning's trainer.devices.
    return Layout(nodes=job.nodes, gpus_per_node=job.gpus_per_node or script.number(overrides.value("trainer.devices")),
                  tensor_parallel=sizes.get("tensor_parallel", 1), expert_parallel=sizes.get("expert_parallel"),
                  pipeline_parallel=sizes.get("pipeline_parallel", 1),
                  context_parallel=sizes.get("context_parallel", 1),
                  sequence_parallel=(sequence_parallel or "").lower() in ("true", "1"),
                  lora=not (overrides.value("peft") == "none" or _PEFT_SCHEME_NONE.search(code)),
                  fsdp="HYBRID_SHARD" if hybrid else None,
                  # a typed GPU request (--gres=gpu:a100:8) picks the model as surely as a constraint does
                  constraint=header.get("constraint") or header.gpu_type,
                  nemo_container="nemo llm" in code, model=factory.group(1) if factory else None, num_layers=num_layers,
                  unknown=frozenset(unknown), lines=lines)


def deepspeed_layouts(script: Script) -> Iterator[Layout]:
    """The script's layout once per DeepSpeed config it names (`--deepspeed cfg.json`) that can be read:
    its ZeRO stage and whether it offloads (to CPU or NVMe)."""
    base = script_layout(script)
    for match in _DEEPSPEED_CONFIG.finditer(script.code):
        config = read_json_config(match.group(1), script.submit_dir)
        if not config:
            continue
        zero = config.get("zero_optimization") or {}
        offloaded = any((zero.get(key) or {}).get("device") in ("cpu", "nvme")
                        for key in ("offload_optimizer", "offload_param"))
        yield replace(base, zero_stage=int(zero.get("stage", 0)), offload=offloaded, deepspeed_config=match.group(1),
                      lines={**base.lines, "deepspeed_config": script.line_of(match.group(1))})


def read_json_config(name: str, submit_dir: Path | None) -> dict | None:
    """A config by its name as written: next to the script, as given, or among the workshop's configs."""
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
