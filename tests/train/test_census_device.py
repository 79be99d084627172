"""A GPU run's census is of GPU tensors only (issue 40, item 10): in hybrid-shard-offload it counted the states
FSDP keeps on the CPU, and the step was measured tensor by tensor (8,307 MiB against the GPU's 4,126 allocated),
because the probe read the run's device from the first parameter, which offloading puts on the CPU."""

from __future__ import annotations

import torch
from test_tensor_census import _mlp, _train

from workshop_lib.train.tensor_census import MemoryProbe, census


def test_the_census_of_one_device_kind_leaves_the_others_out():
    model = _mlp()
    optimizer = torch.optim.AdamW(model.parameters())
    _train(model, optimizer, None, steps=1)
    everything = census(model, optimizer)
    assert everything.total > 0
    assert census(model, optimizer, device_type="cpu").bytes == everything.bytes
    assert census(model, optimizer, device_type="cuda").total == 0  # all of it is host memory here


def test_the_run_s_device_kind_decides_how_the_step_is_measured_not_the_first_parameter():
    told, guessed = MemoryProbe(step=2, device_kind="cpu"), MemoryProbe(step=2)
    for probe in (told, guessed):
        model = _mlp()
        _train(model, torch.optim.AdamW(model.parameters()), probe)
    assert told.outcome()["model_state_bytes"] == guessed.outcome()["model_state_bytes"] > 0
    assert told.device_kind == "cpu" and told.outcome()["step_peak_bytes"] > 0
