"""Readable text for an estimate, and the bridge from a workshop Experiment to a TrainingSetup."""

from __future__ import annotations

from workshop_lib.estimate.memory import MemoryEstimate, TrainingSetup

_ENGINE_NAMES = {"ddp": "PyTorch (HF Trainer, DDP when > 1 GPU)", "deepspeed": "DeepSpeed", "fsdp": "FSDP",
                 "megatron": "NeMo / Megatron"}


def describe_setup(setup: TrainingSetup) -> str:
    """One line: GPUs, engine and its knobs, precision, batch."""
    engine = setup.resolved_engine
    parts = [f"{setup.gpus} GPU{'s' if setup.gpus > 1 else ''} on {setup.nodes} node{'s' if setup.nodes > 1 else ''}",
             _ENGINE_NAMES[engine]]
    if setup.zero_stage is not None:
        parts.append(f"ZeRO-{setup.zero_stage}")
    if setup.fsdp:
        parts.append(setup.fsdp)
    if setup.offload != "none":
        parts.append(f"{setup.offload} offload")
    if setup.tensor_parallel * setup.expert_parallel * setup.pipeline_parallel > 1:
        parts.append(f"TP={setup.tensor_parallel} PP={setup.pipeline_parallel} EP={setup.expert_parallel}"
                     + (" SP" if setup.sequence_parallel else "")
                     + f" (DP={setup.data_parallel} for attention, {setup.expert_data_parallel} for experts)")
    if setup.lora_rank:
        parts.append(f"LoRA r={setup.lora_rank}")
    if setup.recompute:
        parts.append("activation recomputation")
    parts.append(f"{setup.precision}, batch {setup.batch} x {setup.seq_len} tokens per GPU")
    return ", ".join(parts)


def format_estimate(estimate: MemoryEstimate) -> str:
    """The breakdown table (GiB per GPU, GiB CPU per process), the model-state formula and the assumptions."""
    trainable = estimate.trainable_parameters / estimate.total_parameters
    lines = [f"{estimate.model}: {estimate.total_parameters:,} parameters ({estimate.total_parameters / 1e6:,.1f} M), "
             f"{estimate.trainable_parameters:,} trainable ({trainable:.2%})",
             describe_setup(estimate.setup), "",
             f"{'component':<24}{'GiB per GPU':>12}{'GiB CPU':>10}",
             "-" * 46]
    for name, gpu, cpu in estimate.rows():
        if name == "total":
            lines.append("-" * 46)
        lines.append(f"{name:<24}{gpu:>12.2f}{cpu:>10.2f}")
    if estimate.cpu_total:
        lines.append(f"CPU per node ({estimate.setup.gpus_per_node} processes): "
                     f"{estimate.cpu_per_node / 1024**3:.2f} GiB")
    lines += ["", f"model states per GPU = {estimate.formula}",
              "activations per layer: Korthikanti et al. 2022, s*b*h*(34 + 5*a*s/h) bytes in 16-bit with dropout, "
              "adapted per tensor; logits 12*s*b*V bytes",
              "assumes: " + "; ".join(estimate.assumptions)]
    return "\n".join(lines)


# What NeMo 2.4.1's recipes put LoRA on (book/reference/nemo/lora_*.yaml, as NeMo resolved them):
# llama31_8b leaves target_modules at LoRA's default, all four linears; mixtral_8x7b names two.
NEMO_RECIPE_LORA_TARGETS = {"llama-3.1-8b": ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"),
                            "mixtral-8x7b": ("linear_qkv", "linear_proj")}


def setup_from_experiment(experiment, seq_len: int = 512, auto_precision: str = "bf16") -> TrainingSetup:
    """The TrainingSetup of a workshop Experiment (duck-typed; no import of workshop_lib.experiments).

    Experiment.offload is one flag: it means parameters at ZeRO stage 3 and with FSDP, optimizer otherwise.
    """
    offload = "none"
    if experiment.offload:
        offload = "parameters" if experiment.fsdp or experiment.zero_stage == 3 else "optimizer"
    gpt = getattr(experiment, "gpt", None)
    return TrainingSetup(
        gpus=experiment.gpus, nodes=experiment.nodes,
        precision=auto_precision if experiment.precision == "auto" else experiment.precision,
        zero_stage=experiment.zero_stage, fsdp=experiment.fsdp, offload=offload,
        batch=experiment.per_device_batch or 1, seq_len=gpt.seq_len if gpt else seq_len,
        lora_rank=(experiment.lora_rank or 32) if experiment.peft == "lora" else None,
        lora_modules=NEMO_RECIPE_LORA_TARGETS.get(experiment.model) if experiment.engine == "nemo"
        and experiment.peft == "lora" else None,
        tensor_parallel=experiment.tensor_parallel, expert_parallel=experiment.expert_parallel or 1,
        sequence_parallel=experiment.sequence_parallel,
        engine="megatron" if experiment.engine == "nemo" else "auto")
