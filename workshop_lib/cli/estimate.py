"""`workshop estimate`: predicted per-GPU and CPU memory of a training setup, before running it."""

from __future__ import annotations

import argparse
import json

from workshop_lib.estimate import (
    FSDP_STRATEGIES,
    KNOWN_CONFIGS,
    OFFLOADS,
    PRECISIONS,
    TrainingSetup,
    estimate_memory,
    format_estimate,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "estimate",
        help="predict per-GPU memory (parameters, gradients, optimizer, activations, logits) and CPU memory",
        description="Estimate the peak GPU memory of one training step and the CPU memory of offloaded "
        "states, from the ZeRO paper's model-state formulas and Korthikanti et al.'s activation formula.",
    )
    parser.add_argument("experiment_id", nargs="?", metavar="ID",
                        help="an experiment (`workshop experiments` lists them): its model and setup, as the "
                        "failure explanations quote it; the options below then change that setup")
    parser.add_argument("--model", metavar="NAME|CONFIG",
                        help=f"one of {', '.join(KNOWN_CONFIGS)}, or the path of a config.json")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs of the whole job (default 1)")
    parser.add_argument("--nodes", type=int, default=1, help="nodes the GPUs spread over (default 1)")
    sharding = parser.add_mutually_exclusive_group()
    sharding.add_argument("--zero", type=int, choices=(0, 1, 2, 3), help="DeepSpeed ZeRO stage")
    sharding.add_argument("--fsdp", choices=FSDP_STRATEGIES, help="FSDP sharding strategy")
    parser.add_argument("--offload", choices=OFFLOADS, default="none",
                        help="move optimizer states (ZeRO >= 1) or also parameters (ZeRO-3, FSDP) to CPU")
    parser.add_argument("--precision", choices=PRECISIONS, default="bf16", help="default %(default)s")
    parser.add_argument("--batch", type=int, default=4, help="micro batch per GPU (default %(default)s)")
    parser.add_argument("--seq-len", type=int, default=512, help="tokens per sequence (default %(default)s)")
    parser.add_argument("--lora-rank", type=int, help="train LoRA adapters of this rank instead of all weights")
    parser.add_argument("--lora-modules", metavar="A,B",
                        help="comma-separated Linear layers for LoRA (default: the attention projections)")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size (NeMo/Megatron)")
    parser.add_argument("--ep", type=int, default=1, help="expert-parallel size (NeMo/Megatron, MoE models)")
    parser.add_argument("--pp", type=int, default=1, help="pipeline-parallel size (NeMo/Megatron)")
    parser.add_argument("--micro-batches", type=int, default=1,
                        help="micro-batches per step on each data-parallel rank (with --pp: 1F1B in flight)")
    parser.add_argument("--sp", action="store_true", help="sequence parallel (with --tp)")
    parser.add_argument("--recompute", action="store_true", help="full activation recomputation")
    parser.add_argument("--json", action="store_true", help="print the estimate as JSON (bytes and GiB)")
    parser.set_defaults(handler=run_estimate)


def setup_from_args(args: argparse.Namespace) -> TrainingSetup:
    modules = tuple(name.strip() for name in args.lora_modules.split(",")) if args.lora_modules else None
    return TrainingSetup(
        gpus=args.gpus, nodes=args.nodes, precision=args.precision, zero_stage=args.zero, fsdp=args.fsdp,
        offload=args.offload, batch=args.batch, seq_len=args.seq_len, lora_rank=args.lora_rank,
        lora_modules=modules, tensor_parallel=args.tp, expert_parallel=args.ep, sequence_parallel=args.sp,
        pipeline_parallel=args.pp, micro_batches=args.micro_batches, recompute=args.recompute)


def run_estimate(args: argparse.Namespace) -> int:
    if args.experiment_id:
        from workshop_lib.estimate.report import setup_from_experiment
        from workshop_lib.experiments import get_experiment

        experiment = get_experiment(args.experiment_id)
        estimate = estimate_memory(args.model or experiment.model, setup_from_experiment(experiment))
    elif args.model:
        estimate = estimate_memory(args.model, setup_from_args(args))
    else:
        from workshop_lib.core.errors import WorkshopError

        raise WorkshopError("give an experiment id (e.g. `workshop estimate zero/single-gpu/zero1`) or --model NAME "
                            f"with its setup (--gpus, --zero, …); known models: {', '.join(KNOWN_CONFIGS)}")
    if args.json:
        print(json.dumps(estimate.to_dict(), indent=2))
    else:
        print(format_estimate(estimate))
    return 0
