"""The seeds' pitfalls, each stated once: the experiment rules and the script linter both ask these functions."""

from __future__ import annotations

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
