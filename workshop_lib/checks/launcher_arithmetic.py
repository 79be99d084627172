"""Linter rules on the launchers' own arithmetic, which must agree with the request when the GPU count changes:
DeepSpeed's batch sizes (train_batch_size = micro batch x gradient accumulation x world size, and the HF
Trainer's arguments against the config) and Megatron's global batch in NeMo (a multiple of micro batch x data
parallel size). Accelerate's config file is read where the workers are counted (``launches``).

Each rule's docstring names the document and version it rests on; the tests run the launcher's own check
(DeepSpeed's DeepSpeedConfig, transformers' HfTrainerDeepSpeedConfig) on the same numbers."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

from workshop_lib.checks.findings import ERROR, Finding
from workshop_lib.checks.launches import _option, launches_of, workers_per_node
from workshop_lib.checks.layout import read_json_config
from workshop_lib.checks.nemo_command import STRATEGY, nemo_overrides
from workshop_lib.checks.script import Script

_HF_DEEPSPEED = re.compile(r"--deepspeed(?:=|\s+)[\"']?([^\s\"']+\.json)")
_DEEPSPEED_CONFIG = re.compile(r"--deepspeed[_-]config(?:=|\s+)[\"']?([^\s\"']+\.json)")
# TrainingArguments' defaults (transformers 5.23): what the Trainer uses when the command line says nothing.
HF_DEFAULT_MICRO_BATCH = 8
HF_DEFAULT_ACCUMULATION = 1


def world_size(script: Script) -> int | None:
    """Processes over the whole job: the launcher's workers per node (or one per GPU) x nodes."""
    job = launches_of(script)
    for launch in job.launches:
        if launch.kind == "nemo":
            continue
        workers = workers_per_node(script, launch)
        per_node = workers[0] if workers else job.gpus_per_node
        return per_node * job.nodes if per_node and job.nodes else None
    return job.gpus_per_node * job.nodes if job.gpus_per_node and job.nodes else None


@dataclass(frozen=True)
class Batches:
    """DeepSpeed's three batch numbers, as the config writes them (None: absent or "auto")."""

    train: int | None
    micro: int | None
    accumulation: int | None

    @classmethod
    def of(cls, config: dict) -> "Batches":
        def number(key: str) -> int | None:
            value = config.get(key)
            return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        return cls(number("train_batch_size"), number("train_micro_batch_size_per_gpu"),
                   number("gradient_accumulation_steps"))


def deepspeed_batch_problem(batches: Batches, world: int) -> str | None:
    """Why DeepSpeed refuses these batch numbers on ``world`` processes, or None. The derivation of the missing
    numbers and the assertion are DeepSpeed's (deepspeed 0.19.8, runtime/config.py,
    DeepSpeedConfig._set_batch_related_parameters and _batch_assertion)."""
    train, micro, accumulation = batches.train, batches.micro, batches.accumulation
    if train is None:
        return None  # DeepSpeed computes it from the others: nothing can disagree
    if micro is not None and accumulation is None:
        accumulation = train // micro // world
    elif micro is None and accumulation is not None:
        micro = train // world // accumulation
    elif micro is None and accumulation is None:
        micro, accumulation = train // world, 1
    if micro <= 0 or accumulation <= 0:
        return (f"train_batch_size={train} is smaller than one sample per process on {world} processes "
                f"(DeepSpeed derives {'a micro batch' if micro <= 0 else 'gradient accumulation'} of 0 and stops)")
    if train != micro * accumulation * world:
        return (f"train_batch_size={train} but micro batch x accumulation x world size = {micro} x {accumulation} x "
                f"{world} = {micro * accumulation * world} (DeepSpeed asserts 'train_batch_size is not equal to "
                "micro_batch_per_gpu * gradient_acc_step * world_size')")
    return None


