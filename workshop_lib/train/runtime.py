"""The distributed runtime every entry point shares: process group, device, rank helpers.

Every entry point is started by torchrun, even for one process, so RANK, WORLD_SIZE,
LOCAL_RANK and LOCAL_WORLD_SIZE are always set. The same code picks NCCL on CUDA and gloo on CPU.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from workshop_lib.core.errors import WorkshopError
from workshop_lib.train.extensions import load_deepspeed_comm_op, settle_environment_locks
from workshop_lib.train.flags import report_user_error


@dataclass(frozen=True)
class Runtime:
    """Where this process sits in the job."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_local_main(self) -> bool:
        return self.local_rank == 0

    @property
    def nodes(self) -> int:
        return max(1, self.world_size // max(1, self.local_world_size))

    @property
    def device_kind(self) -> str:
        return self.device.type


def start_runtime(deepspeed: bool = False, cpu_collectives: bool = False) -> Runtime:
    """Join the process group torchrun prepared; bind this process to its GPU if there is one.

    With ``deepspeed`` the group is made through DeepSpeed, whose communication layer otherwise
    does not see a group created before it (it then believes the world has one rank).
    ``cpu_collectives``: on GPUs, add gloo for tensors that live on the CPU (FSDP's CPU offload with
    fp16 reduces the loss scaler's inf check over them), as Accelerate does when it makes the group.
    """
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise WorkshopError(
            "this entry point must be launched by torchrun (RANK/WORLD_SIZE are not set): use "
            "`torchrun --nproc_per_node=1 -m workshop_lib.train.<name> ...` even for one process"
        )
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        backend = "cuda:nccl,cpu:gloo" if cpu_collectives else "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    # The long timeout covers rank 0 generating data or a tokenizer while the others wait.
    timeout = datetime.timedelta(minutes=30)
    if deepspeed:
        import deepspeed as deepspeed_module

        # The op DeepSpeed loads on CPUs comes from this environment's folder, where `make setup` built it; a
        # build a killed job left half done is cleared with a line saying so, not waited for until the limit.
        if device.type == "cpu":
            load_deepspeed_comm_op()
        else:
            settle_environment_locks()
        deepspeed_module.init_distributed(dist_backend=backend, timeout=timeout)
    elif not dist.is_initialized():
        dist.init_process_group(backend=backend, timeout=timeout)
    return Runtime(rank, local_rank, world_size, local_world_size, device)


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def gather_from_ranks(value):
    """Every rank's ``value`` as a list in rank order (on every rank)."""
    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


def stop_runtime() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def print_main(runtime: Runtime, *lines: str) -> None:
    """Print on rank 0 only, flushed so SLURM logs interleave sensibly."""
    if runtime.is_main:
        for line in lines:
            print(line, flush=True)


def run_entry_point(parse_args, run, argv=None, summary_line=None, **runtime_options) -> int:
    """The body of every entry point's main(): parse, join the process group, train, report, leave.

    A WorkshopError (bad flags, data that does not fit) ends the process with status 2 and its message,
    not a traceback on every rank (``workshop_lib.train.flags``).
    """
    try:
        args = parse_args(argv)
        runtime = start_runtime(**runtime_options)
        summary = run(args, runtime)
        line = summary_line(summary) if summary_line else (
            f"== summary: {summary['samples_per_s']:.2f} samples/s, final loss {summary['final_loss']:.4f}")
        print_main(runtime, line)
    except WorkshopError as error:
        return report_user_error(error)
    finally:
        stop_runtime()
    return 0
