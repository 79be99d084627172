"""Steps every entry point takes: tokenizer, tokenized data, the log header, the summary."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

from workshop_lib.train.cli import autocast_dtype
from workshop_lib.train.data import (
    CausalLMDataset,
    QAExample,
    first_examples,
    hub_tokenizer,
    load_squad,
    local_tokenizer,
    weak_scaling_subset,
)
from workshop_lib.train.evaluation import exact_match_and_f1, generate_answers
from workshop_lib.train.models import ModelSpec, uses_local_tokenizer
from workshop_lib.train.runtime import Runtime, print_main


@dataclass(frozen=True)
class PreparedData:
    train: CausalLMDataset
    validation: CausalLMDataset
    generation_examples: list[QAExample]  # scored by EM/F1 after training
    source: str


def load_tokenizer(spec: ModelSpec, random_init: bool, runtime: Runtime):
    if uses_local_tokenizer(spec, random_init):
        return local_tokenizer(runtime)
    return hub_tokenizer(spec.hub_name)


def prepare_data(data_spec: str, runtime: Runtime, tokenizer, train_samples: int, eval_samples: int,
                 generation_samples: int, max_length: int, per_gpu: int | None = None) -> PreparedData:
    """Tokenized train/validation sets. With ``per_gpu`` the train set follows weak scaling."""
    splits = load_squad(data_spec, runtime)
    if per_gpu is not None:
        train = weak_scaling_subset(splits.train, per_gpu, runtime.world_size)
    else:
        train = first_examples(splits.train, train_samples, "--samples")
    validation = first_examples(splits.validation, eval_samples, "--eval-samples")
    generation = validation[:generation_samples]
    return PreparedData(CausalLMDataset(train, tokenizer, max_length),
                        CausalLMDataset(validation, tokenizer, max_length), generation, splits.source)


def print_header(runtime: Runtime, engine: str, model: str, trainable: int, total: int, **details) -> None:
    """A few lines at the top of the job log saying what runs where."""
    pct = 100.0 * trainable / total if total else 0.0
    lines = [f"== workshop train: engine={engine} model={model} world_size={runtime.world_size} "
             f"nodes={runtime.nodes} device={runtime.device_kind}",
             f"== parameters: {total:,} total, {trainable:,} trainable ({pct:.2f} %)"]
    if details:
        lines.append("== " + " ".join(f"{k}={v}" for k, v in details.items()))
    print_main(runtime, *lines)


def answer_quality(model, generating_module, tokenizer, examples, runtime: Runtime, precision: str,
                   max_length: int) -> tuple[float, float]:
    """EM and F1 (percent) by greedy generation; every rank must call it.

    ``model`` is the engine's wrapper: an FSDP1 wrapper gathers full parameters for the duration;
    other sharded models (ZeRO-3) generate in lockstep across ranks.
    """
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    is_fsdp1 = isinstance(model, FSDP)
    gather = FSDP.summon_full_params(model, writeback=False) if is_fsdp1 else nullcontext()
    dtype = autocast_dtype(precision)
    with gather, torch.autocast(runtime.device_kind, dtype=dtype, enabled=dtype is not None):
        predictions = generate_answers(generating_module, tokenizer, examples, runtime.device,
                                       max_length, synced=runtime.world_size > 1 and not is_fsdp1)
    return exact_match_and_f1(predictions, examples)
