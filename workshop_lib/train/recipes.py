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
                  ``workshop_lib.train.features.compile``); not in ``tuned``: on a workshop-sized job
                  its compile time costs more than it saves (benchmarks/NOTES.md)
* ``gc-freeze``   the objects alive when training starts (model, libraries) are frozen out of Python's
                  garbage collector (``gc.freeze``), so its full collections stop rescanning them
* ``large-batch`` a 4× larger batch per optimizer step (the same samples in ¼ of the steps) with the
                  learning rate scaled by √4 = 2, the square-root rule for Adam

A feature that cannot apply where the job runs (bf16, fused AdamW and compile on a CPU; the chunked
loss, which reads the output weight directly, under ZeRO-3 or FSDP; compile under DeepSpeed or FSDP)
is left out, and the run's summary lists what was applied.

This module declares; the mechanisms live in ``workshop_lib.train.features`` (and ``train.graphs``).
:func:`apply_recipe` decides which features this run gets and what they do to its numbers (precision,
batch, accumulation, learning rate). :data:`FEATURE_STEPS` is the one ordered list of what each feature
then does to the Trainer's parts; :func:`apply_features` walks it at each stage of building the Trainer
(torchtitan's ``parallelize`` is the model: one list, applied in order).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable

import torch

from workshop_lib.core.vocabulary import RECIPE_FEATURES, parse_recipe
from workshop_lib.train.features.bloom import use_native_gelu, use_sdpa_attention
from workshop_lib.train.features.compile import compile_model
from workshop_lib.train.features.data import PAD_MULTIPLE, DynamicPaddingCollator, UnpaddedView, sampler_arguments
from workshop_lib.train.features.loss import liger_available, use_chunked_loss
from workshop_lib.train.graphs import GRAPH_PAD_MULTIPLE, use_cuda_graphs

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


# ---------------------------------------------------------------- what each feature does to a Trainer

# The stages of building a Hugging Face Trainer, in order. ARGUMENTS comes before the model exists: under
# ZeRO-3 the TrainingArguments make the model be built already partitioned.
ARGUMENTS, MODEL, CALLBACKS = "arguments", "model", "callbacks"
STAGES = (ARGUMENTS, MODEL, CALLBACKS)


@dataclass
class TrainerParts:
    """What the features change on the way to a Trainer; the steps of each stage fill it in."""

    recipe: AppliedRecipe
    train_set: object  # the tokenized training set, each sample padded to the full length
    pad_token_id: int
    max_length: int
    layer_class: str  # the transformer block's class name (compile's unit)
    compile_mode: str = "blocks"
    # TrainingArguments beyond the plain ones. The seeds' loader drops the last, short micro-batch of an epoch.
    arguments: dict = field(default_factory=lambda: {"dataloader_drop_last": True})
    collator: Callable | None = None  # None: the Trainer's default (samples stacked as they are)
    model: torch.nn.Module | None = None  # set before the MODEL stage
    callbacks: list = field(default_factory=list)  # after the measuring callbacks, before the profiler's
    graphs: torch.nn.Module | None = None  # the graphs feature's GraphedBlocks, for the run's summary
    generation: Callable = nullcontext  # the context generation runs in after training

    def graph_summary(self) -> dict:
        return self.graphs.graph_state.summary() if self.graphs is not None else {}


@dataclass(frozen=True)
class FeatureStep:
    feature: str
    stage: str
    apply: Callable[[TrainerParts], None]


def _one_batch(parts: TrainerParts) -> None:
    # The seed's micro-batches of 4 train every sample of a 500-sample epoch in 32 optimizer steps (the
    # last accumulates one micro-batch). One batch of 16 keeps that last short batch too: dropping it
    # trained 93 steps against the seed's 96 on chapter 3's baseline, which alone moved the eval loss by
    # ~2 % (benchmarks/NOTES.md).
    parts.arguments["dataloader_drop_last"] = False


def _pad_per_batch(parts: TrainerParts, multiple: int) -> None:
    parts.train_set = UnpaddedView(parts.train_set)
    parts.collator = DynamicPaddingCollator(parts.pad_token_id, multiple=multiple, max_length=parts.max_length)


def _padding(parts: TrainerParts) -> None:
    _pad_per_batch(parts, parts.recipe.pad_multiple)


def _grouping(parts: TrainerParts) -> None:
    parts.arguments.update(sampler_arguments())
    if parts.collator is None:  # grouping alone: the sampler needs the real lengths, batches keep the full one
        _pad_per_batch(parts, parts.max_length)


def _chunked_loss(parts: TrainerParts) -> None:
    # Liger's kernel where it can run; else the workshop's chunks, fused by inductor under compile.
    use_chunked_loss(parts.model, fused_backend="inductor" if parts.recipe.has("compile") else None,
                     kernel="liger" if parts.recipe.loss_kernel == "liger" else "chunked")


def _fused_adamw(parts: TrainerParts) -> None:
    parts.arguments["optim"] = "adamw_torch_fused"
    torch.backends.cuda.matmul.allow_tf32 = True  # what stays in fp32 runs on the tensor cores
    torch.backends.cudnn.allow_tf32 = True


def _graphs(parts: TrainerParts) -> None:
    parts.graphs = use_cuda_graphs(parts.model, parts.recipe.per_device_batch)


def _compile(parts: TrainerParts) -> None:
    compile_model(parts.model, parts.layer_class, parts.compile_mode)
    # Generation runs eagerly: compiled blocks would recompile for every new prompt length.
    parts.generation = lambda: torch.compiler.set_stance("force_eager")


def _gc_freeze(parts: TrainerParts) -> None:
    from workshop_lib.train.callbacks import GcFreezeCallback  # transformers: only when a Trainer is built

    parts.callbacks.append(GcFreezeCallback())


# Every feature a Trainer run applies beyond the numbers apply_recipe sets (bf16, large-batch), in the
# ladder's order (core.vocabulary.FEATURES), which is the order they are applied in within a stage.
FEATURE_STEPS = (
    FeatureStep("batch", ARGUMENTS, _one_batch),
    FeatureStep("padding", ARGUMENTS, _padding),
    FeatureStep("grouping", ARGUMENTS, _grouping),
    FeatureStep("chunked-ce", MODEL, _chunked_loss),
    FeatureStep("fused-adamw", ARGUMENTS, _fused_adamw),
    FeatureStep("sdpa", MODEL, lambda parts: use_sdpa_attention(parts.model)),
    FeatureStep("gelu", MODEL, lambda parts: use_native_gelu(parts.model)),
    FeatureStep("graphs", MODEL, _graphs),
    FeatureStep("compile", MODEL, _compile),
    FeatureStep("gc-freeze", CALLBACKS, _gc_freeze),
)


def apply_features(parts: TrainerParts, stage: str) -> None:
    """Apply the run's features that act at ``stage``, in FEATURE_STEPS' order."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; the stages are {', '.join(STAGES)}")
    for step in FEATURE_STEPS:
        if step.stage == stage and parts.recipe.has(step.feature):
            step.apply(parts)
