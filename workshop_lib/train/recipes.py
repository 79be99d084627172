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
                  :func:`compile_model`); not in ``tuned``: on a workshop-sized job its compile
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

from workshop_lib.core.errors import WorkshopError
from workshop_lib.core.vocabulary import FEATURES, NOT_TUNED, RECIPE_FEATURES, parse_recipe  # noqa: F401
from workshop_lib.train.graphs import GRAPH_PAD_MULTIPLE

LARGE_BATCH_FACTOR = 4
PAD_MULTIPLE = 16  # dynamic padding rounds the batch length up to this (tensor-core friendly)
LIGER_CHUNK_BUDGET = 128  # Liger's logits chunk: up to 128 × hidden × rows/vocab rows (~2k rows at 250k words)
LOSS_CHUNK_ROWS = 1024  # rows of logits alive at once: 1024 × 250,880 × 4 bytes ≈ 1 GB
FUSED_CHUNK_ROWS = 4096  # the fused path keeps only bf16 logits and gradient: 4096 × 250,880 × 2 × 2 ≈ 4 GB


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


def liger_available() -> bool:
    """Liger's kernels are Triton: they need liger-kernel (the ``gpu`` extra) and Triton, on a GPU."""
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("liger_kernel", "triton"))


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


# ---------------------------------------------------------------- data

class UnpaddedView(torch.utils.data.Dataset):
    """A padded ``CausalLMDataset`` seen sample by sample without its padding, so a
    length-grouped sampler sees the real lengths and the collator pads per batch."""

    def __init__(self, padded):
        self.padded = padded
        self.lengths = padded.attention_mask.sum(dim=1).tolist()

    def __len__(self) -> int:
        return len(self.padded)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        length = self.lengths[index]
        return {key: value[:length] for key, value in self.padded[index].items()}


