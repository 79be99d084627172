"""The custom GPT of the FSDP chapter: a small decoder-only transformer written out in full.

Read it top to bottom: token + position embeddings, ``layers`` pre-norm blocks (causal
self-attention, then a feed-forward network), a final norm and an output layer tied to the
token embedding. Every size is an argument, so the weak-scaling exercise can double the depth.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from workshop_lib.core.errors import WorkshopError
from workshop_lib.core.vocabulary import TINY_GPT


@dataclass(frozen=True)
class GPTConfig:
    """The model's shape (TINY_GPT's numbers unless given) and its dropout."""

    vocab: int = TINY_GPT.vocab
    hidden: int = TINY_GPT.hidden
    layers: int = TINY_GPT.layers
    heads: int = TINY_GPT.heads
    ffn: int = TINY_GPT.ffn
    seq_len: int = TINY_GPT.seq_len
    dropout: float = 0.0

    def __post_init__(self):
        if self.hidden % self.heads:
            raise WorkshopError(f"--hidden {self.hidden} must be divisible by --heads {self.heads}; "
                                "pick a head count that divides the hidden size")


@dataclass
class CausalLMOutput:
    loss: torch.Tensor | None
    logits: torch.Tensor


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.heads = config.heads
        self.qkv = nn.Linear(config.hidden, 3 * config.hidden)
        self.proj = nn.Linear(config.hidden, config.hidden)
        self.dropout = config.dropout

    def forward(self, x: torch.Tensor, padding_mask: torch.Tensor | None) -> torch.Tensor:
        batch, length, hidden = x.shape
        q, k, v = self.qkv(x).split(hidden, dim=2)
        # (batch, heads, length, head size) for scaled_dot_product_attention
        q, k, v = (t.view(batch, length, self.heads, hidden // self.heads).transpose(1, 2) for t in (q, k, v))
        causal = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
        mask = causal if padding_mask is None else causal & padding_mask[:, None, None, :].bool()
        # A padded query row that sees nothing would give NaN; let it see itself.
        mask = mask | torch.eye(length, dtype=torch.bool, device=x.device)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                             dropout_p=self.dropout if self.training else 0.0)
        return self.proj(out.transpose(1, 2).reshape(batch, length, hidden))


class Block(nn.Module):
    """One transformer layer; FSDP wraps each Block as a unit."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.attention_norm = nn.LayerNorm(config.hidden)
        self.attention = CausalSelfAttention(config)
        self.ffn_norm = nn.LayerNorm(config.hidden)
        self.ffn = nn.Sequential(nn.Linear(config.hidden, config.ffn), nn.GELU(),
                                 nn.Linear(config.ffn, config.hidden))

    def forward(self, x, padding_mask):
        x = x + self.attention(self.attention_norm(x), padding_mask)
        return x + self.ffn(self.ffn_norm(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab, config.hidden)
        self.position_embedding = nn.Embedding(config.seq_len, config.hidden)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.final_norm = nn.LayerNorm(config.hidden)
        self.lm_head = nn.Linear(config.hidden, config.vocab, bias=False)
        self.lm_head.weight = self.token_embedding.weight  # weight tying, as in GPT-2
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, input_ids, attention_mask=None, labels=None) -> CausalLMOutput:
        length = input_ids.shape[1]
        if length > self.config.seq_len:
            raise WorkshopError(f"sequence of {length} tokens exceeds --seq-len {self.config.seq_len}; "
                                "raise --seq-len or lower --max-length")
        positions = torch.arange(length, device=input_ids.device)
        x = self.token_embedding(input_ids) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x, attention_mask)
        logits = self.lm_head(self.final_norm(x))
        loss = None
        if labels is not None:  # predict token t+1 from tokens up to t
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)).float(),
                                   labels[:, 1:].reshape(-1), ignore_index=-100)
        return CausalLMOutput(loss, logits)

    @torch.no_grad()
    def generate(self, input_ids, attention_mask=None, max_new_tokens=16, eos_token_id=None, **_):
        """Greedy decoding for one left-aligned prompt batch (used by the EM/F1 evaluation)."""
        for _ in range(max_new_tokens):
            window = input_ids[:, -self.config.seq_len:]
            mask = None if attention_mask is None else attention_mask[:, -self.config.seq_len:]
            next_token = self(window, mask).logits[:, -1].argmax(dim=-1, keepdim=True)
            input_ids = torch.cat([input_ids, next_token], dim=1)
            if attention_mask is not None:
                attention_mask = torch.cat([attention_mask, torch.ones_like(next_token)], dim=1)
            if eos_token_id is not None and bool((next_token == eos_token_id).all()):
                break
        return input_ids
