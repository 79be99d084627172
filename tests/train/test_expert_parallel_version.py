"""Expert parallelism on a transformers older than 5.21 is refused with the remedy (issue 40, item 10): that
version's path (`enable_expert_parallel`) hung after loading the weights until the job's time limit."""

from __future__ import annotations

import dataclasses

import pytest

from workshop_lib.core.errors import WorkshopError
from workshop_lib.train.parallel import distributed_config


@dataclasses.dataclass
class DistributedConfigBefore521:
    """transformers 5.17's DistributedConfig: no ep_size."""

    tp_size: int | None = None
    fsdp_size: int | None = None
    enable_expert_parallel: bool = False


def test_expert_parallelism_before_5_21_is_refused_not_left_to_hang(monkeypatch):
    import transformers
    import transformers.distributed

    monkeypatch.setattr(transformers.distributed, "DistributedConfig", DistributedConfigBefore521)
    monkeypatch.setattr(transformers, "__version__", "5.17.0")
    with pytest.raises(WorkshopError, match=r"--ep 2 needs transformers 5.21 or newer \(this environment has 5.17.0"):
        distributed_config(tp=2, ep=2, dp_width=1)
    assert distributed_config(tp=2, ep=1, dp_width=1).tp_size == 2  # tensor parallelism alone still works


def test_expert_parallelism_from_5_21_asks_for_ep_size():
    import transformers.distributed

    if "ep_size" not in {field.name for field in dataclasses.fields(transformers.distributed.DistributedConfig)}:
        pytest.skip("this environment's transformers is older than 5.21")
    assert distributed_config(tp=2, ep=2, dp_width=1).ep_size == 2
