"""What the memory estimator predicts, measured in the rank's own process: tensor bytes, not process RSS.

Two numbers per rank, both taken on one optimizer step (the second: the optimizer states exist by then):

* **model states** — the bytes of the unique tensor storages held by the model (parameters, FSDP flat
  shards, ZeRO partitions, buffers), the gradients and the optimizer (``.state``, and whatever a wrapper
  such as DeepSpeed's ZeRO optimizer keeps: fp32 master partitions, flat gradient buffers), counted just
  before the optimizer's update, the one moment when parameters, gradients and optimizer states all exist
  (between steps the gradients are already freed: ``zero_grad(set_to_none=True)``).
* **step peak** — the most tensor bytes alive at once during that step: the CPU analogue of
  ``torch.cuda.max_memory_allocated()``. A dispatch mode adds every new output storage when an operator
  creates it and subtracts it when Python frees the storage; what was alive when the step began is the
  census of the model states plus whatever the step touches that existed before it (the batch).

On a GPU the step peak is the allocator's own ``torch.cuda.max_memory_allocated()`` over the step (its
peak counter is reset at the step's start; :func:`cuda_peak_before_reset` keeps the run's peak whole), so
the GPU pays nothing per operator; on a CPU the dispatch mode costs tens of microseconds per operator,
on one step only.

``torch.distributed._tools.mem_tracker.MemTracker`` gives the same peak on a plain model (a test checks
it), but it needs every live tensor registered up front (it cannot reach DeepSpeed's flat buffers or FSDP's
flat parameters, and counts a buffer it was not told about as new when an in-place operator returns it)
and hooks every module; counting storages here is shorter and treats all the engines alike.
``WORKSHOP_CENSUS_TRACE=1`` prints every storage the census counted, with the path it was reached by.
"""

from __future__ import annotations

import os
import sys
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

PARTS = ("parameters", "gradients", "optimizer_states", "buffers", "buckets")
MODEL_STATE_PARTS = PARTS[:3]  # what the ZeRO paper (and workshop_lib.estimate) calls model states
MAX_DEPTH = 8  # optimizer wrappers nest: Accelerate -> DeepSpeed ZeRO -> torch AdamW -> state dicts -> tensors


def _storage(tensor: torch.Tensor):
    """The storage behind a tensor (a DTensor's local shard); None for tensors without one (meta, fake)."""
    local = getattr(tensor, "_local_tensor", None)  # DTensor: the bytes are the local shard's
    if isinstance(local, torch.Tensor):
        tensor = local
    try:
        return tensor.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def _key(storage) -> tuple:
    return storage.device.type, storage.device.index, storage.data_ptr()


def _part_of(name: str, part: str) -> str:
    """An attribute's part from its name: engines call gradient buffers *grad* and reduce buffers *bucket*."""
    name = name.lower()
    if "bucket" in name or "ipg" in name:
        return "buckets"
    return "gradients" if "grad" in name else part


def optimizer_chain(optimizer) -> list:
    """The optimizer and the ones it wraps: Accelerate and DeepSpeed ZeRO keep the next in `.optimizer`."""
    chain = []
    while optimizer is not None and all(optimizer is not seen for seen in chain):
        chain.append(optimizer)
        optimizer = getattr(optimizer, "optimizer", None)
    return chain


