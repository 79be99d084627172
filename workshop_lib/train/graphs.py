"""The recipe's ``graphs`` feature: a training step's transformer blocks replayed as CUDA graphs.

Why: the tuned step (16 samples of ~220 tokens on BLOOM-560m) is bound by the host launching kernels,
not by the GPU (benchmarks/NOTES.md: ~70 ms a step on an H100 against ~14 ms of matmul work). The 24
blocks launch about a thousand kernels a step, forward and backward; a CUDA graph launches them as one.

How: ``torch.cuda.make_graphed_callables`` captures the stack of blocks, forward and backward, the first
time a training batch of a new shape arrives (a capture costs about two eager steps); the collator pads
to a multiple of :data:`GRAPH_PAD_MULTIPLE`, so a job sees a handful of shapes. All captures share one
memory pool. The embedding, the loss, the optimizer, evaluation and generation stay eager, and so does
any batch the graphs cannot take (the last, shorter batch of an epoch; a KV cache).

Where it applies (``recipes.apply_recipe`` checks): a CUDA device, one process, the plain engine, no
gradient accumulation (the graph's gradient buffers become the parameters' ``.grad``, so a second
backward before the optimizer step would overwrite the first).
"""

from __future__ import annotations

import torch

GRAPH_PAD_MULTIPLE = 64  # 5-7 batch shapes per job on the synthetic SQuAD prompts (benchmarks/NOTES.md)
# Eager forward+backward passes before the first capture (lazy CUDA, cuBLAS and attention set-up happen
# there, outside the graph); later shapes run the same kernels, already set up.
FIRST_WARMUP_ITERATIONS = 1


def _first(output):
    return output[0] if isinstance(output, tuple) else output


class BlockStack(torch.nn.Module):
    """The blocks of one model, called one after the other as BloomModel calls them in training.

    A new one is made for every captured shape: ``make_graphed_callables`` replaces its ``forward``."""

    def __init__(self, blocks: list[torch.nn.Module]):
        super().__init__()
        self.blocks = torch.nn.ModuleList(blocks)

    def forward(self, hidden_states, alibi, attention_mask=None):
        for block in self.blocks:
            hidden_states = _first(block(hidden_states, alibi=alibi, attention_mask=attention_mask))
        return hidden_states


class GraphedBlocks(torch.nn.ModuleList):
    """A drop-in for ``BloomModel.h``: the same blocks under the same names (checkpoints unchanged).

    While training with gradients on, iterating it yields one callable that runs all the blocks,
    through a CUDA graph where the batch allows; otherwise it yields the blocks themselves, so
    evaluation, generation and attention outputs take BLOOM's own path."""

    def __init__(self, blocks, batch_size: int):
        super().__init__(blocks)
        self.__dict__["graph_state"] = _GraphState(list(blocks), batch_size)  # not a submodule

    def __iter__(self):
        if self.training and torch.is_grad_enabled():
            return iter((self.graph_state,))
        return super().__iter__()


class _GraphState:
    """Called as BloomModel calls a block; holds one graphed stack per (shape, mask) seen."""

    def __init__(self, blocks: list[torch.nn.Module], batch_size: int):
        self.blocks = blocks
        self.batch_size = batch_size
        self.eager = BlockStack(blocks)
        self.graphed: dict[tuple, torch.nn.Module] = {}
        self.pool = None
        self.captures = 0
        self.capture_seconds = 0.0
        self.replays = 0
        self.eager_calls = 0

    def __call__(self, hidden_states, layer_past=None, attention_mask=None, use_cache=False,
                 output_attentions=False, alibi=None, **kwargs):
        graphable = (hidden_states.is_cuda and layer_past is None and not use_cache and not output_attentions
                     and not kwargs.get("head_mask") and hidden_states.shape[0] == self.batch_size)
        if not graphable:
            self.eager_calls += 1
            for block in self.blocks:
                hidden_states = _first(block(hidden_states, layer_past=layer_past, attention_mask=attention_mask,
                                             use_cache=use_cache, output_attentions=False, alibi=alibi))
            return hidden_states, None
        inputs = (hidden_states, alibi) + ((attention_mask,) if attention_mask is not None else ())
        key = tuple((tuple(t.shape), t.dtype) for t in inputs)
        stack = self.graphed.get(key)
        if stack is None:
            stack = self.graphed[key] = self._capture(inputs)
        self.replays += 1
        return stack(*inputs), None

    def _capture(self, inputs: tuple[torch.Tensor, ...]) -> torch.nn.Module:
        import time

        started = time.perf_counter()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        samples = tuple(t.detach().clone().requires_grad_(t.requires_grad) for t in inputs)
        dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else None
        # The captured autograd graph keeps the parameters' AccumulateGrad nodes of the capture stream
        # alive; autograd then synchronises the streams itself (correct, a few µs) and would warn each run.
        quiet = getattr(torch.autograd.graph, "set_warn_on_accumulate_grad_stream_mismatch", None)
        if quiet is not None:
            quiet(False)
        self._forget_attention_bias()  # a bias cached from an eager pass would be baked into the graph
        # make_graphed_callables refuses autocast's weight cache: the graph must redo the casts every replay.
        with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None, cache_enabled=False):
            stack = torch.cuda.make_graphed_callables(BlockStack(self.blocks), samples,
                                                      num_warmup_iters=0 if self.captures else FIRST_WARMUP_ITERATIONS,
                                                      pool=self.pool)
        self._forget_attention_bias()
        self.captures += 1
        self.capture_seconds += time.perf_counter() - started  # make_graphed_callables synchronises at its end
        return stack

    def _forget_attention_bias(self) -> None:
        for block in self.blocks:
            cache = getattr(getattr(block, "self_attention", None), "_alibi_bias", None)
            if cache is not None:
                cache.forget()

    def summary(self) -> dict:
        return {"graph_captures": self.captures, "graph_capture_s": round(self.capture_seconds, 3),
                "graph_replays": self.replays, "graph_eager_calls": self.eager_calls,
                "graph_shapes": sorted(key[0][0][1] for key in self.graphed)}


def use_cuda_graphs(model, batch_size: int) -> GraphedBlocks | None:
    """Replace the model's ``BloomModel.h`` by :class:`GraphedBlocks`; ``None`` for other models."""
    base = getattr(model, "base_model", model)
    blocks = getattr(base, "h", None)
    if not isinstance(blocks, torch.nn.ModuleList) or not len(blocks) \
            or type(blocks[0]).__name__ != "BloomBlock":
        return None
    graphed = GraphedBlocks(list(blocks._modules.values()), batch_size)
    base.h = graphed
    return graphed