class DynamicPaddingCollator:
    """Stack samples, cutting (or padding) them to the longest real length in the batch.

    Works on padded samples (``CausalLMDataset``) and on unpadded ones (``padded=False``) alike;
    the padding side is the right, as the tokenizer pads, so cutting only drops pad columns.
    """

    def __init__(self, pad_token_id: int, multiple: int = PAD_MULTIPLE, max_length: int | None = None):
        self.pad_token_id = pad_token_id
        self.multiple = multiple
        self.max_length = max_length

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        from workshop_lib.train.data import IGNORE_INDEX

        lengths = [int(f["attention_mask"].sum()) for f in features]
        target = -(-max(lengths) // self.multiple) * self.multiple
        if self.max_length is not None:
            target = min(target, self.max_length)
        batch = {"input_ids": torch.full((len(features), target), self.pad_token_id, dtype=torch.long),
                 "attention_mask": torch.zeros((len(features), target), dtype=torch.long),
                 "labels": torch.full((len(features), target), IGNORE_INDEX, dtype=torch.long)}
        for row, (feature, length) in enumerate(zip(features, lengths)):
            for key in batch:
                batch[key][row, :length] = feature[key][:length]
        return batch


def sampler_arguments(training_argument_names: set[str], grouping: bool) -> dict:
    """The TrainingArguments that turn on length grouping in this transformers version."""
    if not grouping:
        return {}
    if "train_sampling_strategy" in training_argument_names:  # transformers >= 5.2x
        return {"train_sampling_strategy": "group_by_length"}
    if "group_by_length" in training_argument_names:
        return {"group_by_length": True}
    raise WorkshopError("this transformers version has no length-grouped sampler; drop +grouping")


# ---------------------------------------------------------------- chunked cross-entropy

def _chunk_loss_and_gradient(logits, target, scale):
    """Summed CE of one chunk of logits and its gradient (softmax − one-hot) × scale, in the logits'
    dtype. Compiled, this is two passes over the chunk (a reduction, then one elementwise kernel)
    instead of the eager path's fp32 upcast, subtraction, exponential, scatter and downcast."""
    wide = logits.float()
    log_norm = torch.logsumexp(wide, dim=-1, keepdim=True)
    loss = (log_norm.squeeze(1) - wide.gather(1, target[:, None]).squeeze(1)).sum()
    columns = torch.arange(wide.shape[1], device=wide.device)
    one_hot = (columns[None, :] == target[:, None]).to(wide.dtype)
    gradient = (torch.exp(wide - log_norm) - one_hot) * scale
    return loss, gradient.to(logits.dtype)


_FUSED_CHUNK = {}


def fused_chunk_function(backend: str = "inductor"):
    """The compiled :func:`_chunk_loss_and_gradient` (one per backend; chunk rows are dynamic)."""
    if backend not in _FUSED_CHUNK:
        _FUSED_CHUNK[backend] = torch.compile(_chunk_loss_and_gradient, backend=backend, dynamic=True,
                                              fullgraph=True)
    return _FUSED_CHUNK[backend]


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """sum CE(hidden @ weightᵀ, targets) / divisor, with the gradients computed chunk by chunk
    during the forward pass (as Liger's fused linear cross-entropy does): only one chunk of
    logits exists at a time, and no logits are kept for the backward pass."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, divisor, compute_dtype, chunk_rows, need_grad, fused):
        rows = hidden.shape[0]
        h_all = hidden.to(compute_dtype)
        w = weight.to(compute_dtype)
        grad_hidden = torch.empty_like(hidden) if need_grad else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if need_grad else None
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        scale = 1.0 / divisor  # divisor is an fp32 tensor
        for start in range(0, rows, chunk_rows):
            h = h_all[start:start + chunk_rows]
            target = targets[start:start + chunk_rows]
            if fused:
                # Scaled before the matmuls: safe in bf16/fp32, whose exponent range is fp32's.
                chunk_loss, grad_logits = fused(h @ w.t(), target, scale)
                total += chunk_loss
                if need_grad:
                    grad_hidden[start:start + chunk_rows] = (grad_logits @ w).to(hidden.dtype)
                    grad_weight += grad_logits.t() @ h
                continue
            logits = (h @ w.t()).float()
            log_norm = torch.logsumexp(logits, dim=-1)
            total += (log_norm - logits.gather(1, target[:, None]).squeeze(1)).sum()
            if not need_grad:
                continue
            # d(CE)/d(logits) = softmax - one_hot, computed in place over the chunk's logits
            logits.sub_(log_norm[:, None]).exp_()
            logits[torch.arange(h.shape[0], device=h.device), target] -= 1.0
            # Divide by the token count after the matmuls, in fp32: softmax / thousands of tokens
            # would underflow in fp16.
            grad_logits = logits.to(compute_dtype)
            del logits
            grad_hidden[start:start + chunk_rows] = ((grad_logits @ w).float() / divisor).to(hidden.dtype)
            grad_weight += (grad_logits.t() @ h).float() / divisor
        ctx.save_for_backward(grad_hidden if grad_hidden is not None else hidden.new_empty(0),
                              grad_weight if grad_weight is not None else weight.new_empty(0))
        ctx.weight_dtype = weight.dtype
        return total / divisor

    @staticmethod
    def backward(ctx, grad_output):
        grad_hidden, grad_weight = ctx.saved_tensors
        grad_h = grad_hidden * grad_output if ctx.needs_input_grad[0] else None
        grad_w = (grad_weight * grad_output).to(ctx.weight_dtype) if ctx.needs_input_grad[1] else None
        return grad_h, grad_w, None, None, None, None, None, None


@torch.compiler.disable
def chunked_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                          num_items_in_batch=None, chunk_rows: int | None = None,
                          fused_backend: str | None = None) -> torch.Tensor:
    """The causal-LM loss of ``hidden @ weightᵀ`` against ``labels`` (shifted, -100 ignored).

    Same value as Hugging Face's ``ForCausalLMLoss``: summed over labelled positions, divided
    by ``num_items_in_batch`` when the Trainer gives it, else by the number of those positions.
    ``fused_backend`` (e.g. "inductor") computes each chunk's loss and gradient with the compiled
    :func:`_chunk_loss_and_gradient`; not under fp16, whose range needs the division after the matmuls.
    """
    from workshop_lib.train.data import IGNORE_INDEX

    targets = labels[:, 1:].reshape(-1)
    hidden = hidden[:, :-1].reshape(-1, hidden.shape[-1])
    keep = targets != IGNORE_INDEX
    hidden, targets = hidden[keep], targets[keep]
    divisor = num_items_in_batch if num_items_in_batch is not None else keep.sum()
    divisor = torch.as_tensor(divisor, dtype=torch.float32, device=hidden.device).clamp(min=1)
    if torch.is_autocast_enabled(hidden.device.type):
        compute_dtype = torch.get_autocast_dtype(hidden.device.type)
    else:
        compute_dtype = weight.dtype
    fused = fused_chunk_function(fused_backend) if fused_backend and compute_dtype != torch.float16 else None
    chunk_rows = chunk_rows or (FUSED_CHUNK_ROWS if fused else LOSS_CHUNK_ROWS)
    with torch.autocast(hidden.device.type, enabled=False):
        need_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
        return _ChunkedLinearCrossEntropy.apply(hidden, weight, targets, divisor, compute_dtype, chunk_rows,
                                                need_grad, fused)


def liger_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                        num_items_in_batch=None) -> torch.Tensor:
    """The same loss as :func:`chunked_cross_entropy`, by Liger's fused linear cross-entropy (Triton):
    per chunk of rows one matmul, one kernel for the loss and the logits' gradient in place, and the
    matmuls of the gradients; no logits survive the forward."""
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    from workshop_lib.train.data import IGNORE_INDEX

    targets = labels[:, 1:].reshape(-1)
    hidden = hidden[:, :-1].reshape(-1, hidden.shape[-1])
    keep = targets != IGNORE_INDEX  # pads and unlabelled positions skip the 250k-column matmul
    hidden, targets = hidden[keep], targets[keep]
    dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else weight.dtype
    with torch.autocast("cuda", enabled=False):
        # Both operands in the autocast dtype (Liger multiplies them as given), gradients summed in fp32.
        loss = liger_fused_linear_cross_entropy(
            hidden.to(dtype), weight.to(dtype), targets, ignore_index=IGNORE_INDEX,
            reduction="sum" if num_items_in_batch is not None else "mean", accum_dtype=torch.float32,
            chunk_mem_const=LIGER_CHUNK_BUDGET)
    if num_items_in_batch is not None:
        loss = loss / torch.as_tensor(num_items_in_batch, dtype=torch.float32, device=loss.device).clamp(min=1)
    return loss


def use_chunked_loss(model, fused_backend: str | None = None, kernel: str = "chunked") -> None:
    """Make ``model(input_ids, attention_mask, labels=...)`` compute its loss with
    :func:`chunked_cross_entropy` (``kernel="liger"``: :func:`liger_cross_entropy`; no logits are
    returned then); without labels (generation) the model's own forward runs unchanged. Parameter
    names and checkpoints stay the same."""
    import types

    from transformers.modeling_outputs import CausalLMOutputWithPast

    original_forward = type(model).forward

    def forward(self, input_ids=None, attention_mask=None, labels=None, num_items_in_batch=None, **kwargs):
        if labels is None:
            return original_forward(self, input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        kwargs.pop("use_cache", None)
        outputs = self.base_model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                                  return_dict=True)
        if kernel == "liger":
            loss = liger_cross_entropy(outputs[0], self.get_output_embeddings().weight, labels, num_items_in_batch)
        else:
            loss = chunked_cross_entropy(outputs[0], self.get_output_embeddings().weight, labels,
                                         num_items_in_batch, fused_backend=fused_backend)
        return CausalLMOutputWithPast(loss=loss)

    model.forward = types.MethodType(forward, model)


# ---------------------------------------------------------------- BLOOM's attention and GELU

class _AlibiBias:
    """The additive attention bias of one forward pass (ALiBi + causal/padding mask), built once
    and reused by every block: BloomModel hands the same ``alibi`` and mask tensors to all of them.
    Holding the two keys keeps them alive, so an identity match cannot be a recycled object."""

    def __init__(self):
        self.keys = None
        self.bias = None

    def get(self, alibi, mask, batch, heads, length, dtype):
        # A bias made outside a CUDA-graph capture (its warm-up) must not be served inside it: the graph
        # would read memory it did not record, and that memory is freed after the capture.
        capturing = alibi.is_cuda and torch.cuda.is_current_stream_capturing()
        if self.keys is not None and self.keys[0] is alibi and self.keys[1] is mask \
                and self.keys[2:] == (dtype, capturing):
            return self.bias
        keys = (alibi, mask, dtype, capturing)
        # BLOOM's alibi is slope_h × (position of the key); softmax ignores a constant per query row, so
        # slope_h × (key − query position) is the same attention with small numbers near the diagonal,
        # where bf16 rounding would otherwise hit the largest weights.
        positions = alibi.reshape(batch, heads, 1, length).float()
        bias = positions - positions.transpose(-1, -2)
        if mask is None:  # no mask given: causal only
            mask = torch.ones(length, length, dtype=torch.bool, device=bias.device).tril()
        bias = bias.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else bias + mask
        self.bias = bias.clamp(min=torch.finfo(dtype).min).to(dtype)
        self.keys = keys
        return self.bias

    def forget(self) -> None:
        self.keys = self.bias = None


def _sdpa_bloom_attention(self, hidden_states, residual, alibi, attention_mask, layer_past=None,
                          use_cache=False, output_attentions=False, **kwargs):
    """BloomAttention.forward through ``scaled_dot_product_attention`` (training and full-sequence
    evaluation); with a KV cache (generation) or attention weights asked for, BLOOM's own forward."""
    batch, length, _ = hidden_states.shape
    if (layer_past is not None or output_attentions or alibi.shape[-1] != length
            or (self.pretraining_tp > 1 and self.slow_but_exact)):
        return type(self).forward(self, hidden_states, residual, alibi, attention_mask, layer_past=layer_past,
                                  use_cache=use_cache, output_attentions=output_attentions, **kwargs)
    query, key, value = self._reshape(self.query_key_value(hidden_states))  # [batch, heads, length, head_dim]
    bias = self._alibi_bias.get(alibi, attention_mask, batch, self.num_heads, length, query.dtype)
    context = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=bias, dropout_p=self.attention_dropout.p if self.training else 0.0,
        scale=self.inv_norm_factor)
    output = self.dense(context.transpose(1, 2).reshape(batch, length, self.hidden_size))
    output = residual + torch.nn.functional.dropout(output, p=self.hidden_dropout, training=self.training)
    return output, None