class Census:
    """Unique storages reachable from models and optimizers, by part (the first part a storage is met in).

    ``trace`` (a list) collects (path, part, bytes) of every storage counted, to see what an engine keeps.
    ``device_type`` ("cuda"): only storages on that kind of device count (a GPU run's census is of GPU memory,
    what the estimator predicts per GPU: states offloaded to the CPU are not in it).
    """

    def __init__(self, trace: list | None = None, device_type: str | None = None):
        self.device_type = device_type
        self.bytes = dict.fromkeys(PARTS, 0)
        self.storages: list = []  # the storages counted (the step tracker starts from them)
        self.trace = trace
        self._seen: set[tuple] = set()
        self._visited: set[int] = set()

    def release(self) -> "Census":
        """Drop the storages counted, keeping their bytes: a census kept after its step must not keep the
        step's gradients alive (set_to_none frees them only if nothing else holds them; a census that did
        held every later step's peak one gradient copy too high: 2,133 MiB on BLOOM-560m in fp32)."""
        self.storages = []
        return self

    @property
    def total(self) -> int:
        """Model states: parameters, gradients and optimizer states (buffers and reduce buckets apart)."""
        return sum(self.bytes[part] for part in MODEL_STATE_PARTS)

    def add(self, tensor: torch.Tensor, part: str, path: str = "") -> None:
        storage = _storage(tensor)
        # FSDP frees gathered parameters by resizing their storage to 0; meta tensors hold no memory.
        if storage is None or storage.nbytes() == 0 or storage.device.type == "meta":
            return
        if self.device_type is not None and storage.device.type != self.device_type:
            return
        key = _key(storage)
        if key not in self._seen:
            self._seen.add(key)
            self.storages.append(storage)
            self.bytes[part] += storage.nbytes()
            if self.trace is not None:
                self.trace.append((path, part, storage.nbytes()))

    def walk(self, obj, part: str = "optimizer_states", depth: int = 0, path: str = "") -> "Census":
        if depth > MAX_DEPTH or obj is None or isinstance(obj, (str, bytes, int, float, bool)):
            return self
        if isinstance(obj, torch.Tensor):
            self._tensor(obj, part, depth, path)
            return self
        if id(obj) in self._visited:
            return self
        self._visited.add(id(obj))
        if isinstance(obj, torch.nn.Module):
            self._module(obj, depth, path)
        elif isinstance(obj, torch.optim.Optimizer) and hasattr(obj, "state") and hasattr(obj, "param_groups"):
            for group in obj.param_groups:  # parameters the model did not hold: ZeRO's fp32 master partitions
                for index, parameter in enumerate(group["params"]):
                    self.walk(parameter, "optimizer_states", depth + 1, f"{path}.param_groups[{index}]")
            for index, state in enumerate(obj.state.values()):
                self.walk(state, "optimizer_states", depth + 1, f"{path}.state[{index}]")
            self._attributes(obj, part, depth, path)
        elif isinstance(obj, dict):
            for key, value in obj.items():
                self.walk(value, part, depth + 1, f"{path}[{key!r}]")
        elif isinstance(obj, (list, tuple, set)):
            for index, value in enumerate(obj):
                self.walk(value, part, depth + 1, f"{path}[{index}]")
        elif not _never_walk(obj):
            self._attributes(obj, part, depth, path)
        return self

    def _tensor(self, tensor: torch.Tensor, part: str, depth: int, path: str) -> None:
        self.add(tensor, part, path)
        if tensor.is_leaf and tensor.grad is not None:  # .grad of a non-leaf warns and is always None
            self.add(tensor.grad, "gradients", f"{path}.grad")
        # Tensors carry engine state as Python attributes: ZeRO-3's ds_tensor partition, FSDP's _local_shard.
        for name, value in vars(tensor).items() if hasattr(tensor, "__dict__") else ():
            if isinstance(value, (torch.Tensor, list, tuple, dict)):
                self.walk(value, _part_of(name, part), depth + 1, f"{path}.{name}")

    def _module(self, module: torch.nn.Module, depth: int, path: str) -> None:
        for name, parameter in module.named_parameters():
            self.walk(parameter, "parameters", depth + 1, f"{path}.{name}")
        for name, buffer in module.named_buffers():
            self.add(buffer, "buffers", f"{path}.{name}")
        for name, child in module.named_modules():  # FSDP1 keeps each unit's flat parameter on its handle
            handle = getattr(child, "_handle", None)
            if handle is not None and getattr(handle, "flat_param", None) is not None:
                self.walk(handle.flat_param, "parameters", depth + 1, f"{path}.{name}._handle.flat_param")

    def _attributes(self, obj, part: str, depth: int, path: str) -> None:
        for name, value in getattr(obj, "__dict__", {}).items():
            self.walk(value, _part_of(name, part), depth + 1, f"{path}.{name}")


def _never_walk(obj) -> bool:
    """Objects whose attributes hold no model state but may lead anywhere (data, code, processes)."""
    from torch.utils.data import DataLoader, Dataset

    return (isinstance(obj, (DataLoader, Dataset, type)) or callable(obj)
            or type(obj).__module__.startswith(("builtins", "logging", "threading")))


