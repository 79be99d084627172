"""The ``chunked-ce`` feature: the causal-LM loss without the full (tokens × vocabulary) logits.

The cross-entropy over the vocabulary is computed in row chunks, only on the positions that have a label,
with each chunk's gradient made during the forward pass: the (tokens × 250,880) fp32 logits never exist
at once. On a GPU with liger-kernel installed, Liger's fused linear cross-entropy kernel
(:func:`liger_cross_entropy`); elsewhere the workshop's own chunks (:func:`chunked_cross_entropy`, same
math), whose per-chunk loss and gradient inductor fuses under ``compile``.
"""

from __future__ import annotations

import torch

from workshop_lib.train.data import IGNORE_INDEX

LIGER_CHUNK_BUDGET = 128  # Liger's logits chunk: up to 128 × hidden × rows/vocab rows (~2k rows at 250k words)
LOSS_CHUNK_ROWS = 1024  # rows of logits alive at once: 1024 × 250,880 × 4 bytes ≈ 1 GB
FUSED_CHUNK_ROWS = 4096  # the fused path keeps only bf16 logits and gradient: 4096 × 250,880 × 2 × 2 ≈ 4 GB


def liger_available() -> bool:
    """Liger's kernels are Triton: they need liger-kernel (the ``gpu`` extra) and Triton, on a GPU."""
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("liger_kernel", "triton"))


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