def _tanh_gelu(self, x):
    return torch.nn.functional.gelu(x, approximate="tanh")


def use_sdpa_attention(model) -> int:
    """Route every BloomAttention of ``model`` through :func:`_sdpa_bloom_attention`; returns how many.
    Models whose attention already is SDPA (Llama, Mixtral in transformers 5) have none."""
    import types

    if torch.cuda.is_available():
        # cuDNN's attention plans a graph for every new sequence length (seconds over the first steps
        # and evaluations, measured on an H100); the memory-efficient kernel takes the bias as it is.
        torch.backends.cuda.enable_cudnn_sdp(False)
    shared = _AlibiBias()
    count = 0
    for module in model.modules():
        if type(module).__name__ == "BloomAttention":
            module._alibi_bias = shared
            module.forward = types.MethodType(_sdpa_bloom_attention, module)
            count += 1
    return count


def use_native_gelu(model) -> int:
    """BLOOM's GELU (0.5·x·(1 + tanh(0.79788456·x·(1 + 0.044715·x²))), a custom autograd function
    of elementwise operations) as PyTorch's ``gelu(approximate="tanh")``, the same formula in one
    kernel each way; returns how many modules were changed."""
    import types

    count = 0
    for module in model.modules():
        if type(module).__name__ == "BloomGelu":
            module.forward = types.MethodType(_tanh_gelu, module)
            count += 1
    return count