def census(*roots, trace: list | None = None, device_type: str | None = None) -> Census:
    """The model-state census of models and optimizers (pass the model first: its tensors count as parameters);
    with ``device_type``, of the storages on that kind of device only."""
    found = Census(trace, device_type)
    for root in roots:
        found.walk(root, "parameters" if isinstance(root, torch.nn.Module) else "optimizer_states",
                   path=type(root).__name__)
    return found


class LiveTensorPeak(TorchDispatchMode):
    """Peak bytes of live tensor storages while active, starting from `known` storages already alive.

    Every operator's outputs that bring a storage not seen before are new allocations; a storage that
    first shows up as an *input* existed before the mode started (the batch, an engine's buffer) and
    counts from the start. Python frees a storage exactly when its last tensor goes away, so a weakref
    callback subtracts it. FSDP frees and re-allocates gathered parameters with ``UntypedStorage.resize_``,
    which no dispatch mode sees: it is patched while the mode is active.
    """

    def __init__(self, known=()):
        super().__init__()
        self.live = 0
        self.peak = 0
        self._cells: dict[int, list] = {}  # id(storage) -> [bytes counted, weakref]
        for storage in known:
            self._track(storage, new=False)

    def _track(self, storage, new: bool) -> None:
        cell = self._cells.get(id(storage))
        if cell is None:
            ident = id(storage)
            cell = [0, weakref.ref(storage, lambda _, ident=ident: self._freed(ident))]
            self._cells[ident] = cell
            if not new:  # alive before the mode started: part of every moment since
                self.peak += storage.nbytes()
        self._resized(cell, storage.nbytes())

    def _resized(self, cell: list, nbytes: int) -> None:
        self.live += nbytes - cell[0]
        cell[0] = nbytes
        self.peak = max(self.peak, self.live)

    def _freed(self, ident: int) -> None:
        cell = self._cells.pop(ident, None)
        if cell is not None:
            self.live -= cell[0]

    def _see(self, values, new: bool) -> None:
        for value in tree_leaves(values):
            if isinstance(value, torch.Tensor):
                storage = _storage(value)
                if storage is not None and storage.device.type != "meta":
                    self._track(storage, new)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(getattr(kind, "__name__", "") == "DTensor" for kind in types):
            return NotImplemented  # let DTensor run its local ops, which come back through this mode
        kwargs = kwargs or {}
        self._see((args, kwargs), new=False)
        out = func(*args, **kwargs)
        self._see(out, new=True)
        return out

    def __enter__(self):
        original = self._original_resize = torch.UntypedStorage.resize_
        tracker = self

        def resize_(storage, size):
            tracker._track(storage, new=False)
            result = original(storage, size)
            tracker._track(storage, new=True)
            return result

        torch.UntypedStorage.resize_ = resize_
        return super().__enter__()

    def __exit__(self, *exc):
        torch.UntypedStorage.resize_ = self._original_resize
        self._cells.clear()  # drop the weakrefs: nothing is counted after the step
        return super().__exit__(*exc)


_cuda_peaks_before_reset = {"allocated": 0, "reserved": 0}


def cuda_peak_before_reset(kind: str = "allocated") -> int:
    """The CUDA peak (allocated or reserved bytes) reached before a probe reset the counters (0 if none did)."""
    return _cuda_peaks_before_reset[kind]


def _reset_cuda_peaks() -> None:
    """Reset the allocator's peak counters, keeping the run's peak whole in :func:`cuda_peak_before_reset`."""
    peaks = _cuda_peaks_before_reset
    peaks["allocated"] = max(peaks["allocated"], torch.cuda.max_memory_allocated())
    peaks["reserved"] = max(peaks["reserved"], torch.cuda.max_memory_reserved())
    torch.cuda.reset_peak_memory_stats()


def _on_cuda(model) -> bool:
    """Whether the model's parameters live on a CUDA device (the allocator then counts its step)."""
    if not torch.cuda.is_available():
        return False
    parameters = getattr(model, "parameters", None)
    first = next(iter(parameters()), None) if callable(parameters) else None
    return first is not None and first.device.type == "cuda"


