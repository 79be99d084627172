"""The tuned recipe's pieces on a CPU: same loss and gradients, same global batch, honest padding."""

from __future__ import annotations

import copy

import pytest
import torch

from workshop_lib.core.errors import WorkshopError
from workshop_lib.core.vocabulary import FEATURES, parse_recipe
from workshop_lib.train.features.data import DynamicPaddingCollator, UnpaddedView
from workshop_lib.train.features.loss import chunked_cross_entropy, use_chunked_loss
from workshop_lib.train.models import build_model, model_spec
from workshop_lib.train.recipes import (
    ARGUMENTS,
    CALLBACKS,
    FEATURE_STEPS,
    MODEL,
    STAGES,
    TrainerParts,
    apply_features,
    apply_recipe,
)


def test_recipe_names_and_ladders_parse():
    assert parse_recipe("seed") == ()
    tuned = parse_recipe("tuned")
    assert {"bf16", "batch", "padding", "grouping", "chunked-ce", "sdpa", "gelu"} <= set(tuned)
    assert not {"compile", "large-batch"} & set(tuned)  # slower end to end; worse loss (benchmarks/NOTES.md)
    assert parse_recipe("tuned+graphs+compile+large-batch") == FEATURES
    assert parse_recipe("seed+batch+bf16") == ("bf16", "batch")  # ladder order, whatever the spelling
    with pytest.raises(WorkshopError, match="unknown feature"):
        parse_recipe("seed+turbo")
    with pytest.raises(WorkshopError, match="start with one of"):
        parse_recipe("fast")


def test_tuned_keeps_the_global_batch_and_skips_what_a_cpu_cannot_do():
    recipe = apply_recipe("tuned", precision="fp32", per_device_batch=4, grad_accum=4, device_kind="cpu", engine="hf")
    assert (recipe.per_device_batch, recipe.grad_accum, recipe.eval_batch) == (16, 1, 4)
    assert recipe.precision == "fp32" and {"bf16", "fused-adamw"} <= set(recipe.skipped)
    # No Triton kernels on a CPU: the chunked loss is the workshop's own, and the summary says so.
    assert recipe.loss_kernel == "eager" and recipe.settings()["recipe_loss_kernel"] == "eager"
    assert {"sdpa", "gelu", "chunked-ce", "padding", "grouping"} <= set(recipe.features)
    assert "compile" not in recipe.features  # its compile time lost end to end (benchmarks/NOTES.md)
    sharded = apply_recipe("tuned", precision="fp32", per_device_batch=4, grad_accum=4, device_kind="cpu",
                           engine="deepspeed", zero_stage=3)
    assert "chunked-ce" in sharded.skipped


