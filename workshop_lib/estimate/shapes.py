"""Model shapes and parameter counts, read from Hugging Face style config dicts (no torch, no transformers).

A ``ModelShape`` holds the few numbers the estimator needs. ``model_shape`` builds one from a known
name (``bloom-560m``, ``llama-3.1-8b``, ``mixtral-8x7b``, the tiny models of the tiny profile, the custom
``gpt``), from a ``config.json`` path or from a config dict. ``parameter_counts`` splits the parameters into
the groups that parallelism treats differently (embeddings, attention, MLP, experts, norms, LM head).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping

from workshop_lib.core.errors import WorkshopError
from workshop_lib.core.vocabulary import GptShape

# The models of the workshop as their config.json would say (hub configs for the real ones; the tiny ones
# match workshop_lib.train.models, which tests check). Only the keys the estimator reads are listed.
KNOWN_CONFIGS: dict[str, dict] = {
    "bloom-560m": {"model_type": "bloom", "hidden_size": 1024, "n_layer": 24, "n_head": 16,
                   "vocab_size": 250880, "tie_word_embeddings": True},
    "llama-3.1-8b": {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
                     "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                     "vocab_size": 128256, "tie_word_embeddings": False},
    "mixtral-8x7b": {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
                     "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                     "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000,
                     "tie_word_embeddings": False},
    "tiny-bloom": {"model_type": "bloom", "hidden_size": 64, "n_layer": 2, "n_head": 4, "vocab_size": 512},
    "tiny-llama": {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                   "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 512},
    "tiny-mixtral": {"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 128,
                     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
                     "num_local_experts": 4, "num_experts_per_tok": 2, "vocab_size": 512},
    # The custom GPT of chapter 4 (its default shape).
    "gpt": {"model_type": "gpt", **asdict(GptShape())},
}

# Linear layers LoRA can target, per family: name -> (in features, out features) as functions of the shape.
# Mixtral's experts are one fused parameter in transformers 5 (no nn.Linear), so only attention is listed.
_ATTENTION_LINEARS = {
    "llama": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "mixtral": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "bloom": ("query_key_value", "dense"),
    "gpt": ("qkv", "proj"),
}


@dataclass(frozen=True)
class ModelShape:
    """The dimensions of a decoder-only transformer, enough to count parameters, activations and FLOPs."""

    name: str
    family: str  # bloom | llama | mixtral | gpt: decides which layers exist and how they are named
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_embeddings: bool
    gated_mlp: bool  # SwiGLU (gate, up, down) instead of two matrices with an activation between
    qkv_bias: bool
    output_bias: bool
    mlp_bias: bool
    layer_norm: bool  # LayerNorm (weight + bias); False: RMSNorm (weight only)
    embedding_norm: bool = False  # BLOOM normalises the embeddings
    learned_positions: int = 0  # positions of a learned position embedding (custom GPT)
    num_experts: int = 0  # 0: dense MLP
    experts_per_token: int = 0
    eager_attention: bool = False  # stores the s x s attention probabilities (BLOOM); else SDPA/flash
    dropout: bool = False  # any dropout probability > 0 (adds 1-byte masks to the activations)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def attention_modules(self) -> tuple[str, ...]:
        """The attention projections (the default LoRA targets)."""
        return _ATTENTION_LINEARS[self.family]


@dataclass(frozen=True)
class ParameterCounts:
    """Parameters by group. Tensor parallel splits attention, MLP, experts, embeddings and LM head;
    expert parallel splits experts; norms (and the router) stay whole on every GPU."""

    embedding: int  # token (+ position) embeddings, BLOOM's embedding norm included in `norms`
    attention: int
    mlp: int  # dense MLPs
    experts: int  # all experts of all layers
    router: int
    norms: int
    lm_head: int  # 0 when tied to the embedding
    active_experts: int = 0  # the experts one token passes through (experts_per_token of num_experts)

    @property
    def total(self) -> int:
        return self.embedding + self.attention + self.mlp + self.experts + self.router + self.norms + self.lm_head

    @property
    def active(self) -> int:
        """Parameters one token uses: only experts_per_token of the experts (Mixtral: ~12.9 B of 46.7 B)."""
        return self.total - self.experts + self.active_experts


def _get(config: Mapping, *keys: str, default=None):
    """The first key present: HF configs name the same thing differently per family (n_layer, num_hidden_layers)."""
    for key in keys:
        if key in config and config[key] is not None:
            return config[key]
    if default is not None:
        return default
    raise WorkshopError(f"config has none of {', '.join(keys)}; a Hugging Face config.json of a "
                        "bloom/llama/mistral/mixtral model (or the custom gpt) is expected")


def shape_from_config(config: Mapping, name: str | None = None) -> ModelShape:
    """Read a ModelShape from a config.json dict (bloom, llama, mistral, qwen2, mixtral, or the custom gpt)."""
    model_type = config.get("model_type")
    name = name or config.get("_name_or_path") or model_type or "model"
    if model_type == "bloom":
        hidden = _get(config, "hidden_size", "n_embed")
        heads = _get(config, "n_head", "num_attention_heads")
        return ModelShape(
            name=name, family="bloom", hidden_size=hidden, num_layers=_get(config, "n_layer", "num_hidden_layers"),
            num_heads=heads, num_kv_heads=heads, head_dim=hidden // heads, intermediate_size=4 * hidden,
            vocab_size=_get(config, "vocab_size"), tie_embeddings=config.get("tie_word_embeddings", True),
            gated_mlp=False, qkv_bias=True, output_bias=True, mlp_bias=True, layer_norm=True,
            embedding_norm=True, eager_attention=True,
            dropout=max(config.get("hidden_dropout", 0.0), config.get("attention_dropout", 0.0)) > 0)
    if model_type in ("llama", "mistral", "qwen2", "mixtral"):
        hidden = _get(config, "hidden_size")
        heads = _get(config, "num_attention_heads")
        experts = config.get("num_local_experts", 0) if model_type == "mixtral" else 0
        return ModelShape(
            name=name, family="mixtral" if experts else "llama", hidden_size=hidden,
            num_layers=_get(config, "num_hidden_layers"), num_heads=heads,
            num_kv_heads=_get(config, "num_key_value_heads", default=heads),
            head_dim=_get(config, "head_dim", default=hidden // heads),
            intermediate_size=_get(config, "intermediate_size"), vocab_size=_get(config, "vocab_size"),
            tie_embeddings=config.get("tie_word_embeddings", False), gated_mlp=True,
            qkv_bias=config.get("attention_bias", model_type == "qwen2"),
            output_bias=config.get("attention_bias", False), mlp_bias=config.get("mlp_bias", False),
            layer_norm=False, num_experts=experts, experts_per_token=config.get("num_experts_per_tok", 2) if experts else 0,
            eager_attention=config.get("_attn_implementation", config.get("attn_implementation")) == "eager",
            dropout=config.get("attention_dropout", 0.0) > 0)
    if model_type == "gpt":
        hidden, heads = _get(config, "hidden"), _get(config, "heads")
        return ModelShape(
            name=name, family="gpt", hidden_size=hidden, num_layers=_get(config, "layers"), num_heads=heads,
            num_kv_heads=heads, head_dim=hidden // heads, intermediate_size=_get(config, "ffn"),
            vocab_size=_get(config, "vocab"), tie_embeddings=True, gated_mlp=False, qkv_bias=True,
            output_bias=True, mlp_bias=True, layer_norm=True, learned_positions=_get(config, "seq_len"),
            dropout=config.get("dropout", 0.0) > 0)
    raise WorkshopError(f"config model_type {model_type!r} is not understood by the estimator; supported: "
                        "bloom, llama, mistral, qwen2, mixtral, gpt (set model_type in the config)")


def read_config(path: str | Path) -> dict:
    """Load a config.json (a file, or a model folder holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if path.exists() and not path.is_file():  # a FIFO or a device would block or never end
        raise WorkshopError(f"{path} is not a regular file; pass a Hugging Face config.json")
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise WorkshopError(f"no config file at {path}; pass a known model name ({', '.join(KNOWN_CONFIGS)}) "
                            "or the path of a model's config.json") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as error:
        raise WorkshopError(f"{path} is not valid JSON ({type(error).__name__}); pass a Hugging Face "
                            "config.json") from None
    if not isinstance(config, dict):
        raise WorkshopError(f"{path} holds a JSON {type(config).__name__}, not an object of settings: pass a "
                            "Hugging Face config.json (it starts with `{` and names model_type, hidden_size, …)")
    return config


def model_shape(model: str | Mapping | ModelShape) -> ModelShape:
    """A ModelShape from a known name, a config.json path, a config dict, or a ModelShape (returned as is)."""
    if isinstance(model, ModelShape):
        return model
    if isinstance(model, Mapping):
        return shape_from_config(model)
    if model in KNOWN_CONFIGS:
        return shape_from_config(KNOWN_CONFIGS[model], name=model)
    if model.endswith(".json") or Path(model).is_dir():
        config = read_config(model)
        try:
            return shape_from_config(config, name=Path(model).stem if model.endswith(".json") else model)
        except (TypeError, ValueError, AttributeError) as error:  # a value of the wrong kind, e.g. a list of sizes
            raise WorkshopError(f"{model}: a setting has a value the estimator cannot use ({error}); a Hugging "
                                "Face config.json gives sizes as whole numbers") from None
    raise WorkshopError(f"unknown model {model!r}; use one of {', '.join(KNOWN_CONFIGS)} "
                        "or the path of a config.json")


def _mlp_parameters(shape: ModelShape) -> int:
    """One MLP (or one expert): gate/up/down for SwiGLU, two matrices otherwise; biases where the family has them."""
    h, f = shape.hidden_size, shape.intermediate_size
    if shape.gated_mlp:
        return 3 * h * f + (2 * f + h if shape.mlp_bias else 0)
    return 2 * h * f + (f + h if shape.mlp_bias else 0)


def parameter_counts(model: str | Mapping | ModelShape) -> ParameterCounts:
    """Parameters by group, from the shape alone (checked against transformers' models in the tests)."""
    shape = model_shape(model)
    h, layers = shape.hidden_size, shape.num_layers
    q_out = shape.num_heads * shape.head_dim
    kv_out = shape.num_kv_heads * shape.head_dim
    attention = h * q_out + 2 * h * kv_out + q_out * h
    attention += (q_out + 2 * kv_out if shape.qkv_bias else 0) + (h if shape.output_bias else 0)
    norm = 2 * h if shape.layer_norm else h
    # Two norms per layer, one final norm, BLOOM's norm of the embeddings.
    norms = (2 * layers + 1 + (1 if shape.embedding_norm else 0)) * norm
    expert = _mlp_parameters(shape)
    return ParameterCounts(
        embedding=shape.vocab_size * h + shape.learned_positions * h,
        attention=layers * attention,
        mlp=0 if shape.is_moe else layers * _mlp_parameters(shape),
        experts=layers * shape.num_experts * expert,
        router=layers * h * shape.num_experts,
        norms=norms,
        lm_head=0 if shape.tie_embeddings else shape.vocab_size * h,
        active_experts=layers * shape.experts_per_token * expert,
    )


def parameter_tensors(model: str | Mapping | ModelShape) -> list[int]:
    """The element count of every parameter tensor, as the model registers them (fused QKV in BLOOM and the
    custom GPT, one fused tensor per expert projection in Mixtral). They add up to `parameter_counts().total`;
    DeepSpeed ZeRO-3 decides per tensor which ones stay whole on every GPU (`stage3_param_persistence_threshold`)."""
    shape = model_shape(model)
    h, f = shape.hidden_size, shape.intermediate_size
    q_out, kv_out = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    norm = [h, h] if shape.layer_norm else [h]
    tensors = [shape.vocab_size * h] + ([shape.learned_positions * h] if shape.learned_positions else [])
    tensors += norm if shape.embedding_norm else []
    layer = list(norm) * 2
    if shape.family in ("bloom", "gpt"):  # one fused QKV projection
        layer += [h * (q_out + 2 * kv_out), q_out * h]
        layer += [q_out + 2 * kv_out] if shape.qkv_bias else []
    else:
        layer += [h * q_out, h * kv_out, h * kv_out, q_out * h]
        layer += [q_out, kv_out, kv_out] if shape.qkv_bias else []
    layer += [h] if shape.output_bias else []
    if shape.is_moe:  # transformers 5: gate_up_proj (E, 2f, h) and down_proj (E, h, f), plus the router
        layer += [shape.num_experts * 2 * f * h, shape.num_experts * h * f, shape.num_experts * h]
    else:
        matrices = 3 if shape.gated_mlp else 2
        layer += [h * f] * matrices
        if shape.mlp_bias:
            layer += [f] * (matrices - 1) + [h]
    tensors += layer * shape.num_layers + norm
    tensors += [] if shape.tie_embeddings else [shape.vocab_size * h]
    return tensors


def parameter_count(model: str | Mapping | ModelShape) -> int:
    """Total parameters of a model (a known name, a config dict or path, or a ModelShape)."""
    return parameter_counts(model).total


def lora_linears(shape: ModelShape, fused: bool = False) -> dict[str, tuple[int, int]]:
    """The Linear layers LoRA may target in this family: name -> (in features, out features), per layer.

    `fused`: Megatron's layers as NeMo builds them (one linear_qkv, one linear_fc1 for gate and up), whose
    adapters are smaller than those of the Hugging Face layers they replace (r * (in + out) per Linear).
    """
    h, f = shape.hidden_size, shape.intermediate_size
    q_out, kv_out = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    if fused and shape.family in ("llama", "mixtral"):
        linears = {"linear_qkv": (h, q_out + 2 * kv_out), "linear_proj": (q_out, h)}
        if shape.family == "llama":  # Mixtral's MLPs are experts: the recipes do not put LoRA on them
            linears.update(linear_fc1=(h, 2 * f), linear_fc2=(f, h))
        return linears
    if shape.family in ("llama", "mixtral"):
        linears = {"q_proj": (h, q_out), "k_proj": (h, kv_out), "v_proj": (h, kv_out), "o_proj": (q_out, h)}
        if shape.family == "llama":
            linears.update(gate_proj=(h, f), up_proj=(h, f), down_proj=(f, h))
        return linears
    if shape.family == "bloom":
        return {"query_key_value": (h, 3 * h), "dense": (h, h), "dense_h_to_4h": (h, f), "dense_4h_to_h": (f, h)}
    return {"qkv": (h, 3 * h), "proj": (h, h)}  # custom GPT


def lora_trainable_count(model: str | Mapping | ModelShape, rank: int,
                         modules: tuple[str, ...] | list[str] | None = None, fused: bool = False) -> int:
    """Trainable parameters of LoRA rank r: each targeted Linear(in, out) gains A (r x in) and B (out x r),
    so r * (in + out) per module per layer (no bias). Default targets: the attention projections."""
    shape = model_shape(model)
    if rank <= 0:
        raise WorkshopError(f"LoRA rank {rank} must be a positive integer (the seeds use 32)")
    available = lora_linears(shape, fused)
    default = ("linear_qkv", "linear_proj") if fused and "linear_qkv" in available else shape.attention_modules
    modules = tuple(modules) if modules else default
    unknown = [name for name in modules if name not in available]
    if unknown:
        raise WorkshopError(f"LoRA target {', '.join(unknown)} is not a Linear layer of {shape.name} "
                            f"({shape.family}); choose from {', '.join(available)}")
    return shape.num_layers * sum(rank * sum(available[name]) for name in modules)
