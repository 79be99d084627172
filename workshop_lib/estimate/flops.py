"""FLOPs per token and model FLOPs utilisation (MFU) from a measured step time."""

from __future__ import annotations

from workshop_lib.core.errors import WorkshopError
from workshop_lib.estimate.shapes import ModelShape, model_shape, parameter_counts

# Dense 16-bit tensor-core peaks (no sparsity), FLOP/s per GPU, from the vendors' data sheets.
PEAK_FLOPS = {
    "a100": 312e12,
    "h100": 989e12,
    "h200": 989e12,
}


def matmul_parameters(model: ModelShape | str) -> int:
    """Parameters that take part in a matmul per token: all but embedding lookups and norms, with the LM
    head counted even when tied (BLOOM-560m: the 257 M-entry head is ~46 % of its compute). MoE: active experts."""
    shape = model_shape(model)
    counts = parameter_counts(shape)
    return counts.attention + counts.mlp + counts.active_experts + counts.router + shape.vocab_size * shape.hidden_size


def attention_flops_per_token(model: ModelShape | str, seq_len: int) -> float:
    """12·L·s·h: the QKᵀ and attention·V matmuls, forward (4·L·s·h) and backward (twice that), no causal saving."""
    shape = model_shape(model)
    return 12 * shape.num_layers * seq_len * shape.num_heads * shape.head_dim


def flops_per_token(model: ModelShape | str, seq_len: int, recompute: bool = False) -> float:
    """Training FLOPs per token: 6·N (2N forward + 4N backward, N = matmul parameters) + 12·L·s·h.

    With full recomputation the forward runs twice: 8·N + 16·L·s·h.
    """
    if seq_len < 1:
        raise WorkshopError(f"seq_len={seq_len} must be at least 1")
    factor = 8 / 6 if recompute else 1.0
    return factor * (6 * matmul_parameters(model) + attention_flops_per_token(model, seq_len))


def mfu(step_time_s: float, tokens_per_step: float, n_params: float, peak_flops: float,
        attention_flops: float = 0.0) -> float:
    """Model FLOPs utilisation: (6·N + attention FLOPs per token) · tokens / step time / peak FLOP/s.

    tokens_per_step and peak_flops cover the same GPUs (one GPU's share, or the whole job's).
    """
    if step_time_s <= 0:
        raise WorkshopError(f"step time {step_time_s} s must be positive (read it from the trainer log)")
    if peak_flops <= 0:
        raise WorkshopError(f"peak FLOP/s {peak_flops} must be positive; e.g. PEAK_FLOPS['a100'] = 312e12")
    return (6 * n_params + attention_flops) * tokens_per_step / step_time_s / peak_flops