@pytest.mark.slow  # over 5 s on a loaded 2-core machine
def test_chunked_loss_matches_the_models_own_loss_and_gradients():
    reference = build_model(model_spec("tiny-bloom"), True, 0)
    chunked = copy.deepcopy(reference)
    use_chunked_loss(chunked)
    torch.manual_seed(0)
    ids = torch.randint(3, 512, (3, 40))
    mask = torch.ones_like(ids)
    mask[1, 30:] = 0
    mask[2, 10:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    expected = reference(input_ids=ids, attention_mask=mask, labels=labels).loss
    got = chunked(input_ids=ids, attention_mask=mask, labels=labels).loss
    expected.backward()
    got.backward()
    assert torch.allclose(got, expected, atol=1e-5)
    for mine, theirs in zip(chunked.parameters(), reference.parameters()):
        assert torch.allclose(mine.grad, theirs.grad, atol=1e-6)
    assert chunked.generate(input_ids=ids[:1, :5], max_new_tokens=2, do_sample=False, pad_token_id=0).shape == (1, 7)


def _padded_batch(vocab: int = 500):
    torch.manual_seed(0)
    ids = torch.randint(3, vocab, (3, 40))
    mask = torch.ones_like(ids)
    mask[1, 30:] = 0
    mask[2, 10:] = 0
    return ids, mask, ids.masked_fill(mask == 0, -100)


@pytest.mark.slow  # over 5 s on a loaded 2-core machine
def test_sdpa_attention_and_native_gelu_compute_what_bloom_computes():
    from workshop_lib.train.features.bloom import use_native_gelu, use_sdpa_attention

    reference = build_model(model_spec("tiny-bloom"), True, 0)
    fast = copy.deepcopy(reference)
    layers = reference.config.n_layer
    assert use_sdpa_attention(fast) == layers and use_native_gelu(fast) == layers
    ids, mask, labels = _padded_batch()
    expected = reference(input_ids=ids, attention_mask=mask, labels=labels)
    got = fast(input_ids=ids, attention_mask=mask, labels=labels)
    expected.loss.backward()
    got.loss.backward()
    real = mask.bool()  # pad positions' outputs are never used
    assert torch.allclose(got.logits[real], expected.logits[real], atol=1e-5)
    for mine, theirs in zip(fast.parameters(), reference.parameters()):
        assert torch.allclose(mine.grad, theirs.grad, atol=1e-6)
    # Generation (KV cache) falls back to BLOOM's own attention: same tokens.
    prompt = dict(input_ids=ids[:1, :5], max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert torch.equal(fast.generate(**prompt), reference.generate(**prompt))


def test_sdpa_attention_ignores_padding_keys():
    # A padded row must give the same outputs as the same row alone: the bias masks the pad keys.
    from workshop_lib.train.features.bloom import use_sdpa_attention

    model = build_model(model_spec("tiny-bloom"), True, 0)
    use_sdpa_attention(model)
    ids, mask, _ = _padded_batch()
    batched = model(input_ids=ids, attention_mask=mask).logits[2, :10]
    alone = model(input_ids=ids[2:, :10], attention_mask=mask[2:, :10]).logits[0]
    assert torch.allclose(batched, alone, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="Liger's kernels are Triton: GPU only")
def test_liger_loss_matches_the_chunked_loss_on_a_gpu():
    pytest.importorskip("liger_kernel")
    from workshop_lib.train.features.loss import liger_cross_entropy

    hidden = torch.randn(3, 41, 64, device="cuda", requires_grad=True)
    weight = torch.randn(1000, 64, device="cuda", requires_grad=True)
    labels = torch.randint(0, 1000, (3, 41), device="cuda")
    labels[0, :9] = -100
    with torch.autocast("cuda", dtype=torch.bfloat16):
        got = liger_cross_entropy(hidden, weight, labels, num_items_in_batch=100)
    got.backward()
    grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    expected = chunked_cross_entropy(hidden, weight, labels, num_items_in_batch=100)
    expected.backward()
    assert torch.allclose(got, expected, rtol=2e-2)
    for mine, theirs in zip(grads, (hidden.grad, weight.grad)):
        assert ((mine - theirs).norm() / theirs.norm()).item() < 2e-2  # bf16 operands


def test_chunks_of_rows_add_up_to_the_plain_cross_entropy():
    hidden = torch.randn(2, 50, 8, requires_grad=True)
    weight = torch.randn(30, 8, requires_grad=True)
    labels = torch.randint(0, 30, (2, 50))
    chunked_cross_entropy(hidden, weight, labels, chunk_rows=7).backward()
    grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    torch.nn.functional.cross_entropy((hidden[:, :-1] @ weight.t()).reshape(-1, 30), labels[:, 1:].reshape(-1)).backward()
    assert torch.allclose(grads[0], hidden.grad, atol=1e-6) and torch.allclose(grads[1], weight.grad, atol=1e-6)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.slow  # over 5 s on a loaded 2-core machine
def test_fused_chunks_match_the_plain_cross_entropy(backend):
    # The GPU path compiles the per-chunk loss and gradient with inductor; "eager" runs the same
    # function uncompiled and "aot_eager" traces it as inductor would (dynamic chunk rows, the last short).
    hidden = torch.randn(3, 41, 8, requires_grad=True)
    weight = torch.randn(30, 8, requires_grad=True)
    labels = torch.randint(0, 30, (3, 41))
    labels[0, :9] = -100
    loss = chunked_cross_entropy(hidden, weight, labels, chunk_rows=16, fused_backend=backend)
    loss.backward()
    grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    reference = torch.nn.functional.cross_entropy((hidden[:, :-1] @ weight.t()).reshape(-1, 30),
                                                  labels[:, 1:].reshape(-1), ignore_index=-100)
    reference.backward()
    assert torch.allclose(loss, reference, atol=1e-6)
    assert torch.allclose(grads[0], hidden.grad, atol=1e-6) and torch.allclose(grads[1], weight.grad, atol=1e-6)


class Padded(torch.utils.data.Dataset):
    """Two samples padded to 6 tokens, as CausalLMDataset pads them."""

    attention_mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0]])

    def __len__(self):
        return 2

    def __getitem__(self, i):
        ids = torch.arange(6) + 10 * i
        return {"input_ids": ids, "attention_mask": self.attention_mask[i],
                "labels": ids.masked_fill(self.attention_mask[i] == 0, -100)}


