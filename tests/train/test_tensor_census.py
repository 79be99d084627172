"""The tensor census and the step-peak tracker on known models (no torchrun): exact byte counts."""

from __future__ import annotations

import gc

import pytest
import torch

from workshop_lib.train.tensor_census import LiveTensorPeak, MemoryProbe, census, optimizer_chain


def _mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))


def _train(model, optimizer, probe: MemoryProbe | None, steps: int = 3, batch: int = 32):
    x = torch.randn(batch, 64, device=next(model.parameters()).device)
    for step in range(1, steps + 1):
        if probe:
            probe.begin(step, model, optimizer)
        model(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if probe:
            probe.end(step)


def test_adam_model_states_are_exactly_sixteen_bytes_per_parameter():
    model = _mlp()
    optimizer = torch.optim.AdamW(model.parameters())
    probe = MemoryProbe(step=2)
    _train(model, optimizer, probe)
    psi = sum(p.numel() for p in model.parameters())
    tensors = len(list(model.parameters()))
    parts = probe.outcome()["model_state_parts"]
    # fp32 parameters 4Ψ, gradients 4Ψ, exp_avg + exp_avg_sq 8Ψ, and AdamW's 4-byte step counter per tensor.
    assert (parts["parameters"], parts["gradients"]) == (4 * psi, 4 * psi)
    assert parts["optimizer_states"] == 8 * psi + 4 * tensors
    assert probe.outcome()["model_state_bytes"] == 16 * psi + 4 * tensors
    # Between steps the gradients are gone (set_to_none): why the census is taken inside the step.
    assert census(model, optimizer).bytes["gradients"] == 0


def test_shared_storages_count_once():
    embedding = torch.nn.Embedding(100, 16)
    head = torch.nn.Linear(16, 100, bias=False)
    head.weight = embedding.weight  # tied, as GPT-2's LM head
    model = torch.nn.ModuleDict({"embedding": embedding, "head": head})
    flat = torch.zeros(1000)
    views = [flat[:500], flat[500:], flat.view(10, 100)]
    found = census(model, {"views": views})
    assert found.bytes["parameters"] == 100 * 16 * 4
    assert found.bytes["optimizer_states"] == 1000 * 4  # three views of one storage
    assert len(found.storages) == 2


def test_wrapper_attributes_are_walked_and_named():
    """ZeRO-style wrapper: flat fp32 master partitions, a gradient partition and a reduce bucket."""
    model = _mlp()

    class Wrapper:
        def __init__(self):
            self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            self.single_partition_of_fp32_groups = [torch.zeros(100)]
            self.averaged_gradients = {0: [torch.zeros(50)]}
            self.ipg_buckets = {torch.float32: [torch.zeros(25)]}
            self.meta = [torch.zeros(1000, device="meta")]  # no memory behind it

    found = census(model, Wrapper())
    assert found.bytes["optimizer_states"] == 400
    assert found.bytes["gradients"] == 200
    assert found.bytes["buckets"] == 100
    assert found.total == found.bytes["parameters"] + 600  # buckets are not model states


@pytest.mark.slow  # over 5 s on a loaded 2-core machine
def test_freed_tensors_leave_the_live_count():
    with LiveTensorPeak() as tracker:
        a = torch.empty(1000)  # 4 000 bytes
        b = torch.empty(500)
        assert tracker.live == 6000
        del a
        gc.collect()
        assert tracker.live == 2000
        c = torch.empty(250)
        assert (tracker.live, tracker.peak) == (3000, 6000)
    del b, c


def test_storages_alive_before_the_step_count_from_its_start():
    known, unseen = torch.zeros(100), torch.zeros(300)
    with LiveTensorPeak([known.untyped_storage()]) as tracker:
        temporary = known * 2  # 400 bytes: peak 800
        del temporary
        unseen.add_(1)  # first met now, but alive all along: it adds to the peak already passed
        assert (tracker.live, tracker.peak) == (400 + 1200, 800 + 1200)


def test_storage_resizes_are_followed():
    """FSDP frees gathered parameters by resizing their storage to 0 and gathers into the same storage."""
    tensor, original = torch.zeros(1000), torch.UntypedStorage.resize_
    with LiveTensorPeak([tensor.untyped_storage()]) as tracker:
        tensor.untyped_storage().resize_(0)
        assert tracker.live == 0
        tensor.untyped_storage().resize_(8000)
        assert (tracker.live, tracker.peak) == (8000, 8000)
    assert torch.UntypedStorage.resize_ is original  # the patch lives only while the step is tracked


def test_step_peak_matches_torch_memtracker():
    """torch's own tracker agrees where it sees everything (a plain model whose tensors it was told about)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    peaks = []
    for use_torch in (False, True):
        model = _mlp()
        optimizer = torch.optim.AdamW(model.parameters())
        x = torch.randn(32, 64)
        _train(model, optimizer, None, steps=1)
        if use_torch:
            tracker = MemTracker()
            tracker.track_external(model, optimizer, x)
            with tracker:
                model(x).pow(2).mean().backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            peaks.append(tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"])
        else:
            with LiveTensorPeak(census(model, optimizer, x).storages) as ours:
                model(x).pow(2).mean().backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            peaks.append(ours.peak)
    assert peaks[0] == peaks[1]


def test_model_states_are_counted_when_the_outermost_step_starts():
    """An optimizer wrapper (Accelerate, DeepSpeed) is entered first: its step() is where the count happens,
    and the instance attribute the probe set is removed afterwards."""
    model = _mlp()
    inner = torch.optim.AdamW(model.parameters())

    class Wrapper:
        def __init__(self, optimizer):
            self.optimizer = optimizer
            self.staging = None

        def step(self):
            # Built by the wrapper before the inner update (ZeRO's fp32 gradient copy): not a model state.
            self.staging = torch.zeros(1000)
            self.optimizer.step()
            self.staging = None

        def zero_grad(self, set_to_none=True):
            self.optimizer.zero_grad(set_to_none=set_to_none)

    wrapper = Wrapper(inner)
    assert optimizer_chain(wrapper) == [wrapper, inner]
    probe = MemoryProbe(step=2)
    _train(model, wrapper, probe)
    psi = sum(p.numel() for p in model.parameters())
    assert probe.outcome()["model_state_bytes"] == 16 * psi + 4 * len(inner.state)
    assert "step" not in vars(wrapper) and "step" not in vars(inner)
    assert probe.outcome()["step_peak_bytes"] > probe.outcome()["model_state_bytes"]


def test_a_run_shorter_than_the_probed_step_records_nothing():
    model = _mlp()
    optimizer = torch.optim.AdamW(model.parameters())
    probe = MemoryProbe(step=2)
    _train(model, optimizer, probe, steps=1)
    assert probe.outcome() == {"model_state_bytes": None, "model_state_parts": None, "step_peak_bytes": None,
                               "training_peak_bytes": None}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_a_gpu_the_allocator_counts_and_the_run_peak_survives_the_reset():
    from workshop_lib.train.tensor_census import cuda_peak_before_reset

    model = _mlp().cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    big = torch.empty(2**28, device="cuda")  # 1 GiB, freed before the probed step
    del big
    probe = MemoryProbe(step=2)
    _train(model, optimizer, probe)
    assert cuda_peak_before_reset() >= 2**30 > probe.outcome()["step_peak_bytes"] > 0
