"""The words of the seed pitfalls the estimator refuses as well, stated once.

Three of the seeds' pitfalls make a setup one the estimate cannot (or should not) compute: CPU offload with ZeRO
stage 0, HYBRID_SHARD on one node, and Megatron sizes whose product does not divide the GPUs. The checks
(``checks.pitfalls``, for experiments and scripts) report them as findings, and the estimator
(``memory.check_setup``) refuses them with a ``PitfallError``; both take the rule, message and fix from here, so
`workshop validate`, `workshop estimate` and the memory calculator say one thing for one pitfall, and the
calculator shows it once. Lives here, not in checks/, because the estimator may not import checks/.
"""

from __future__ import annotations

from dataclasses import dataclass

from workshop_lib.core.errors import WorkshopError


@dataclass(frozen=True)
class PitfallText:
    rule: str
    message: str
    fix: str


class PitfallError(WorkshopError):
    """The estimator's refusal of a setup that has one of the seeds' pitfalls; ``rule`` names it as the checks do."""

    def __init__(self, text: PitfallText):
        super().__init__(f"{text.message} Fix: {text.fix}")
        self.rule = text.rule


def offload_with_zero0(deepspeed_config: str | None = None) -> PitfallText:
    where = f" ({deepspeed_config})" if deepspeed_config else ""
    return PitfallText(
        "offload-with-zero0",
        f"CPU offload with ZeRO stage 0{where}: stage 0 partitions nothing, so there is nothing to offload.",
        "use ZeRO stage 1, 2 or 3 with offload (a stage 1-3 DeepSpeed config), or turn offload off.")


def hybrid_shard_single_node() -> PitfallText:
    return PitfallText(
        "hybrid-shard-single-node",
        "HYBRID_SHARD shards inside a node and replicates across nodes, so on one node it is FULL_SHARD under "
        "another name and a comparison with FULL_SHARD means nothing.",
        "use 2 or more nodes (--nodes=2), or FULL_SHARD.")


def parallel_sizes_mismatch(tensor: int, expert: int, pipeline: int, context: int, gpus_per_node: int,
                            nodes: int) -> PitfallText | None:
    """Megatron: data parallel = GPUs / (TP x PP), and the EP ranks are carved out of it, so TP x EP x PP
    (x CP) must divide the GPUs (it need not equal them). None where it does."""
    gpus, product = gpus_per_node * nodes, tensor * expert * pipeline * context
    if not gpus or gpus % product == 0:
        return None
    names = "TP x EP x PP" + (" x CP" if context > 1 else "")
    values = f"{tensor} x {expert} x {pipeline}" + (f" x {context}" if context > 1 else "")
    return PitfallText(
        "parallel-sizes-mismatch",
        f"{names} = {values} = {product} does not divide the {gpus} GPUs of the job ({gpus_per_node} per "
        f"node x {nodes} node{'s' if nodes > 1 else ''}): Megatron stops at start-up.",
        f"request a multiple of {names} GPUs (the rest is data parallel), or smaller sizes.")