def _deepspeed_batch_size(script: Script) -> Iterable[Finding]:
    """DeepSpeed config JSON docs (deepspeed 0.19.8, "Batch Size Related Parameters": train_batch_size = micro
    batch per GPU x gradient accumulation x number of GPUs) and transformers 5.23 integrations/deepspeed.py
    (HfTrainerDeepSpeedConfig.trainer_config_process: a number in the config that disagrees with
    TrainingArguments is refused: "Please correct the following DeepSpeed config values that mismatch
    TrainingArguments values"). A train_batch_size written for one GPU count fails on another."""
    world = world_size(script)
    if not world:
        return
    code = script.code
    for pattern, trainer in ((_HF_DEEPSPEED, True), (_DEEPSPEED_CONFIG, False)):
        for match in pattern.finditer(code):
            config = read_json_config(match.group(1), script.submit_dir)
            if not config:
                continue
            batches = Batches.of(config)
            line = script.line_of(match.group(1))
            # the HF Trainer's arguments (and defaults) count only where the script passes them
            trainer = trainer and _option(code, "--per_device_train_batch_size", "--gradient_accumulation_steps")
            problem = (_trainer_mismatch(script, batches, world) if trainer else None) \
                or deepspeed_batch_problem(batches, world)
            if problem is None:
                continue
            yield Finding(
                "deepspeed-batch-size-mismatch", ERROR,
                f"{match.group(1)} on {world} processes: {problem}, so the job stops at start-up.",
                'set the batch numbers to "auto" in the config (the HF Trainer fills them from its arguments), or '
                f"make train_batch_size = micro batch x gradient accumulation x {world}.", line)


def _trainer_mismatch(script: Script, batches: Batches, world: int) -> str | None:
    """The HF Trainer's view: its arguments (or their defaults) against every number the config writes."""
    micro_arg = _option(script.code, "--per_device_train_batch_size")
    accumulation_arg = _option(script.code, "--gradient_accumulation_steps")
    micro = script.number(micro_arg[0]) if micro_arg else HF_DEFAULT_MICRO_BATCH
    accumulation = script.number(accumulation_arg[0]) if accumulation_arg else HF_DEFAULT_ACCUMULATION
    if micro is None or accumulation is None:
        return None  # a number known only at run time
    found = []
    if batches.micro is not None and batches.micro != micro:
        found.append(f"train_micro_batch_size_per_gpu={batches.micro} vs the Trainer's per_device_train_batch_size="
                     f"{micro}")
    if batches.accumulation is not None and batches.accumulation != accumulation:
        found.append(f"gradient_accumulation_steps={batches.accumulation} vs the Trainer's {accumulation}")
    if batches.train is not None and batches.train != micro * accumulation * world:
        found.append(f"train_batch_size={batches.train} vs the Trainer's {micro} x {accumulation} x {world} GPUs = "
                     f"{micro * accumulation * world}")
    if not found:
        return None
    return "the config disagrees with the Trainer (" + "; ".join(found) + "), and the Trainer refuses it"


def _nemo_global_batch(script: Script) -> Iterable[Finding]:
    """Megatron-core's microbatch calculator (megatron/core/num_microbatches_calculator.py, as NeMo 2's `nemo llm
    finetune` runs it): the global batch must be a multiple of micro batch x data-parallel size ("global batch size
    ... is not divisible by micro batch size ... times data parallel size"); data parallel = GPUs / (TP x PP x CP)."""
    command = nemo_overrides(script.code)
    written = command.value("data.global_batch_size")
    if written is None or "nemo llm" not in script.code:
        return
    job = launches_of(script)
    per_node = job.gpus_per_node or script.number(command.value("trainer.devices"))
    global_batch = script.number(written)
    micro = script.number(command.value("data.micro_batch_size") or "1")
    sizes = [script.number(command.value(f"{STRATEGY}{name}") or "1") for name in (
        "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size")]
    if None in (per_node, job.nodes, global_batch, micro) or None in sizes:
        return
    gpus = per_node * job.nodes
    model_parallel = sizes[0] * sizes[1] * sizes[2]
    if gpus % model_parallel:
        return  # parallel-sizes-mismatch says why
    data_parallel = gpus // model_parallel
    per_step = micro * data_parallel
    if global_batch % per_step == 0:
        return
    yield Finding(
        "nemo-global-batch-mismatch", ERROR,
        f"data.global_batch_size={global_batch} is not a multiple of micro batch x data parallel = {micro} x "
        f"{data_parallel} (data parallel = {gpus} GPUs / TP x PP x CP {model_parallel}): Megatron stops at start-up.",
        f"use a global batch that {per_step} divides (e.g. {per_step * max(1, global_batch // per_step)}), or change "
        "the GPU count or the micro batch.", command.line("data.global_batch_size"))


RULES = [_deepspeed_batch_size, _nemo_global_batch]
