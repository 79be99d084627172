"""The peak the book shows is the training steps' own: what runs between steps (evaluation, answer generation)
raises the process's peak but not it, and it equals the step census's peak once the steps are alike.

On a GPU the probe resets the allocator's peak counter at every step's start and takes the largest peak seen
at a step's end; the process peak (`peak_memory_mib`) keeps everything. The CPU half checks what a summary and
the tables make of it, with records written by the real writer.
"""

from __future__ import annotations

import json

import pytest
import torch

from workshop_lib.core.metrics_schema import validate_record
from workshop_lib.results.read import read_run
from workshop_lib.train.metrics import peak_memory_mib
from workshop_lib.train.tensor_census import MemoryProbe

MIB = 2**20
EVALUATION_BYTES = 512 * MIB  # far above what a step of the small model allocates


def _mlp(device) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)).to(device)


def _train(model, optimizer, probe, steps: int, between_steps=None) -> list[int]:
    """Steps with the probe around each; returns each step's own allocator peak, read independently."""
    x = torch.randn(64, 256, device=next(model.parameters()).device)
    own_peaks = []
    for step in range(1, steps + 1):
        probe.begin(step, model, optimizer)
        model(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        probe.end(step)
        if x.is_cuda:
            own_peaks.append(torch.cuda.max_memory_allocated())  # the probe reset it at this step's start
        if between_steps:
            between_steps()
    return own_peaks


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the allocator's counters need a GPU")
def test_on_a_gpu_the_training_peak_leaves_out_evaluation_and_equals_the_step_census():
    model = _mlp("cuda")
    optimizer = torch.optim.AdamW(model.parameters())
    probe = MemoryProbe(step=2, device_kind="cuda")

    def evaluation():  # a large allocation between steps, then freed, as an evaluation pass does
        scratch = torch.empty(EVALUATION_BYTES, dtype=torch.uint8, device="cuda")
        del scratch

    own_peaks = _train(model, optimizer, probe, steps=4, between_steps=evaluation)
    outcome = probe.outcome()
    process_peak_mib, kind = peak_memory_mib("cuda")
    assert kind == "cuda_max_allocated"
    assert outcome["training_peak_bytes"] == max(own_peaks)
    assert outcome["training_peak_bytes"] == outcome["step_peak_bytes"]  # steps 2-4 alike: pinned to the census
    assert process_peak_mib * MIB >= EVALUATION_BYTES > outcome["training_peak_bytes"]


def test_on_a_cpu_no_training_peak_is_claimed():
    model = _mlp("cpu")
    optimizer = torch.optim.AdamW(model.parameters())
    probe = MemoryProbe(step=2, device_kind="cpu")
    _train(model, optimizer, probe, steps=3)
    assert probe.outcome()["training_peak_bytes"] is None
    assert probe.outcome()["step_peak_bytes"] > 0


def _summary(**memory) -> dict:
    """A GPU run's summary record as the writer makes it (checked against the schema)."""
    record = {"kind": "summary", "engine": "deepspeed", "settings": {}, "model": "bloom-560m", "world_size": 2,
              "nodes": 1, "precision": "fp16", "device": "cuda", "samples": 1000, "train_runtime_s": 10.0,
              "samples_per_s": 100.0, "mean_step_time_s": 0.5, "final_loss": 1.0, "eval_loss": 1.1,
              "eval_em": None, "eval_f1": None, "trainable_params": 10, "total_params": 10,
              "local_params_per_rank": [10, 10], "peak_memory_kind": "cuda_max_allocated",
              "model_state_bytes_per_rank": [None, None], "model_state_parts_per_rank": [None, None],
              "step_peak_bytes_per_rank": [None, None], **memory}
    validate_record(record)
    return record


@pytest.mark.parametrize("training, shown, scope", [
    ([9000 * MIB, 9500 * MIB], 9500.0, "training steps"),  # this version's GPU runs
    ([None, None], 12000.0, "whole run"),  # runs from before it was recorded
])
def test_the_tables_show_the_training_peak_where_recorded(tmp_path, training, shown, scope):
    record = _summary(peak_memory_mib_per_rank=[11000.0, 12000.0], training_peak_bytes_per_rank=training)
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    values = read_run(tmp_path)
    assert values.allocated_peak_mib == shown
    assert values.allocated_scope == scope
    assert values.process_peak_mib == 12000.0
    assert values.rank0_peak_mib == (9000.0 if scope == "training steps" else 11000.0)


def test_the_census_keeps_no_gradient_alive_after_its_step():
    """The census counts the gradients inside step 2; after zero_grad(set_to_none) they must be freed (a census
    that kept them raised every later step's peak by one gradient copy: the 2,133 MiB seen on BLOOM-560m)."""
    model = _mlp("cpu")
    optimizer = torch.optim.AdamW(model.parameters())
    probe = MemoryProbe(step=2, device_kind="cpu")
    x = torch.randn(8, 256)
    for step in (1, 2):
        probe.begin(step, model, optimizer)
        model(x).pow(2).mean().backward()
        optimizer.step()
        gradients = [p.grad.untyped_storage()._weak_ref() for p in model.parameters()]
        optimizer.zero_grad(set_to_none=True)
        probe.end(step)
    assert probe.outcome()["model_state_parts"]["gradients"] > 0  # the census did count them
    try:
        assert all(torch.UntypedStorage._expired(ref) for ref in gradients)
    finally:
        for ref in gradients:
            torch.UntypedStorage._free_weak_ref(ref)
