"""Packed causal attention without Transformer Engine (workshop_lib/train/packed_attention.py): every record of a
pack attends only to its own earlier tokens, exactly as if each record ran alone."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from workshop_lib.train.packed_attention import packed_causal_attention, segment_ids  # noqa: E402


def _one_record_at_a_time(query, key, value, cu_seqlens, scale):
    """The reference: plain causal softmax attention in float64, record by record (padding on its own)."""
    heads, groups = query.shape[1], key.shape[1]
    key, value = key.repeat_interleave(heads // groups, 1), value.repeat_interleave(heads // groups, 1)
    bounds = cu_seqlens.tolist() + ([query.shape[0]] if cu_seqlens[-1] < query.shape[0] else [])
    outputs = []
    for start, end in zip(bounds, bounds[1:]):
        q, k, v = (t[start:end].double().transpose(0, 1) for t in (query, key, value))
        scores = q @ k.transpose(1, 2) * scale
        scores = scores.masked_fill(~torch.ones(end - start, end - start, dtype=torch.bool).tril(), -math.inf)
        outputs.append((scores.softmax(-1) @ v).transpose(0, 1).reshape(end - start, -1))
    return torch.cat(outputs)


@pytest.mark.parametrize("lengths, padding, heads, groups", [((5, 3, 8), 0, 4, 4), ((7, 1, 6), 4, 8, 2),
                                                             ((16,), 0, 4, 1)])
def test_each_record_attends_only_to_itself(lengths, padding, heads, groups):
    generator = torch.Generator().manual_seed(sum(lengths) + padding)
    tokens, head_dim = sum(lengths) + padding, 16
    query = torch.randn(tokens, heads, head_dim, generator=generator)
    key, value = (torch.randn(tokens, groups, head_dim, generator=generator) for _ in range(2))
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    scale = 1 / math.sqrt(head_dim)
    out = packed_causal_attention(query, key, value, cu_seqlens, scale)
    reference = _one_record_at_a_time(query, key, value, cu_seqlens, scale)
    assert out.shape == (tokens, heads * head_dim)
    assert torch.linalg.norm(out.double() - reference) / torch.linalg.norm(reference) < 1e-6


def test_a_later_record_changes_nothing_before_it():
    # Attention that leaked across the boundary would change the first record when the second one changes.
    generator = torch.Generator().manual_seed(7)
    query, key, value = (torch.randn(10, 2, 8, generator=generator) for _ in range(3))
    cu_seqlens = torch.tensor([0, 6, 10])
    first = packed_causal_attention(query, key, value, cu_seqlens)[:6]
    key2, value2 = key.clone(), value.clone()
    key2[6:], value2[6:] = 5.0, -5.0
    assert torch.equal(packed_causal_attention(query, key2, value2, cu_seqlens)[:6], first)


def test_padding_after_the_last_record_is_a_record_of_its_own():
    assert segment_ids(torch.tensor([0, 3, 5]), 7).tolist() == [0, 0, 0, 1, 1, 2, 2]


def test_heads_must_be_a_multiple_of_groups():
    with pytest.raises(ValueError, match="not a multiple"):
        packed_causal_attention(torch.zeros(4, 3, 8), torch.zeros(4, 2, 8), torch.zeros(4, 2, 8), torch.tensor([0, 4]))
