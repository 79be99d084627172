"""The workshop's shared words, each stated once: engines, FSDP strategies, training recipes, the real models'
hub checkpoints, the custom GPT.

The notebook side (experiments, checks, book) and the job side (train/) both read these; neither may
restate them. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

from workshop_lib.core.errors import WorkshopError

# The engine that runs an experiment; it picks the template and the entry point.
NEMO = "nemo"  # NeMo Factory `nemo llm finetune` (chapters 1-2)
HF = "hf"  # Hugging Face Trainer, plain / DeepSpeed / FSDP (chapters 3-4)
GPT = "gpt"  # the custom GPT of seed 003 (chapter 4)
ENGINES = (NEMO, HF, GPT)

FSDP_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD")

# How a Hugging Face Trainer run trains (workshop_lib.train.recipes applies the features): "seed" is the seeds'
# recipe (fp16, batch 4 x accumulation 4, padded to 512), "tuned" the workshop's faster one.
FEATURES = ("bf16", "batch", "padding", "grouping", "chunked-ce", "fused-adamw", "sdpa", "gelu", "graphs",
            "compile", "gc-freeze", "large-batch")
# Not in tuned (benchmarks/NOTES.md): large-batch, because at a 4× batch the same samples give ¼ of the
# optimizer steps, which cost 17-42 % in eval loss; compile, because its 60-150 s of compilation made
# the tuned recipe slower end to end than the seed's on the workshop's jobs (100-300 steps).
NOT_TUNED = ("compile", "large-batch")
RECIPE_FEATURES = {"seed": (), "tuned": tuple(name for name in FEATURES if name not in NOT_TUNED)}
RECIPES = tuple(RECIPE_FEATURES)
DEFAULT_RECIPE = "seed"

# The real models' Hugging Face checkpoints (workshop name -> hub repository): train/models.py loads them, and
# `workshop setup` downloads the ones a site's jobs load (sites/requirements.py). Tiny models have none.
HUB_CHECKPOINTS = {
    "bloom-560m": "bigscience/bloom-560m",
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B",
    "mixtral-8x7b": "mistralai/Mixtral-8x7B-v0.1",
}


def parse_recipe(text: str) -> tuple[str, ...]:
    """``seed``, ``tuned``, or a base plus features: ``seed+bf16+batch`` (features in ladder order)."""
    base, *extra = [part.strip() for part in text.split("+")]
    if base not in RECIPE_FEATURES:
        raise WorkshopError(f"--recipe {text!r}: start with one of {', '.join(RECIPES)} "
                            f"(then optionally +feature, features: {', '.join(FEATURES)})")
    unknown = [name for name in extra if name not in FEATURES]
    if unknown:
        raise WorkshopError(f"--recipe {text!r}: unknown feature(s) {', '.join(unknown)}; "
                            f"choose from {', '.join(FEATURES)}")
    chosen = set(RECIPE_FEATURES[base]) | set(extra)
    return tuple(name for name in FEATURES if name in chosen)


@dataclass(frozen=True)
class GptShape:
    """Architecture of the custom GPT (seed 003's VOCAB_SIZE, HIDDEN_SIZE, NUM_LAYERS, ...).

    The field names, order and defaults are part of every GPT experiment's content hash: do not change them."""

    layers: int = 3
    hidden: int = 2048
    heads: int = 16
    ffn: int = 8192
    vocab: int = 50000
    seq_len: int = 512


# The tiny GPT the job's entry point builds when no shape is given (CPU tests, the tiny profile).
TINY_GPT = GptShape(layers=2, hidden=64, heads=4, ffn=256, vocab=512, seq_len=512)
