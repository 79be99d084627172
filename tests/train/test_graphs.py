"""The recipe's CUDA-graph feature: same names, same numbers, eager wherever a graph cannot go."""

from __future__ import annotations

import pytest
import torch

from workshop_lib.train.features.bloom import use_native_gelu, use_sdpa_attention
from workshop_lib.train.features.loss import use_chunked_loss
from workshop_lib.train.graphs import GraphedBlocks, use_cuda_graphs
from workshop_lib.train.models import build_model, model_spec
from workshop_lib.train.recipes import apply_recipe


def _batch(batch: int, length: int, pad_rows: dict[int, int], device="cpu", vocab: int = 500, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (batch, length), generator=generator)
    mask = torch.ones_like(ids)
    for row, real in pad_rows.items():
        mask[row, real:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    return {key: value.to(device) for key, value in dict(input_ids=ids, attention_mask=mask, labels=labels).items()}


def _tuned_model(device="cpu"):
    model = build_model(model_spec("tiny-bloom"), True, 0).to(device).train()
    use_chunked_loss(model)
    use_sdpa_attention(model)
    use_native_gelu(model)
    return model


def test_graphs_apply_only_where_they_can():
    cpu = apply_recipe("tuned+graphs", precision="fp32", per_device_batch=4, grad_accum=4, device_kind="cpu",
                       engine="hf")
    assert "graphs" in cpu.skipped and "graphs" not in cpu.features and cpu.pad_multiple == 16
    if torch.cuda.is_available():
        gpu = apply_recipe("tuned+graphs", precision="fp16", per_device_batch=4, grad_accum=4, device_kind="cuda",
                           engine="hf")
        assert "graphs" in gpu.features and gpu.pad_multiple == 64
        assert gpu.settings()["recipe_pad_multiple"] == 64
        ddp = apply_recipe("tuned+graphs", precision="fp16", per_device_batch=4, grad_accum=4, device_kind="cuda",
                           engine="hf", world_size=2)
        assert "graphs" in ddp.skipped and ddp.pad_multiple == 16
        accumulating = apply_recipe("seed+graphs", precision="fp16", per_device_batch=4, grad_accum=4,
                                    device_kind="cuda", engine="hf")
        assert "graphs" in accumulating.skipped


@pytest.mark.slow  # over 5 s on a loaded 2-core machine
def test_graphed_blocks_keep_names_and_numbers_on_the_eager_path():
    reference, graphed = _tuned_model(), _tuned_model()
    wrapper = use_cuda_graphs(graphed, batch_size=3)
    assert isinstance(wrapper, GraphedBlocks) and graphed.transformer.h is wrapper
    assert list(graphed.state_dict()) == list(reference.state_dict())  # checkpoints load either way
    assert use_cuda_graphs(torch.nn.Linear(2, 2), batch_size=3) is None  # not a BLOOM: nothing changed
    batch = _batch(3, 40, {1: 30, 2: 10})
    expected, got = reference(**batch).loss, graphed(**batch).loss
    expected.backward()
    got.backward()
    assert torch.allclose(got, expected, atol=1e-6)
    for mine, theirs in zip(graphed.parameters(), reference.parameters()):
        assert torch.allclose(mine.grad, theirs.grad, atol=1e-7)
    state = wrapper.graph_state
    assert state.eager_calls == 1 and state.captures == 0  # a CPU tensor never enters a graph
    # Evaluation and generation iterate the blocks themselves.
    graphed.eval()
    assert list(iter(wrapper)) == list(wrapper._modules.values())
    prompt = dict(input_ids=batch["input_ids"][:1, :5], max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert torch.equal(graphed.generate(**prompt), reference.eval().generate(**prompt))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_graphs_replay_what_eager_computes_for_every_shape_and_padding():
    reference, graphed = _tuned_model("cuda"), _tuned_model("cuda")
    state = use_cuda_graphs(graphed, batch_size=4).graph_state
    # Two shapes, each seen twice with different padding (a bias frozen at capture would show), then a
    # short batch (eager); every step compared with eager on the same weights, after an optimizer step.
    batches = [_batch(4, 64, {1: 50, 3: 20}, "cuda", seed=1), _batch(4, 128, {0: 100}, "cuda", seed=2),
               _batch(4, 64, {0: 7, 2: 60}, "cuda", seed=3), _batch(4, 128, {2: 65, 3: 90}, "cuda", seed=4),
               _batch(2, 64, {1: 33}, "cuda", seed=5)]
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (reference, graphed)]
    for batch in batches:
        losses = []
        for model, optimizer in zip((reference, graphed), optimizers):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(**batch).loss
            loss.backward()
            losses.append(loss.detach())
        assert torch.allclose(losses[0], losses[1], rtol=1e-3), losses
        for (name, mine), theirs in zip(graphed.named_parameters(), reference.parameters()):
            error = ((mine.grad - theirs.grad).norm() / theirs.grad.norm().clamp(min=1e-12)).item()
            assert error < 1e-2, f"{name}: gradient differs by {error:.2e} (relative norm) at length {batch['input_ids'].shape[1]}"
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    assert (state.captures, state.replays, state.eager_calls) == (2, 4, 1)
    assert state.summary()["graph_shapes"] == [64, 128]
    # After training, evaluation and generation (KV cache) take BLOOM's own path: no replay, no capture.
    prompt = dict(input_ids=batches[0]["input_ids"][:1, :6], max_new_tokens=4, do_sample=False, pad_token_id=0)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        graphed.eval(), reference.eval()
        plain = {k: v for k, v in batches[1].items() if k != "labels"}
        assert torch.allclose(graphed(**plain).logits.float(), reference(**plain).logits.float(), atol=2e-2)
        assert graphed.generate(**prompt).shape == (1, 10)
    assert (state.captures, state.replays) == (2, 4)
