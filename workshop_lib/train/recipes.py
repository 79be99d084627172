"""Training recipes: the seeds' own (``seed``) and the workshop's tuned one (``tuned``).

``--recipe seed`` is what seeds 002/003 do: fp16 autocast, per-device batch 4 × accumulation 4,
every sample padded to 512 tokens, the full fp32 logits over the vocabulary, eager PyTorch.
``--recipe tuned`` adds, step by step (each one can be named on its own, ``seed+bf16+batch``):

* ``bf16``        bf16 autocast (fp32 master weights, no loss scaler) instead of fp16
* ``batch``       the accumulated micro-batches as one batch (same global batch, same optimizer steps)
* ``padding``     each batch padded to its longest sample (a multiple of 16), not to 512
* ``grouping``    batches of samples of similar length (HF's length-grouped sampler)
* ``chunked-ce``  the cross-entropy over the vocabulary computed in row chunks, only on the
                  positions that have a label: the (tokens × 250,880) fp32 logits never exist at once
                  (on a GPU with liger-kernel installed, Liger's fused linear cross-entropy
                  kernel; elsewhere the workshop's own chunked loss, same math)
* ``fused-adamw`` ``adamw_torch_fused`` and TF32 matmuls for what stays in fp32
* ``sdpa``        BLOOM's eager attention (bmm, ALiBi add, mask add, fp32 softmax, bmm) as one
                  ``scaled_dot_product_attention`` call with the ALiBi bias as its mask
* ``gelu``        BLOOM's tanh-GELU (a dozen elementwise kernels, forward and backward) as PyTorch's
                  own ``gelu(approximate="tanh")``: one kernel each way
* ``graphs``      the transformer blocks of a training step replayed as CUDA graphs, one per batch
                  shape, batches padded to a multiple of 64 (``workshop_lib.train.graphs``); one
                  process, no gradient accumulation
* ``compile``     ``torch.compile`` of each transformer block (regional compilation), its kernels
                  launched by inductor's C++ wrapper (other ways with ``--compile-mode``, see
                  ``workshop_lib.train.features.compile``); not in ``tuned``: on a workshop-sized job its compile
                  time costs more than it saves (benchmarks/NOTES.md)
* ``gc-freeze``   the objects alive when training starts (model, libraries) are frozen out of Python's
                  garbage collector (``gc.freeze``), so its full collections stop rescanning them
* ``large-batch`` a 4× larger batch per optimizer step (the same samples in ¼ of the steps) with the
                  learning rate scaled by √4 = 2, the square-root rule for Adam

A feature that cannot apply where the job runs (bf16, fused AdamW and compile on a CPU; the chunked
loss, which reads the output weight directly, under ZeRO-3 or FSDP; compile under DeepSpeed or FSDP)
is left out, and the run's summary lists what was applied.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workshop_lib.core.vocabulary import RECIPE_FEATURES, parse_recipe
from workshop_lib.train.features.data import PAD_MULTIPLE
from workshop_lib.train.features.loss import liger_available
from workshop_lib.train.graphs import GRAPH_PAD_MULTIPLE

LARGE_BATCH_FACTOR = 4


@dataclass(frozen=True)
class AppliedRecipe:
    """What a recipe means for one run, after what the device and engine allow."""

    name: str
    features: tuple[str, ...]  # applied
    skipped: dict[str, str]  # feature -> why it was left out here
    precision: str
    per_device_batch: int
    grad_accum: int
    eval_batch: int
    batch_factor: int = 1  # optimizer steps shrink by this factor, the batch grows by it
    learning_rate_factor: float = 1.0
    loss_kernel: str | None = None  # chunked-ce's implementation: "liger", "inductor" or "eager"
    pad_multiple: int = PAD_MULTIPLE  # dynamic padding rounds a batch's length up to this

    def has(self, feature: str) -> bool:
        return feature in self.features

    def settings(self) -> dict:
        settings = {"recipe": self.name, "recipe_features": list(self.features),
                    "recipe_skipped": dict(self.skipped)}
        if self.loss_kernel:
            settings["recipe_loss_kernel"] = self.loss_kernel
        if self.has("padding"):
            settings["recipe_pad_multiple"] = self.pad_multiple
        return settings


def apply_recipe(name: str, *, precision: str, per_device_batch: int, grad_accum: int,
                 device_kind: str, engine: str, zero_stage: int | None = None,
                 offload: bool = False, world_size: int = 1) -> AppliedRecipe:
    """Resolve ``--recipe`` for this run. ``precision`` is the already-resolved one."""
    wanted = parse_recipe(name)
    skipped: dict[str, str] = {}
    cuda = device_kind == "cuda"

    def allow(feature: str, ok: bool, why: str) -> bool:
        if feature in wanted and not ok:
            skipped[feature] = why
        return feature in wanted and ok

    applied = []
    if allow("bf16", cuda and torch.cuda.is_bf16_supported(), "needs a GPU with bf16"):
        precision = "bf16"
        applied.append("bf16")
    eval_batch = per_device_batch  # evaluation keeps the seed's batch: eval losses stay comparable
    if "batch" in wanted:
        per_device_batch, grad_accum = per_device_batch * grad_accum, 1
        applied.append("batch")
    for feature in ("padding", "grouping"):
        if feature in wanted:
            applied.append(feature)
    sharded = engine == "fsdp" or (zero_stage or 0) >= 3
    if allow("chunked-ce", not sharded, "reads the output weight directly: not with ZeRO-3 or FSDP"):
        applied.append("chunked-ce")
    if allow("fused-adamw", cuda and not offload, "needs the optimizer state on a GPU"):
        applied.append("fused-adamw")
    for feature in ("sdpa", "gelu"):  # BLOOM's own modules, replaced where the model has them
        if feature in wanted:
            applied.append(feature)
    if allow("graphs", cuda and engine == "hf" and world_size == 1 and grad_accum == 1 and "compile" not in wanted,
             "only on one GPU with the plain engine, without gradient accumulation or compile"):
        applied.append("graphs")
    if allow("compile", cuda and engine == "hf", "only on a GPU with the plain engine (no DeepSpeed/FSDP)"):
        applied.append("compile")
    if "gc-freeze" in wanted:
        applied.append("gc-freeze")
    batch_factor, learning_rate_factor = 1, 1.0
    if "large-batch" in wanted:
        batch_factor, learning_rate_factor = LARGE_BATCH_FACTOR, LARGE_BATCH_FACTOR ** 0.5
        per_device_batch *= batch_factor
        applied.append("large-batch")
    loss_kernel = None
    if "chunked-ce" in applied:
        loss_kernel = ("liger" if cuda and liger_available() else "inductor" if "compile" in applied else "eager")
    base = name.split("+")[0].strip()
    label = base if name.strip() in RECIPE_FEATURES else name.strip()
    pad_multiple = GRAPH_PAD_MULTIPLE if "graphs" in applied else PAD_MULTIPLE  # few shapes, few captures
    return AppliedRecipe(label, tuple(applied), skipped, precision, per_device_batch, grad_accum, eval_batch,
                         batch_factor, learning_rate_factor, loss_kernel, pad_multiple)