COMPILE_MODES = ("blocks", "blocks-cpp", "stack", "stack-cpp", "stack-cudagraphs")


def compile_model(model, layer_class: str, mode: str = "blocks") -> int:
    """``torch.compile`` the model's transformer in place; returns how many modules were compiled.

    ``blocks``: each transformer block (regional compilation: one graph reused by all blocks, quick
    to compile). ``stack``: the whole base model (embedding, every block, final norm) as one graph,
    so the per-call costs of a compiled region (guards, autograd wrapper) are paid once per step
    instead of once per block. ``-cpp``: inductor's C++ wrapper launches the kernels instead of
    generated Python. ``stack-cudagraphs``: the stack replayed as CUDA graphs, one per batch length.
    """
    if mode not in COMPILE_MODES:
        raise WorkshopError(f"--compile-mode {mode!r}: choose one of {', '.join(COMPILE_MODES)}")
    scope, _, flavour = mode.partition("-")
    if flavour == "cpp":
        torch._inductor.config.cpp_wrapper = True  # also for the fused loss chunk compiled later
    options = {"mode": "reduce-overhead"} if flavour == "cudagraphs" else {}
    if scope == "stack":
        model.base_model.compile(**options)
        return 1
    compiled = 0
    for module in model.modules():
        if type(module).__name__ == layer_class:
            module.compile(**options)
            compiled += 1
    return compiled


# ---------------------------------------------------------------- token accounting

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
