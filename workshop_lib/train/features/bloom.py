"""The ``sdpa`` and ``gelu`` features: BLOOM's own attention and GELU as PyTorch's fused kernels.

``sdpa``: BLOOM's eager attention (bmm, ALiBi add, mask add, fp32 softmax, bmm) as one
``scaled_dot_product_attention`` call with the ALiBi bias as its mask. ``gelu``: BLOOM's tanh-GELU (a
dozen elementwise kernels, forward and backward) as ``gelu(approximate="tanh")``, one kernel each way.
Both replace modules where the model has them and leave other models alone.
"""

from __future__ import annotations

import torch


class _AlibiBias:
    """The additive attention bias of one forward pass (ALiBi + causal/padding mask), built once
    and reused by every block: BloomModel hands the same ``alibi`` and mask tensors to all of them.
    Holding the two keys keeps them alive, so an identity match cannot be a recycled object."""

    def __init__(self):
        self.keys = None
        self.bias = None

    def get(self, alibi, mask, batch, heads, length, dtype):
        # A bias made outside a CUDA-graph capture (its warm-up) must not be served inside it: the graph
        # would read memory it did not record, and that memory is freed after the capture.
        capturing = alibi.is_cuda and torch.cuda.is_current_stream_capturing()
        if self.keys is not None and self.keys[0] is alibi and self.keys[1] is mask \
                and self.keys[2:] == (dtype, capturing):
            return self.bias
        keys = (alibi, mask, dtype, capturing)
        # BLOOM's alibi is slope_h × (position of the key); softmax ignores a constant per query row, so
        # slope_h × (key − query position) is the same attention with small numbers near the diagonal,
        # where bf16 rounding would otherwise hit the largest weights.
        positions = alibi.reshape(batch, heads, 1, length).float()
        bias = positions - positions.transpose(-1, -2)
        if mask is None:  # no mask given: causal only
            mask = torch.ones(length, length, dtype=torch.bool, device=bias.device).tril()
        bias = bias.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else bias + mask
        self.bias = bias.clamp(min=torch.finfo(dtype).min).to(dtype)
        self.keys = keys
        return self.bias

    def forget(self) -> None:
        self.keys = self.bias = None


def _sdpa_bloom_attention(self, hidden_states, residual, alibi, attention_mask, layer_past=None,
                          use_cache=False, output_attentions=False, **kwargs):
    """BloomAttention.forward through ``scaled_dot_product_attention`` (training and full-sequence
    evaluation); with a KV cache (generation) or attention weights asked for, BLOOM's own forward."""
    batch, length, _ = hidden_states.shape
    if (layer_past is not None or output_attentions or alibi.shape[-1] != length
            or (self.pretraining_tp > 1 and self.slow_but_exact)):
        return type(self).forward(self, hidden_states, residual, alibi, attention_mask, layer_past=layer_past,
                                  use_cache=use_cache, output_attentions=output_attentions, **kwargs)
    query, key, value = self._reshape(self.query_key_value(hidden_states))  # [batch, heads, length, head_dim]
    bias = self._alibi_bias.get(alibi, attention_mask, batch, self.num_heads, length, query.dtype)
    context = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=bias, dropout_p=self.attention_dropout.p if self.training else 0.0,
        scale=self.inv_norm_factor)
    output = self.dense(context.transpose(1, 2).reshape(batch, length, self.hidden_size))
    output = residual + torch.nn.functional.dropout(output, p=self.hidden_dropout, training=self.training)
    return output, None


def _tanh_gelu(self, x):
    return torch.nn.functional.gelu(x, approximate="tanh")


def use_sdpa_attention(model) -> int:
    """Route every BloomAttention of ``model`` through :func:`_sdpa_bloom_attention`; returns how many.
    Models whose attention already is SDPA (Llama, Mixtral in transformers 5) have none."""
    import types

    if torch.cuda.is_available():
        # cuDNN's attention plans a graph for every new sequence length (seconds over the first steps
        # and evaluations, measured on an H100); the memory-efficient kernel takes the bias as it is.
        torch.backends.cuda.enable_cudnn_sdp(False)
    shared = _AlibiBias()
    count = 0
    for module in model.modules():
        if type(module).__name__ == "BloomAttention":
            module._alibi_bias = shared
            module.forward = types.MethodType(_sdpa_bloom_attention, module)
            count += 1
    return count


def use_native_gelu(model) -> int:
    """BLOOM's GELU (0.5·x·(1 + tanh(0.79788456·x·(1 + 0.044715·x²))), a custom autograd function
    of elementwise operations) as PyTorch's ``gelu(approximate="tanh")``, the same formula in one
    kernel each way; returns how many modules were changed."""
    import types

    count = 0
    for module in model.modules():
        if type(module).__name__ == "BloomGelu":
            module.forward = types.MethodType(_tanh_gelu, module)
            count += 1
    return count