def test_dynamic_padding_only_drops_pad_columns():
    view = UnpaddedView(Padded())
    assert [len(view[i]["input_ids"]) for i in range(2)] == [3, 5]
    batch = DynamicPaddingCollator(pad_token_id=0, multiple=4)([view[0], view[1]])
    assert batch["input_ids"].shape == (2, 8)  # longest 5, rounded up to 4's multiple
    assert batch["labels"][0].tolist() == [0, 1, 2] + [-100] * 5
    assert batch["attention_mask"].sum().item() == 8


def test_feature_steps_follow_the_ladder_one_step_per_feature():
    features = [step.feature for step in FEATURE_STEPS]
    assert features == [name for name in FEATURES if name in features]  # ladder order, each once
    assert {step.stage for step in FEATURE_STEPS} <= set(STAGES)
    # The two without a step change only the numbers apply_recipe returns (precision; batch and learning rate).
    assert set(FEATURES) - set(features) == {"bf16", "large-batch"}


def _parts(recipe_name: str, max_length: int = 6) -> TrainerParts:
    recipe = apply_recipe(recipe_name, precision="fp32", per_device_batch=4, grad_accum=4, device_kind="cpu",
                          engine="hf")
    return TrainerParts(recipe, Padded(), pad_token_id=0, max_length=max_length, layer_class="BloomBlock")


def test_features_change_the_trainer_parts_stage_by_stage():
    padded = Padded()
    seed = _parts("seed")
    seed.train_set = padded
    seed.model = build_model(model_spec("tiny-bloom"), random_init=True, seed=0)
    for stage in STAGES:
        apply_features(seed, stage)
    assert seed.arguments == {"dataloader_drop_last": True} and seed.collator is None and seed.callbacks == []
    assert seed.train_set is padded and "forward" not in vars(seed.model)  # the model's own loss

    tuned = _parts("tuned")
    apply_features(tuned, ARGUMENTS)
    assert tuned.arguments["dataloader_drop_last"] is False  # one batch keeps the epoch's last, short one
    assert {"train_sampling_strategy", "group_by_length"} & set(tuned.arguments) and "optim" not in tuned.arguments
    assert isinstance(tuned.train_set, UnpaddedView) and tuned.collator.multiple == 16
    tuned.model = build_model(model_spec("tiny-bloom"), random_init=True, seed=0)
    apply_features(tuned, MODEL)
    assert "forward" in vars(tuned.model)  # the chunked loss
    attention = [m for m in tuned.model.modules() if type(m).__name__ == "BloomAttention"]
    assert attention and all(m.forward.__func__.__name__ == "_sdpa_bloom_attention" for m in attention)
    gelus = [m for m in tuned.model.modules() if type(m).__name__ == "BloomGelu"]
    assert gelus and all(m.forward.__func__.__name__ == "_tanh_gelu" for m in gelus)
    apply_features(tuned, CALLBACKS)
    assert [type(c).__name__ for c in tuned.callbacks] == ["GcFreezeCallback"]
    with pytest.raises(ValueError, match="unknown stage"):
        apply_features(tuned, "optimizer")

    grouping_alone = _parts("seed+grouping", max_length=6)
    apply_features(grouping_alone, ARGUMENTS)
    assert grouping_alone.collator.multiple == 6  # real lengths for the sampler, batches padded as the seed's
    assert grouping_alone.arguments["dataloader_drop_last"] is True


