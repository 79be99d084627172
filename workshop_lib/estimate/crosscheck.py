"""Cross-check against DeepSpeed's own model-state estimators (imports deepspeed, hence torch, when called)."""

from __future__ import annotations

from workshop_lib.core.errors import WorkshopError
from workshop_lib.estimate.memory import TrainingSetup, estimate_memory
from workshop_lib.estimate.shapes import ModelShape, model_shape, parameter_counts


def deepspeed_zero_estimates(model: ModelShape | str | dict, setup: TrainingSetup) -> dict[str, float]:
    """Model-state bytes per GPU and CPU bytes per node from DeepSpeed's estimate_zero{2,3}_model_states_mem_needs
    next to ours. DeepSpeed counts 18 bytes per sharded parameter (it adds the 4-byte fp32 gradient
    partition) and a 1.5x CPU buffer factor, so its figures sit above ours by design."""
    shape = model_shape(model)
    if setup.zero_stage not in (2, 3):
        raise WorkshopError(f"DeepSpeed ships estimators for ZeRO stages 2 and 3 only (got {setup.zero_stage}); "
                            "use --zero 2 or --zero 3")
    counts = parameter_counts(shape)
    ours = estimate_memory(shape, setup)
    cpu_offload = setup.offload != "none"
    if setup.zero_stage == 2:
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

        cpu, gpu = estimate_zero2_model_states_mem_needs(
            counts.total, setup.gpus_per_node, setup.nodes, cpu_offload=cpu_offload)
    else:
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

        largest_layer = max(counts.embedding, (counts.attention + counts.mlp + counts.experts) // shape.num_layers)
        cpu, gpu, _ = estimate_zero3_model_states_mem_needs(
            counts.total, largest_layer, setup.gpus_per_node, setup.nodes, cpu_offload=cpu_offload,
            cpu_offload_params=setup.offload == "parameters")
    return {"ours_gpu": ours.model_states, "deepspeed_gpu": float(gpu),
            "ours_cpu_per_node": ours.cpu_per_node, "deepspeed_cpu_per_node": float(cpu)}
