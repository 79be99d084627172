"""The ``compile`` feature: ``torch.compile`` of the model's transformer, in one of several ways.

Not in ``tuned``: on a workshop-sized job its compile time costs more than it saves (benchmarks/NOTES.md).
"""

from __future__ import annotations

import torch

from workshop_lib.core.errors import WorkshopError

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
