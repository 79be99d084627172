"""``throughput.json``: the padded and real tokens of every optimizer step of a Trainer run.

Every Hugging Face Trainer run counts them (the seed's as much as a tuned one), so the recipe benchmark
(benchmarks/recipe_benchmark.py) can tell the tokens a step computed from the tokens it learned from.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from workshop_lib.train.tensor_census import cuda_peak_before_reset


class TokenCounter:
    """Padded and real tokens per micro-batch (device tensors, read once at the end)."""

    def __init__(self):
        self.padded: list[int] = []
        self.real: list[torch.Tensor] = []
        self.real_squared: list[torch.Tensor] = []
        self.rows: list[int] = []

    def add(self, inputs: dict) -> None:
        ids = inputs.get("input_ids")
        mask = inputs.get("attention_mask")
        if ids is None:
            return
        self.padded.append(int(ids.numel()))
        self.rows.append(int(ids.shape[0]))
        if mask is None:
            mask = torch.ones_like(ids)
        per_row = mask.sum(dim=1)
        self.real.append(per_row.sum())
        self.real_squared.append((per_row.double() ** 2).sum())

    def per_step(self, grad_accum: int) -> dict:
        """Micro-batches folded into optimizer steps."""
        real = [int(v) for v in torch.stack(self.real).tolist()] if self.real else []
        squared = [float(v) for v in torch.stack(self.real_squared).tolist()] if self.real else []

        def fold(values):
            return [sum(values[i:i + grad_accum]) for i in range(0, len(values) - grad_accum + 1, grad_accum)]

        padded_len_sq = [rows * (padded // rows) ** 2 for rows, padded in zip(self.rows, self.padded)]
        return {"padded_tokens": fold(self.padded), "real_tokens": fold(real),
                "real_length_squared": fold(squared), "padded_length_squared": fold(padded_len_sq),
                "rows": fold(self.rows)}


def counting_trainer_class():
    """A Trainer that counts the tokens of every training micro-batch."""
    from transformers import Trainer

    class CountingTrainer(Trainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.token_counter = TokenCounter()

        def training_step(self, model, inputs, *args, **kwargs):
            self.token_counter.add(inputs)
            return super().training_step(model, inputs, *args, **kwargs)

    return CountingTrainer


def write_throughput(path: Path, counter: TokenCounter, grad_accum: int, recipe, device_kind: str,
                     graphs: dict | None = None) -> None:
    """``throughput.json``: padded and real tokens of every optimizer step (the benchmark reads it)."""
    record = {"recipe": recipe.settings(), **counter.per_step(grad_accum), **(graphs or {})}
    if device_kind == "cuda":
        reserved = max(torch.cuda.max_memory_reserved(), cuda_peak_before_reset("reserved"))  # the probe resets it
        record["cuda_max_reserved_mib"] = reserved / 2**20
    path.write_text(json.dumps(record))
