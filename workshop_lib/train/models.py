"""The model registry: a workshop name -> a hub checkpoint or a configuration built in code.

Real names (``bloom-560m``, ``llama-3.1-8b``, ``mixtral-8x7b``) load the hub checkpoint, or with
``--random-init`` build the same architecture from a config written here (no download).
Tiny names build a few-layer version of the same family for CPUs; ``gpt`` is the custom model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from workshop_lib.core.errors import WorkshopError
from workshop_lib.core.vocabulary import HUB_CHECKPOINTS

TINY_VOCAB = 512  # matches the locally trained tokenizer


def _bloom(**sizes):
    from transformers import BloomConfig

    return BloomConfig(**sizes)


def _llama(**sizes):
    from transformers import LlamaConfig

    return LlamaConfig(**sizes)


def _mixtral(**sizes):
    from transformers import MixtralConfig

    return MixtralConfig(**sizes)


@dataclass(frozen=True)
class ModelSpec:
    """One registry entry. ``build_config`` gives the architecture without any download."""

    name: str
    family: str  # bloom | llama | mixtral | gpt
    hub_name: str | None
    build_config: Callable[[], object] | None
    layer_class: str | None  # the transformer block FSDP wraps as a unit
    attention_projections: tuple[str, ...] = field(default=())  # LoRA targets

    @property
    def is_tiny(self) -> bool:
        return self.hub_name is None

    @property
    def is_moe(self) -> bool:
        return self.family == "mixtral"


_LLAMA_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")

REGISTRY: dict[str, ModelSpec] = {spec.name: spec for spec in [
    ModelSpec("bloom-560m", "bloom", HUB_CHECKPOINTS["bloom-560m"],
              lambda: _bloom(hidden_size=1024, n_layer=24, n_head=16, vocab_size=250880),
              "BloomBlock", ("query_key_value", "dense")),
    ModelSpec("tiny-bloom", "bloom", None,
              lambda: _bloom(hidden_size=64, n_layer=2, n_head=4, vocab_size=TINY_VOCAB),
              "BloomBlock", ("query_key_value", "dense")),
    ModelSpec("llama-3.1-8b", "llama", HUB_CHECKPOINTS["llama-3.1-8b"],
              lambda: _llama(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                             num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                             max_position_embeddings=131072, rope_theta=500000.0),
              "LlamaDecoderLayer", _LLAMA_ATTENTION),
    ModelSpec("tiny-llama", "llama", None,
              lambda: _llama(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=4, vocab_size=TINY_VOCAB,
                             max_position_embeddings=1024),
              "LlamaDecoderLayer", _LLAMA_ATTENTION),
    ModelSpec("mixtral-8x7b", "mixtral", HUB_CHECKPOINTS["mixtral-8x7b"],
              lambda: _mixtral(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                               num_attention_heads=32, num_key_value_heads=8, num_local_experts=8,
                               num_experts_per_tok=2, vocab_size=32000),
              "MixtralDecoderLayer", _LLAMA_ATTENTION),
    ModelSpec("tiny-mixtral", "mixtral", None,
              lambda: _mixtral(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=4, num_local_experts=4,
                               num_experts_per_tok=2, vocab_size=TINY_VOCAB,
                               max_position_embeddings=1024),
              "MixtralDecoderLayer", _LLAMA_ATTENTION),
    ModelSpec("gpt", "gpt", None, None, "Block", ("qkv", "proj")),
]}


def model_spec(name: str) -> ModelSpec:
    try:
        return REGISTRY[name]
    except KeyError:
        raise WorkshopError(f"--model {name!r} is not in the registry; choose one of "
                            f"{', '.join(REGISTRY)}") from None


def uses_local_tokenizer(spec: ModelSpec, random_init: bool) -> bool:
    """Tiny and random-init models never touch the hub, so they use the local BPE tokenizer."""
    return spec.is_tiny or random_init


def build_config(spec: ModelSpec):
    if spec.build_config is None:
        raise WorkshopError(f"--model {spec.name} has no Hugging Face config; run it with "
                            "`-m workshop_lib.train.gpt`")
    return spec.build_config()


def build_model(spec: ModelSpec, random_init: bool = False, seed: int = 0):
    """The model in fp32 on CPU (the engines move and cast it). Random init is seeded."""
    import torch
    from transformers import AutoModelForCausalLM

    if spec.is_tiny or random_init:
        torch.manual_seed(seed)  # same weights on every rank and in the unsharded reference
        return AutoModelForCausalLM.from_config(build_config(spec), dtype=torch.float32)
    return AutoModelForCausalLM.from_pretrained(spec.hub_name, dtype=torch.float32)


def count_parameters(model) -> tuple[int, int]:
    """(trainable, total) parameter counts, each shared tensor counted once."""
    seen, trainable, total = set(), 0, 0
    for parameter in model.parameters():
        if id(parameter) in seen:
            continue
        seen.add(id(parameter))
        # Under ZeRO-3 a parameter is an empty placeholder; ds_numel is its real size.
        size = getattr(parameter, "ds_numel", None) or parameter.numel()
        total += size
        trainable += size if parameter.requires_grad else 0
    return trainable, total


def build_on_meta(spec: ModelSpec, dtype=None):
    """The architecture with no storage (meta device): a 46.7 B-parameter Mixtral costs no host memory.
    Each rank then shards it (tensor parallel) and materialises only its own slice (``materialise``)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(build_config(spec), dtype=dtype or torch.float32)


def materialise(model, device, seed: int = 0, init_std: float | None = None):
    """Storage on ``device`` for a model built on the meta device, with random weights: normal(0, std)
    for matrices and embeddings, ones for norm weights, zeros for biases. Tensor-parallel shards (DTensor)
    get this rank's slice only; replicated tensors get the same values on every rank (same seed).
    Rotary embeddings are rebuilt: their frequency tables are buffers computed at construction."""
    import torch
    from torch.distributed.tensor import DTensor

    model.to_empty(device=device)
    std = init_std if init_std is not None else getattr(model.config, "initializer_range", 0.02)
    replicated = torch.Generator(device=device).manual_seed(seed)
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    sharded = torch.Generator(device=device).manual_seed(seed + 1 + rank)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            local = parameter.to_local() if isinstance(parameter, DTensor) else parameter
            generator = sharded if isinstance(parameter, DTensor) else replicated
            if "norm" in name.rsplit(".", 2)[-2] or name.endswith("norm.weight"):
                local.fill_(1.0)
            elif name.endswith(".bias"):
                local.zero_()
            else:
                local.normal_(0.0, std, generator=generator)
    for parent in model.modules():
        for child_name, child in parent.named_children():
            if type(child).__name__.endswith("RotaryEmbedding"):
                with torch.device(device):  # transformers 5.17 takes device=, 5.23 does not
                    setattr(parent, child_name, type(child)(config=child.config))
    return model
