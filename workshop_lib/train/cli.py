"""Command-line flags shared by every entry point, and the precision each device supports."""

from __future__ import annotations

import argparse

from workshop_lib.core.errors import WorkshopError
from workshop_lib.train.data import MAX_LENGTH
from workshop_lib.train.flags import FlagParser, check_positive
from workshop_lib.train.models import REGISTRY

PRECISIONS = ("auto", "fp32", "fp16", "bf16")


def common_parser(module: str, description: str) -> FlagParser:
    """The flags of every training entry point (``python -m module``)."""
    parser = FlagParser(module, description)
    parser.add_argument("--output-dir", required=True, help="run folder; metrics.jsonl goes here")
    parser.add_argument("--model", default="tiny-bloom", choices=list(REGISTRY))
    parser.add_argument("--random-init", action="store_true",
                        help="build a real architecture from its config with random weights (no download)")
    parser.add_argument("--data", default="synthetic",
                        help="'squad' (hub), 'synthetic' (generated), a folder or a SQuAD-format JSON file")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--precision", choices=PRECISIONS, default="auto")
    parser.add_argument("--max-steps", type=int, default=-1, help="stop after N optimizer steps (-1: no limit)")
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--max-length", type=int, default=MAX_LENGTH, help="tokens per sample (seeds: 512)")
    return parser


def add_sample_count_flags(parser: argparse.ArgumentParser, per_gpu_default: int = 500) -> None:
    """--samples-per-gpu (weak scaling, the seeds' default) or --samples (one fixed set shared by all GPUs)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--samples-per-gpu", type=int, default=None,
                       help=f"weak scaling: the train subset is this × world size (default {per_gpu_default})")
    group.add_argument("--samples", type=int, default=None,
                       help="strong scaling: this many train samples in all, split across the GPUs")
    parser.set_defaults(per_gpu_default=per_gpu_default)


def sample_counts(args: argparse.Namespace) -> tuple[int, int | None]:
    """(fixed total, per-GPU share): exactly one is meaningful; per-GPU wins when neither flag was given."""
    if args.samples is not None:
        check_positive(samples=args.samples)
        return args.samples, None
    per_gpu = args.samples_per_gpu if args.samples_per_gpu is not None else args.per_gpu_default
    check_positive(samples_per_gpu=per_gpu)
    return 0, per_gpu


def resolve_precision(requested: str, device_kind: str) -> str:
    """``auto`` means bf16 on a GPU that has it, fp16 on an older GPU, fp32 on a CPU."""
    import torch

    if device_kind == "cpu":
        if requested == "fp16":
            raise WorkshopError("--precision fp16 needs a GPU; use fp32 (or bf16) on a CPU")
        return "fp32" if requested == "auto" else requested
    bf16_ok = torch.cuda.is_bf16_supported()
    if requested == "auto":
        return "bf16" if bf16_ok else "fp16"
    if requested == "bf16" and not bf16_ok:
        raise WorkshopError("--precision bf16 is not supported by this GPU (V100 and older); use fp16")
    return requested


def autocast_dtype(precision: str):
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)

