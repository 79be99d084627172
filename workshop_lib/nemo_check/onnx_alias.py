"""Old ``torch.onnx`` module names, aliased to where torch >= 2.9 keeps them (installed as a .pth file).

NeMo 2.4.1 pins nvidia-modelopt <= 0.31, whose quantization export imports ``torch.onnx._type_utils``,
``torch.onnx._internal.jit_utils``, ``torch.onnx._globals`` and the private ``_attention_scale`` of
``torch.onnx.symbolic_opset14``. Torch 2.9 moved them under ``torch.onnx._internal.torchscript_exporter``,
so ``from nemo.collections import llm`` fails on the CPU torch the checking environment uses. This
finder answers those four names with the moved modules and touches nothing else. Nothing here is used
by the jobs: NeMo's container has the torch it was built with.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

_MOVED = "torch.onnx._internal.torchscript_exporter."
ALIASES = {
    "torch.onnx._type_utils": _MOVED + "_type_utils",
    "torch.onnx._internal.jit_utils": _MOVED + "jit_utils",
    "torch.onnx._globals": _MOVED + "_globals",
    "torch.onnx.symbolic_opset14": _MOVED + "symbolic_opset14",
}


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        return importlib.import_module(self.target)

    def exec_module(self, module):  # the target module is already executed
        pass


class OnnxAliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        moved = ALIASES.get(name)
        if moved is None or importlib.util.find_spec(moved.rsplit(".", 1)[0]) is None:
            return None  # not one of ours, or a torch that still has the old layout
        return importlib.util.spec_from_loader(name, _AliasLoader(moved))


def install() -> None:
    if not any(isinstance(finder, OnnxAliasFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, OnnxAliasFinder())