class MemoryProbe:
    """Measures one optimizer step (``step``, 1-based) of a training loop on this rank, and on a GPU the
    training peak: the allocator's peak over every step, from its first forward to its ``zero_grad``.

    Call ``begin(step, model, optimizer)`` before every step's first forward and ``end(step)`` after its
    ``zero_grad``; ``outcome()`` gives the summary fields (None where the run had fewer steps).
    The process peak (``torch.cuda.max_memory_allocated`` at the end) also holds what evaluation, answer
    generation and checkpointing allocate between steps; the training peak is what a training step needs,
    what the book's peak column and the estimator are about.

    The model states are counted when the first ``step()`` of the optimizer chain is entered: gradients
    are complete and nothing of the update exists yet. DeepSpeed calls its ZeRO optimizer's ``step()``
    from the engine, inside the last micro-batch's backward; by the time the inner torch optimizer runs,
    ZeRO has already built a transient fp32 copy of the gradient partition, which is not a model state.
    """

    def __init__(self, step: int = 2, device_kind: str | None = None):
        """``device_kind``: the run's device ("cuda", "cpu"), which decides how the step is measured: on a GPU
        by the allocator, and the census of GPU tensors only. None: where the model's first parameter lives,
        which misreads a model whose parameters are offloaded to the CPU (FSDP's offload) as a CPU run."""
        self.step = step
        self.device_kind = device_kind
        self.model_states: Census | None = None
        self.step_peak: int | None = None
        self.training_peak: int | None = None  # GPU only: the largest allocator peak of any step
        self._window_on_cuda = False  # whether the step begun last is counted by the allocator
        self._tracker: LiveTensorPeak | str | None = None  # "cuda": the allocator counts
        self._patched: list[tuple] = []  # (optimizer, its own instance attribute `step` or None)
        self.trace: list | None = [] if os.environ.get("WORKSHOP_CENSUS_TRACE") else None

    def begin(self, step: int, model, optimizer) -> None:
        on_cuda = self.device_kind == "cuda" if self.device_kind else _on_cuda(model)
        self._window_on_cuda = on_cuda
        if on_cuda:  # every step's window starts from zero: what ran between steps is not counted in it
            _reset_cuda_peaks()
        if step != self.step or self._tracker is not None:
            return
        roots = (model, optimizer)
        for link in optimizer_chain(optimizer):
            if callable(getattr(link, "step", None)):
                self._count_before_step(link, roots, "cuda" if on_cuda else None)
        if on_cuda:  # a CPU model on a GPU machine is counted tensor by tensor, like on a CPU
            self._tracker = "cuda"  # the counters were reset above, at this step's start
        else:
            self._tracker = LiveTensorPeak(census(*roots).storages)
            self._tracker.__enter__()

    def _count_before_step(self, link, roots, device_type: str | None) -> None:
        original = link.step

        def step(*args, **kwargs):
            if self.model_states is None:
                self.model_states = census(*roots, trace=self.trace, device_type=device_type).release()
            return original(*args, **kwargs)

        self._patched.append((link, getattr(link, "__dict__", {}).get("step")))
        link.step = step  # an instance attribute: the class's step (and torch's hooks on it) stay untouched

    def end(self, step: int) -> None:
        if self._window_on_cuda:
            peak = torch.cuda.max_memory_allocated()
            self.training_peak = max(self.training_peak or 0, peak)
            if os.environ.get("WORKSHOP_STEP_PEAKS"):  # which step sets the training peak, for engine developers
                print(f"step-peak[{os.environ.get('RANK', '0')}] step {step} {peak / 2**20:.1f} MiB", file=sys.stderr)
        if step != self.step or self._tracker is None or self.step_peak is not None:
            return
        if self._tracker == "cuda":
            self.step_peak = torch.cuda.max_memory_allocated()
        else:
            self._tracker.__exit__(None, None, None)
            self.step_peak = self._tracker.peak
        for link, own in self._patched:
            if own is None:
                del link.step
            else:
                link.step = own
        self._patched.clear()
        if self.trace:  # WORKSHOP_CENSUS_TRACE=1: what the census counted, for engine developers
            for path, part, nbytes in self.trace:
                print(f"census[{os.environ.get('RANK', '0')}] {part:16s} {nbytes:>12,d} {path}", file=sys.stderr)

    def outcome(self) -> dict:
        states = self.model_states
        return {"model_state_bytes": states.total if states else None,
                "model_state_parts": dict(states.bytes) if states else None,
                "step_peak_bytes": self.step_peak, "training_peak_bytes": self.training_peak}
