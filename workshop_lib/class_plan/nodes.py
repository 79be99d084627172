"""The nodes a class runs on: node shapes (GPUs, cores, memory, features), Ibex's A100 inventory as KAUST documents
it, and a reservation's nodes as SLURM reports them (`scontrol show reservation NAME`, `scontrol show node`)."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from workshop_lib.core.errors import WorkshopError
from workshop_lib.sites.reservation import LIST_COMMAND


class ReservationLookupError(WorkshopError):
    """The reservation could not be read from SLURM; the message says what to check."""


@dataclass(frozen=True)
class NodeShape:
    """One kind of node: its GPUs, the cores and memory SLURM may allocate, and its features."""

    gpus: int
    cpus: int
    memory_mib: int
    features: frozenset[str]

    @property
    def name(self) -> str:
        return f"{self.gpus}-GPU"


# KAUST's Ibex policy, kaust-rccl/ksl-docs docs/source/policy/ibex.rst line 35: "a maximum limit on allocating
# 24 GPUs in running jobs on Ibex ... whether 1 job requesting 24 GPUs or 24 jobs requesting a single GPU".
PER_USER_GPU_CAP = 24
CAP_SOURCE = "KAUST's Ibex policy (kaust-rccl/ksl-docs, docs/source/policy/ibex.rst:35)"

# KAUST's A100 nodes, kaust-rccl/ksl-docs docs/source/systems/ibex/compute_node.rst:266-287: 46 nodes of 4 A100s,
# 64 cores (62 allocatable: two run the WekaIO file system) and 512 GB; 8 nodes of 8 A100s, 128 cores (126) and 1 TB.
# The memory is the documented figure; a reservation read from SLURM brings each node's RealMemory instead.
IBEX_4GPU = NodeShape(4, 62, 512 * 1024, frozenset({"a100", "4gpus"}))
IBEX_8GPU = NodeShape(8, 126, 1024 * 1024, frozenset({"a100", "8gpus"}))
IBEX_A100_NODES = {IBEX_4GPU: 46, IBEX_8GPU: 8}
INVENTORY_SOURCE = "kaust-rccl/ksl-docs, docs/source/systems/ibex/compute_node.rst:266-287"


@dataclass(frozen=True)
class Node:
    name: str
    shape: NodeShape


def nodes_of(counts: dict[NodeShape, int]) -> tuple[Node, ...]:
    """Named nodes from counts by shape (4-GPU nodes first)."""
    nodes = []
    for shape in sorted(counts, key=lambda shape: shape.gpus):
        nodes += [Node(f"{shape.gpus}gpu-{index + 1:02d}", shape) for index in range(counts[shape])]
    return tuple(nodes)


def counts_of(nodes: Iterable[Node]) -> dict[NodeShape, int]:
    counts: dict[NodeShape, int] = {}
    for node in nodes:
        counts[node.shape] = counts.get(node.shape, 0) + 1
    return counts


def describe_counts(counts: dict[NodeShape, int]) -> str:
    """'16 four-GPU + 2 eight-GPU nodes (80 GPUs)'."""
    words = {4: "four", 8: "eight", 2: "two", 1: "one"}
    by_gpus: dict[int, int] = {}
    for shape, count in counts.items():  # nodes read from SLURM may differ a little in memory: one line per GPU count
        by_gpus[shape.gpus] = by_gpus.get(shape.gpus, 0) + count
    parts = [f"{count} {words.get(gpus, str(gpus))}-GPU" for gpus, count in sorted(by_gpus.items()) if count]
    gpus = sum(shape.gpus * count for shape, count in counts.items())
    return (" + ".join(parts) or "no") + f" nodes ({gpus} GPUs)"


# ---- a reservation, as SLURM reports it ------------------------------------------------------------
@dataclass(frozen=True)
class ReservationNodes:
    """A reservation's name, users, times and nodes (with their real cores, memory and features)."""

    name: str
    nodes: tuple[Node, ...]
    users: tuple[str, ...]
    start: str
    end: str
    state: str


