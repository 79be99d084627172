"""The seeds' pitfalls, each stated once: a function of a Layout that returns the Finding, or None. The three
the estimator refuses too take their words from ``estimate.pitfall_text``, which it raises with.

The experiment rules (``checks.experiment_rules``) and the script linter (``checks.script_rules``) build a
Layout their own way (``checks.layout``) and ask the same functions, so a pitfall reads the same, and is
judged the same, whether an experiment or a hand-written script has it.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator

from workshop_lib.checks.findings import ERROR, Finding
from workshop_lib.checks.layout import Layout
from workshop_lib.checks.nemo_command import STRATEGY
from workshop_lib.estimate import pitfall_text
from workshop_lib.estimate.pitfall_text import PitfallText

Pitfall = Callable[[Layout], "Finding | None"]
# NeMo's Mixtral 8x7B recipe sets expert_model_parallel_size = 8 when the command does not.
NEMO_MIXTRAL_DEFAULT_EP = 8


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


def _finding(text: PitfallText, line: int | None) -> Finding:
    return Finding(text.rule, ERROR, text.message, text.fix, line)


def parallel_sizes_mismatch(layout: Layout) -> Finding | None:
    """Megatron's sizes must divide the GPUs (the words: ``estimate.pitfall_text``, the estimator's too)."""
    if not layout.gpus:
        return None
    text = pitfall_text.parallel_sizes_mismatch(layout.tensor_parallel, layout.expert_parallel or 1,
                                                layout.pipeline_parallel, layout.context_parallel,
                                                layout.gpus_per_node, layout.nodes)
    return _finding(text, layout.line("tensor_parallel", "context_parallel", "gpus_per_node")) if text else None


def mixtral_without_ep(layout: Layout) -> Finding | None:
    if not layout.model or "mixtral" not in layout.model or layout.expert_parallel is not None or not layout.gpus:
        return None
    problem = mixtral_default_ep_problem(layout.gpus, layout.tensor_parallel, layout.pipeline_parallel)
    if problem is None:
        return None
    return Finding(
        "mixtral-without-ep", ERROR, f"{layout.model}: {problem}.",
        f"set the expert-parallel size ({STRATEGY}expert_model_parallel_size, an experiment's expert_parallel) so "
        f"that TP x EP x PP divides the {layout.gpus} GPUs.", layout.line("model"))


def model_parallel_with_lora(layout: Layout) -> Finding | None:
    tp, pp = layout.tensor_parallel, layout.pipeline_parallel
    if not layout.lora or (tp < 2 and pp < 2):
        return None
    return Finding(
        "model-parallel-with-lora", ERROR,
        f"model parallel (TP={tp}, PP={pp}) with LoRA still on (NeMo's finetune recipes train LoRA unless told "
        "otherwise): LoRA hides the memory behaviour model parallelism is meant to show.",
        "fine-tune fully in a model-parallel run (peft=none, or the recipe's full fine-tune: --factory "
        "'llama31_8b(peft_scheme=None)'), or keep LoRA with TP=PP=1.",
        layout.line("tensor_parallel", "pipeline_parallel"))


def sequence_parallel_without_tp(layout: Layout) -> Finding | None:
    if not layout.sequence_parallel or layout.tensor_parallel >= 2:
        return None
    return Finding(
        "sequence-parallel-without-tp", ERROR,
        f"sequence parallelism with tensor parallel size {layout.tensor_parallel}: it splits activations along "
        "the tensor-parallel group, so there is nothing to split (Megatron refuses it).",
        f"use a tensor parallel size of 2 or more ({STRATEGY}tensor_model_parallel_size), or turn sequence "
        "parallelism off.", layout.line("sequence_parallel"))


def nemo_needs_a100(layout: Layout) -> Finding | None:
    """The container's kernels are the reason; NeMo installed without it (a workstation) runs elsewhere too."""
    constraint = layout.constraint or ""
    if not layout.nemo_container or "a100" in constraint.lower():
        return None
    return Finding(
        "nemo-needs-a100", ERROR,
        f"NeMo's container with constraint={constraint or 'none'}: its kernels need A100 GPUs and fail at start-up "
        "on others (V100).",
        "ask for A100 nodes: #SBATCH --constraint=a100 (in a site profile: scheduler.constraint: a100).",
        layout.line("constraint"))


def offload_with_zero0(layout: Layout) -> Finding | None:
    if not layout.offload or layout.zero_stage != 0:
        return None
    return _finding(pitfall_text.offload_with_zero0(layout.deepspeed_config), layout.line("deepspeed_config"))


def hybrid_shard_single_node(layout: Layout) -> Finding | None:
    if layout.fsdp != "HYBRID_SHARD" or layout.nodes is None or layout.nodes >= 2:
        return None
    return _finding(pitfall_text.hybrid_shard_single_node(), layout.line("fsdp"))


# Megatron's layout as NeMo runs it.
MEGATRON_LAYOUT: tuple[Pitfall, ...] = (parallel_sizes_mismatch, mixtral_without_ep, model_parallel_with_lora,
                                        sequence_parallel_without_tp)


def findings(layout: Layout, pitfalls: Iterable[Pitfall]) -> Iterator[Finding]:
    """The findings of ``pitfalls`` that ``layout`` has, in their order."""
    for pitfall in pitfalls:
        found = pitfall(layout)
        if found is not None:
            yield found
