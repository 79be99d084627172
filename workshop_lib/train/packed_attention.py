"""Causal attention over packed sequences (THD layout) without Transformer Engine.

NeMo's packed sequences put several SQuAD records into one row of the recipe's length and hand Megatron the
record boundaries (`cu_seqlens`); each record must attend only to its own earlier tokens. Megatron's own local
attention refuses packed input ("Packed sequence is not supported by DotProductAttention. Please use
TEDotProductAttention instead."): the container uses Transformer Engine's fused kernel for it. Where TE cannot
be installed (the lent GPU machine), this gives the same result with PyTorch's scaled_dot_product_attention and
a block-diagonal causal mask, so NeMo's packing path (packed dataset, boundaries, RoPE per record, loss mask)
runs unchanged around it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def segment_ids(cu_seqlens: torch.Tensor, tokens: int) -> torch.Tensor:
    """The record each token belongs to; tokens after the last boundary (the pack's padding) form one more
    record of their own, so every row of the mask keeps its diagonal and no softmax is empty."""
    positions = torch.arange(tokens, device=cu_seqlens.device)
    return torch.searchsorted(cu_seqlens[1:].to(positions.dtype).contiguous(), positions, right=True)


def packed_causal_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            cu_seqlens: torch.Tensor, softmax_scale: float | None = None) -> torch.Tensor:
    """query [t, heads, d], key/value [t, groups, d] (grouped-query attention: heads a multiple of groups),
    cu_seqlens [records + 1] starting at 0 -> [t, heads * d]."""
    tokens, heads, head_dim = query.shape
    groups = key.shape[1]
    if heads % groups:
        raise ValueError(f"{heads} query heads are not a multiple of {groups} key/value groups")
    if heads != groups:
        key = key.repeat_interleave(heads // groups, dim=1)
        value = value.repeat_interleave(heads // groups, dim=1)
    segments = segment_ids(cu_seqlens, tokens)
    causal = torch.ones(tokens, tokens, dtype=torch.bool, device=query.device).tril()
    mask = causal & (segments[:, None] == segments[None, :])
    # [t, h, d] -> [1, h, t, d]
    output = F.scaled_dot_product_attention(query.transpose(0, 1)[None], key.transpose(0, 1)[None],
                                            value.transpose(0, 1)[None], attn_mask=mask, scale=softmax_scale)
    return output[0].transpose(0, 1).reshape(tokens, heads * head_dim)


def install_on_megatron_local_attention() -> bool:
    """Let Megatron's local DotProductAttention take packed input through packed_causal_attention; unpacked
    calls go to Megatron's own code unchanged. True when installed now."""
    from megatron.core.transformer import dot_product_attention as module

    original = module.DotProductAttention.forward
    if getattr(original, "workshop_packed", False):
        return False

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        if packed_seq_params is None:
            return original(self, query, key, value, attention_mask, attn_mask_type, attention_bias)
        cu_seqlens = (packed_seq_params.cu_seqlens_q_padded if packed_seq_params.cu_seqlens_q_padded is not None
                      else packed_seq_params.cu_seqlens_q)
        dropout = self.attention_dropout.p if self.training else 0.0
        if dropout:
            raise NotImplementedError("packed attention without Transformer Engine has no attention dropout; "
                                      "the Llama and Mixtral recipes use none (attention_dropout=0.0)")
        return packed_causal_attention(query, key, value, cu_seqlens, self.softmax_scale)

    forward.workshop_packed = True
    module.DotProductAttention.forward = forward
    return True