_FIELD = re.compile(r"(?:^|\s)([A-Za-z]+)=(\S*)")


def parse_reservation(text: str, name: str) -> dict[str, str]:
    """The key=value fields of `scontrol show reservation NAME` (one reservation)."""
    if not re.search(rf"ReservationName={re.escape(name)}(\s|$)", text):
        raise ReservationLookupError(f"reservation {name!r} is not in SLURM's answer (`{LIST_COMMAND} {name}` says: "
                                     f"{text.strip()[:200] or 'nothing'}). Check the name with the instructor or "
                                     f"`{LIST_COMMAND}`, or plan with node counts instead (--nodes-4gpu N --nodes-8gpu M)")
    return dict(_FIELD.findall(text))


def _gpus_of(gres: str) -> int:
    """GPUs in a node's Gres=gpu:a100:4(S:0-1),nvme:1 (0 without GPUs)."""
    total = 0
    for item in re.sub(r"\([^)]*\)", "", gres).split(","):
        words = item.split(":")
        if words[0] == "gpu" and words[-1].isdigit():
            total += int(words[-1])
    return total


def parse_nodes(text: str) -> tuple[Node, ...]:
    """Nodes of `scontrol show node LIST`: name, GPUs (Gres), allocatable cores (CPUEfctv, else CPUTot), memory
    (RealMemory less MemSpecLimit) and features (AvailableFeatures, else Features)."""
    nodes = []
    for block in re.split(r"(?=^NodeName=)", text, flags=re.M):
        if not block.startswith("NodeName="):
            continue
        fields = dict(_FIELD.findall(block))
        cpus = fields.get("CPUEfctv") or fields.get("CPUTot") or "0"
        memory = int(fields.get("RealMemory", "0") or 0) - int(fields.get("MemSpecLimit", "0") or 0)
        features = fields.get("AvailableFeatures", fields.get("Features", ""))
        features = frozenset(word for word in features.split(",") if word and word != "(null)")
        shape = NodeShape(_gpus_of(fields.get("Gres", "")), int(cpus), memory, features)
        nodes.append(Node(fields["NodeName"], shape))
    return tuple(nodes)


def scontrol(arguments: Sequence[str]) -> str:
    """Run scontrol; its stdout, or an error that says what to check."""
    try:
        result = subprocess.run(["scontrol", *arguments], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise ReservationLookupError("scontrol is not on PATH: read a reservation on the cluster's login node, or "
                                     "plan with node counts instead (--nodes-4gpu N --nodes-8gpu M)") from None
    except subprocess.TimeoutExpired:
        raise ReservationLookupError("scontrol did not answer within 60 s: try again, or plan with node counts "
                                     "(--nodes-4gpu N --nodes-8gpu M)") from None
    if result.returncode != 0:
        raise ReservationLookupError(f"`scontrol {' '.join(arguments)}` failed: {(result.stderr or result.stdout).strip()}"
                                     f". Check the name with `{LIST_COMMAND}`, or plan with node counts instead "
                                     "(--nodes-4gpu N --nodes-8gpu M)")
    return result.stdout


def read_reservation(name: str, run: Callable[[Sequence[str]], str] = scontrol) -> ReservationNodes:
    """The reservation's nodes with their real shapes: `scontrol show reservation NAME`, then `scontrol show node`
    for its node list (scontrol expands the list itself)."""
    fields = parse_reservation(run(["show", "reservation", name]), name)
    node_list = fields.get("Nodes", "")
    if not node_list or node_list == "(null)":
        raise ReservationLookupError(f"reservation {name!r} has no nodes (Nodes={node_list or 'empty'}): ask the "
                                     "site to add nodes to it, or plan with node counts (--nodes-4gpu N --nodes-8gpu M)")
    nodes = parse_nodes(run(["show", "node", node_list]))
    users = tuple(user for user in fields.get("Users", "").split(",") if user and user != "(null)")
    return ReservationNodes(name, nodes, users, fields.get("StartTime", "?"), fields.get("EndTime", "?"),
                            fields.get("State", "?"))
