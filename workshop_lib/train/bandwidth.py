"""All-reduce bandwidth between the job's processes, measured with torch.distributed.

Launched by the job script exactly like the training (the same torchrun, rendezvous and NCCL), so it
tests the path the training will use. Rank 0 prints nccl-tests' all_reduce_perf layout, which
workshop_lib.results.parse.nccl reads, with bus bandwidth defined as nccl-tests defines it for all-reduce:

    algbw = bytes / time        busbw = algbw * 2 * (n - 1) / n        (GB/s = 10^9 bytes/s)

A single process moves nothing between GPUs: busbw is 0 and the check must not pass on it, so the job
scripts only run this with more than one node.
"""

from __future__ import annotations

import os
import socket
import time

import torch
import torch.distributed as dist

from workshop_lib.core.errors import WorkshopError
from workshop_lib.train.flags import FlagParser, check_positive, report_user_error


def bus_bandwidth_gbps(size_bytes: int, seconds: float, ranks: int) -> tuple[float, float]:
    """(algorithm bandwidth, bus bandwidth) in GB/s for one all-reduce of `size_bytes` over `ranks`."""
    algbw = size_bytes / seconds / 1e9
    return algbw, algbw * 2 * (ranks - 1) / ranks


def _timed(operation, iterations: int, device: torch.device) -> float:
    """Mean seconds per call, the slowest rank's: a collective is as fast as its slowest member."""
    dist.barrier()
    _synchronize(device)
    started = time.perf_counter()
    for _ in range(iterations):
        operation()
    _synchronize(device)
    elapsed = torch.tensor([(time.perf_counter() - started) / iterations], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed.item())


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(size_mb: int, iterations: int, warmup: int = 5) -> dict:
    """Run the test in an initialised process group; returns what rank 0 prints."""
    rank, ranks = dist.get_rank(), dist.get_world_size()
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    count = size_mb * 2**20 // 4
    source = torch.full((count,), float(rank + 1), dtype=torch.float32, device=device)
    output = torch.empty_like(source)

    def in_place():
        dist.all_reduce(output)

    def out_of_place():
        # nccl-tests' out-of-place reduces a send buffer into a separate receive buffer.
        output.copy_(source)
        dist.all_reduce(output)

    for _ in range(warmup):
        out_of_place()
    out_of_place()
    wrong = int((output != ranks * (ranks + 1) / 2).sum().item())  # every element is 1 + 2 + ... + n
    out_time = _timed(out_of_place, iterations, device)
    output.copy_(source)
    in_time = _timed(in_place, iterations, device)
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    hosts = [None] * ranks
    dist.all_gather_object(hosts, (rank, os.getpid(), node, device.index or 0, name))
    return {"ranks": ranks, "size": count * 4, "count": count, "out_time": out_time, "in_time": in_time,
            "wrong": wrong, "hosts": hosts, "backend": dist.get_backend(), "iterations": iterations}


def report(result: dict) -> str:
    """nccl-tests' all_reduce_perf layout (one size), so one parser reads both tools."""
    ranks, size = result["ranks"], result["size"]
    out_alg, out_bus = bus_bandwidth_gbps(size, result["out_time"], ranks)
    in_alg, in_bus = bus_bandwidth_gbps(size, result["in_time"], ranks)
    nodes = len({host[2] for host in result["hosts"]})
    lines = [f"# workshop_lib.train.bandwidth: all-reduce (sum, float32) over {ranks} ranks on {nodes} node(s), "
             f"backend {result['backend']}, {result['iterations']} iterations",
             "#", "# Using devices"]
    lines += [f"#  Rank {rank:2d} Group  0 Pid {pid:6d} on {node:>10} device {index:2d} [{name}]"
              for rank, pid, node, index, name in result["hosts"]]
    lines += ["#",
              "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw"
              "   busbw #wrong",
              f"{size:12d}  {result['count']:12d}     float     sum      -1  {result['out_time'] * 1e6:7.0f}  "
              f"{out_alg:6.2f}  {out_bus:6.2f}  {result['wrong']:5d}  {result['in_time'] * 1e6:7.0f}  {in_alg:6.2f}  "
              f"{in_bus:6.2f}  {result['wrong']:5d}",
              f"# Out of bounds values : {result['wrong']} {'OK' if result['wrong'] == 0 else 'FAILED'}",
              f"# Avg bus bandwidth    : {(out_bus + in_bus) / 2:.4f}",
              "#"]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None):
    parser = FlagParser("workshop_lib.train.bandwidth", __doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="message size in MiB (default 1024)")
    parser.add_argument("--iterations", type=int, default=20)
    args = parser.parse_args(argv)
    check_positive(size_mb=args.size_mb, iterations=args.iterations)
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except WorkshopError as error:
        return report_user_error(error)
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    try:
        result = measure(args.size_mb, args.iterations)
        if dist.get_rank() == 0:
            print(report(result), flush=True)
    finally:
        dist.destroy_process_group()
    return 1 if result["wrong"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
