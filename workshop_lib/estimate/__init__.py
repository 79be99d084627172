"""Predict before you measure: parameter counts, per-GPU memory, FLOPs and MFU of a fine-tuning run.

Notebook-side: imports neither torch nor transformers. Models come from a small table of known
configs (``KNOWN_CONFIGS``) or any Hugging Face ``config.json``; see ``memory`` for the formulas.
Owns: shapes (models and parameter counts), memory (bytes per GPU by engine), flops (FLOPs, MFU), report
(experiment -> setup, the printed estimate), fit (does a run fit its GPU), crosscheck, pitfall_text (the words of the
seed pitfalls the estimator refuses, which checks.pitfalls reports in the same words).
May import: core and experiments only (standard library otherwise: the memory calculator runs it in the browser).

    >>> from workshop_lib.estimate import TrainingSetup, estimate_memory
    >>> estimate = estimate_memory("bloom-560m", TrainingSetup(gpus=2, zero_stage=2, precision="fp16"))
    >>> round(estimate.total / 2**30, 1)  # GiB per GPU
"""

from workshop_lib.estimate.crosscheck import deepspeed_zero_estimates
from workshop_lib.estimate.flops import PEAK_FLOPS, attention_flops_per_token, flops_per_token, matmul_parameters, mfu
from workshop_lib.estimate.memory import (
    DEEPSPEED_PERSISTENCE_THRESHOLD,
    DEEPSPEED_REDUCE_BUCKET,
    FSDP_STRATEGIES,
    GIB,
    OFFLOADS,
    PRECISIONS,
    MemoryEstimate,
    ModelStates,
    StateBytes,
    TrainingSetup,
    activation_bytes,
    check_setup,
    estimate_memory,
    layer_activation_bytes,
    logits_bytes,
    model_state_bytes,
    model_state_formula,
    persistent_parameters,
    reduce_bucket_bytes,
    state_bytes,
    temporaries_bytes,
)
from workshop_lib.estimate.report import format_estimate, setup_from_experiment
from workshop_lib.estimate.shapes import (
    KNOWN_CONFIGS,
    ModelShape,
    ParameterCounts,
    lora_linears,
    lora_trainable_count,
    model_shape,
    parameter_count,
    parameter_counts,
    parameter_tensors,
    read_config,
    shape_from_config,
)

__all__ = [
    "DEEPSPEED_PERSISTENCE_THRESHOLD", "DEEPSPEED_REDUCE_BUCKET", "FSDP_STRATEGIES", "GIB", "KNOWN_CONFIGS", "OFFLOADS", "PEAK_FLOPS", "PRECISIONS", "MemoryEstimate",
    "ModelShape", "ModelStates", "ParameterCounts", "StateBytes", "TrainingSetup", "activation_bytes",
    "attention_flops_per_token", "check_setup", "deepspeed_zero_estimates", "estimate_memory",
    "flops_per_token", "format_estimate", "layer_activation_bytes", "logits_bytes", "lora_linears",
    "lora_trainable_count", "matmul_parameters", "mfu", "model_shape", "model_state_bytes",
    "model_state_formula", "parameter_count", "parameter_counts", "parameter_tensors", "persistent_parameters",
    "read_config", "reduce_bucket_bytes", "setup_from_experiment", "shape_from_config", "state_bytes",
    "temporaries_bytes",
]
