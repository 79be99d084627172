"""Stand-ins for packages that NeMo's `llm finetune` path imports but never calls on one GPU.

Installed as a .pth file beside the carried wheels (see benchmarks/NOTES.md, "NeMo on the lent GPU"): the
device machine takes at most 64 MiB per call, and these four (~49 MiB of wheels) are only imported along the
way: PuLP by modelopt's search code, boto3/botocore by accelerate's SageMaker config, jieba by NeMo's Chinese
tokenizers. Any attribute of a stub module is an empty class, so `from pulp import LpProblem` and
`class X(botocore.Y)` succeed; calling into one does nothing useful, and nothing on the training path does.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

STUBBED = ("pulp", "boto3", "botocore", "jieba")


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        stub = type(name, (), {"__init__": lambda self, *args, **kwargs: None, "__module__": self.__name__})
        setattr(self, name, stub)
        return stub


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []  # a package, so `import botocore.exceptions` finds a submodule stub too
        module.__version__ = "0+workshop.stub"
        return module

    def exec_module(self, module):
        pass


class _StubFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(name, _StubLoader(), is_package=True)
        return None


def install() -> None:
    if not any(isinstance(finder, _StubFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _StubFinder())