@pytest.mark.slow  # over 5 s on a loaded 2-core machine
def test_compile_model_scopes_and_a_clear_error_for_an_unknown_mode():
    from workshop_lib.train.features.compile import compile_model

    model = build_model(model_spec("tiny-bloom"), random_init=True, seed=0)
    assert compile_model(model, "BloomBlock", "blocks") == model.config.n_layer
    model = build_model(model_spec("tiny-bloom"), random_init=True, seed=0)
    assert compile_model(model, "BloomBlock", "stack") == 1
    assert getattr(model.base_model, "_compiled_call_impl", None) is not None
    with pytest.raises(WorkshopError, match="--compile-mode 'whole'.*blocks-cpp"):
        compile_model(model, "BloomBlock", "whole")


@pytest.mark.slow  # over 5 s on a loaded 2-core machine
def test_gc_freeze_moves_live_objects_out_of_collection_for_the_training_only():
    import gc

    from workshop_lib.train.callbacks import GcFreezeCallback

    callback = GcFreezeCallback()
    gc.unfreeze()
    callback.on_train_begin(None, None, None)
    try:
        assert gc.get_freeze_count() > 1000  # torch, transformers and this test's objects
    finally:
        callback.on_train_end(None, None, None)
    assert gc.get_freeze_count() == 0
    assert "gc-freeze" in apply_recipe("tuned", precision="fp32", per_device_batch=4, grad_accum=4,
                                       device_kind="cpu", engine="hf").features


def test_trainer_fsdp_options_take_fsdp1_only_for_hybrid_shard(monkeypatch):
    # Transformers 5's default FSDP2 has no HYBRID_SHARD; the Trainer refuses it unless version 1.
    import argparse

    from workshop_lib.train.hf import trainer_fsdp_arguments

    def options(strategy, offload=False):
        return trainer_fsdp_arguments(argparse.Namespace(fsdp=strategy, offload=offload), "BloomBlock")

    hybrid = options("HYBRID_SHARD", offload=True)
    assert hybrid["fsdp"] == "hybrid_shard auto_wrap offload" and hybrid["fsdp_config"]["version"] == 1
    assert hybrid["optim"] == "adamw_torch"  # not the fused one, which FSDP1's loss scaler breaks
    for strategy in ("FULL_SHARD", "SHARD_GRAD_OP"):
        assert "version" not in options(strategy)["fsdp_config"] and "optim" not in options(strategy)
    from transformers import TrainingArguments

    arguments = TrainingArguments(output_dir="unused", use_cpu=True, **hybrid)  # accepted as written
    assert arguments.fsdp_config["reshard_after_forward"] == "hybrid_shard" and arguments.fsdp_config["cpu_offload"]
    # What Accelerate will build from these arguments: HYBRID_SHARD only once the strategy is pinned.
    from accelerate.utils import FullyShardedDataParallelPlugin

    from workshop_lib.train.hf import pin_fsdp1_strategy

    monkeypatch.delenv("FSDP_SHARDING_STRATEGY", raising=False)
    pin_fsdp1_strategy("HYBRID_SHARD")  # without it: FULL_SHARD (Accelerate 1.15)
    plain = TrainingArguments(output_dir="unused", use_cpu=True, **options("HYBRID_SHARD"))
    assert plain.fsdp_plugin_args["backward_prefetch"] == "BACKWARD_POST"
    # (sync_module_states and offload look for a GPU at construction; the strategy does not need them)
    plugin = FullyShardedDataParallelPlugin(**{**plain.fsdp_plugin_args, "sync_module_states": False})
    assert plugin.sharding_strategy.name == plugin.reshard_after_forward.name == "HYBRID_SHARD"
    with pytest.raises(ValueError, match="only available with FSDP1"):  # why the version is there
        TrainingArguments(output_dir="unused", use_cpu=True, fsdp="hybrid_shard auto_wrap",
                          fsdp_config={"transformer_layer_cls_to_wrap": ["BloomBlock"]})
