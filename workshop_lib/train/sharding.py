"""FSDP that really shards on CPU as well as on GPU (hand-written FSDP1 wrapping).

HF Trainer's ``fsdp=`` quietly falls back to plain DDP on a CPU, so the CPU path wraps the
model here: each transformer block is one FSDP unit, as the seeds' ``transformer_layer_cls_to_wrap``.
"""

from __future__ import annotations

import functools

import torch
from torch.distributed.fsdp import BackwardPrefetch, CPUOffload, ShardingStrategy
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

from workshop_lib.core.errors import WorkshopError

STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD")


def block_classes(model, class_name: str) -> set[type]:
    found = {type(module) for module in model.modules() if type(module).__name__ == class_name}
    if not found:
        raise WorkshopError(f"no {class_name} layers in {type(model).__name__}: cannot wrap for FSDP")
    return found


def hybrid_mesh(device: torch.device, nodes: int, ranks_per_node: int):
    """HYBRID_SHARD's 2-D layout: replicate across nodes (dim 0), shard within a node (dim 1).

    FSDP would otherwise guess the node size from the GPU count, which is 0 on a CPU.
    """
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, (nodes, ranks_per_node), mesh_dim_names=("replicate", "shard"))


def wrap_fsdp(model, strategy: str, layer_class: str, device: torch.device, offload: bool = False,
              nodes: int = 1, ranks_per_node: int = 1):
    """The model as FSDP units; parameters stay sharded between forward/backward passes.

    ``offload`` moves parameters to host memory between uses; on a CPU they already live there
    and FSDP1 refuses the option without an accelerator, so it is a no-op there.
    """
    if strategy not in STRATEGIES:
        raise WorkshopError(f"--fsdp {strategy!r}: choose one of {', '.join(STRATEGIES)}")
    policy = functools.partial(transformer_auto_wrap_policy,
                               transformer_layer_cls=block_classes(model, layer_class))
    mesh = hybrid_mesh(device, nodes, ranks_per_node) if strategy == "HYBRID_SHARD" else None
    return FSDP(model, auto_wrap_policy=policy, sharding_strategy=ShardingStrategy[strategy],
                cpu_offload=CPUOffload(offload_params=offload and device.type == "cuda"),
                device_id=device, device_mesh=mesh,
                backward_prefetch=BackwardPrefetch.BACKWARD_POST, forward_prefetch=True,
                # On CPU FSDP refuses to broadcast from rank 0; every rank builds the same
                # seeded weights anyway, so the broadcast only matters for loaded checkpoints on GPUs.
                sync_module_states=device.type == "cuda", use_orig_params=True)


def local_parameter_count(model) -> int:
    """Parameters this rank actually stores: FSDP flat shards, DTensor local shards, or everything."""
    from torch.distributed.tensor import DTensor

    if isinstance(model, FSDP):
        # Each FSDP unit keeps one flat parameter; once wrapped it holds only this rank's shard
        # (padding included, as stored). After the first forward the shard also sits in _local_shard.
        flat_params = [m._handle.flat_param for m in FSDP.fsdp_modules(model) if m._handle is not None]
        return sum(getattr(flat, "_local_shard", flat).numel() for flat in flat_params)
    seen, total = set(), 0
    for parameter in model.parameters():
        if id(parameter) in seen:
            continue
        seen.add(id(parameter))
        if isinstance(parameter, DTensor):
            total += parameter.to_local().numel()
        elif hasattr(parameter, "ds_tensor"):  # DeepSpeed ZeRO-3 keeps only this partition
            total += parameter.ds_tensor.numel()
        else:
            total += parameter.numel()
    return total


def fsdp_layout(model) -> dict:
    """How FSDP actually grouped the ranks: the size of the group each parameter is sharded over and
    of the group it is replicated over (HYBRID_SHARD: GPUs per node, and nodes). Empty without FSDP."""
    from torch.distributed.tensor import DTensor

    if isinstance(model, FSDP):  # FSDP1: the root's groups are every unit's groups
        replicate = getattr(model, "_inter_node_pg", None)
        return {"fsdp_implementation": "fsdp1", "fsdp_sharding_strategy": model.sharding_strategy.name,
                "fsdp_shard_group": model.process_group.size(),
                "fsdp_replicate_group": replicate.size() if replicate is not None else 1}
    for parameter in model.parameters():
        if isinstance(parameter, DTensor):  # FSDP2: a 1-D mesh shards, a 2-D one replicates × shards
            shape = tuple(parameter.device_mesh.shape)
            return {"fsdp_implementation": "fsdp2", "fsdp_shard_group": shape[-1],
                    "fsdp_replicate_group": shape[0] if len(shape) > 1 else 1}
    return {}
