"""LoRA fine-tuning with data parallelism (chapter 1's stand-in for NeMo's ``llm finetune``).

    torchrun --nproc_per_node=N -m workshop_lib.train.lora --output-dir DIR --model tiny-llama \\
        [--global-batch 8] [--micro-batch 1] [--lora-rank 8] [--lora-alpha 16] \\
        [--lora-targets linear_qkv,linear_proj,linear_fc1,linear_fc2] [--warmup-steps 50] [--max-steps 250]

The job script passes the recipe NeMo resolved for the same experiment (micro-batch, sequence length,
LoRA rank, alpha and targets, learning rate): LoRA's targets are NeMo's module names, mapped here onto
Hugging Face's (linear_qkv -> q/k/v_proj, linear_proj -> o_proj, linear_fc1 -> gate/up_proj,
linear_fc2 -> down_proj). The global batch is split across the ranks, each a DDP replica running
micro-batches with gradient accumulation, as Megatron does. Real shapes are built on the meta device
and materialised on the GPU in 16-bit (the frozen base, as NeMo keeps it); adapters stay fp32.
Unlike NeMo, which spreads Mixtral's experts over EP ranks, every rank here holds the whole model.
"""

from __future__ import annotations

import sys

import torch

from workshop_lib.core.errors import WorkshopError
from workshop_lib.train.cli import autocast_dtype, common_parser, resolve_precision
from workshop_lib.train.common import answer_quality, load_tokenizer, prepare_data, print_header
from workshop_lib.train.flags import check_positive
from workshop_lib.train.loop import LoopSettings, run_loop
from workshop_lib.train.metrics import MetricsWriter, summary_fields
from workshop_lib.train.models import build_model, build_on_meta, count_parameters, materialise, model_spec
from workshop_lib.train.runtime import Runtime, print_main, run_entry_point


def parse_args(argv=None):
    parser = common_parser("workshop_lib.train.lora", __doc__.splitlines()[0])
    parser.set_defaults(model="tiny-llama", learning_rate=1e-4, weight_decay=0.1)  # NeMo's recipe
    parser.add_argument("--global-batch", type=int, default=8, help="samples per step over all ranks")
    parser.add_argument("--micro-batch", type=int, default=None,
                        help="samples per forward pass per rank (NeMo's micro_batch_size); default: the "
                             "whole per-rank share")
    parser.add_argument("--lora-rank", type=int, default=32)
    parser.add_argument("--lora-alpha", type=int, default=32)
    parser.add_argument("--lora-targets", default="linear_qkv,linear_proj",
                        help="NeMo's LoRA target modules, comma-separated")
    parser.add_argument("--adam-beta2", type=float, default=0.999)
    parser.add_argument("--clip-grad", type=float, default=1.0)
    parser.add_argument("--warmup-steps", type=int, default=50)
    parser.add_argument("--samples", type=int, default=2000, help="training samples (all ranks together)")
    parser.add_argument("--eval-samples", type=int, default=32)
    parser.add_argument("--generation-samples", type=int, default=0)
    args = parser.parse_args(argv)
    check_positive(global_batch=args.global_batch, lora_rank=args.lora_rank, samples=args.samples)
    return args


# NeMo's LoRA target names -> the Hugging Face Llama/Mixtral modules they cover.
NEMO_TARGETS = {"linear_qkv": ("q_proj", "k_proj", "v_proj"), "linear_proj": ("o_proj",),
                "linear_fc1": ("gate_proj", "up_proj"), "linear_fc2": ("down_proj",)}


def micro_batch_per_rank(global_batch: int, world_size: int) -> int:
    if global_batch % world_size:
        raise WorkshopError(f"--global-batch {global_batch} does not split evenly over {world_size} ranks; "
                            "choose a global batch that is a multiple of the number of GPUs")
    return global_batch // world_size


def hf_targets(nemo_targets: str, spec) -> list[str]:
    """Hugging Face module names for NeMo's LoRA targets on this model."""
    names = [name.strip() for name in nemo_targets.split(",") if name.strip()]
    unknown = [name for name in names if name not in NEMO_TARGETS]
    if unknown or not names:
        raise WorkshopError(f"--lora-targets {nemo_targets!r}: use NeMo's names, among {', '.join(NEMO_TARGETS)}")
    if spec.is_moe and any(name in ("linear_fc1", "linear_fc2") for name in names):
        raise WorkshopError(f"--lora-targets {nemo_targets!r}: Mixtral's MLP is its experts (fused tensors "
                            "here); this stand-in adapts attention only: linear_qkv,linear_proj")
    return [module for name in names for module in NEMO_TARGETS[name]]


def add_adapters(model, targets: list[str], rank: int, alpha: int):
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, bias="none",
                        target_modules=targets, task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def base_model(spec, args, runtime: Runtime, precision: str):
    """Tiny models are built whole on the CPU (fp32, as the reference tests expect); real shapes on the
    meta device, then materialised on this rank's GPU in the 16-bit type NeMo keeps the frozen base in."""
    if spec.is_tiny or not args.random_init:
        return build_model(spec, args.random_init, args.seed)
    dtype = autocast_dtype(precision) or torch.float32
    return materialise(build_on_meta(spec, dtype=dtype), runtime.device, args.seed)


def run(args, runtime: Runtime) -> dict:
    spec = model_spec(args.model)
    if spec.family not in ("llama", "mixtral"):
        raise WorkshopError(f"--model {args.model}: the LoRA track runs Llama- or Mixtral-shaped models "
                            "(llama-3.1-8b, tiny-llama, mixtral-8x7b, tiny-mixtral)")
    precision = resolve_precision(args.precision, runtime.device_kind)
    per_rank = micro_batch_per_rank(args.global_batch, runtime.world_size)
    micro_batch = args.micro_batch or per_rank
    if per_rank % micro_batch:
        raise WorkshopError(f"--micro-batch {micro_batch} does not divide the {per_rank} samples per rank")
    grad_accum = per_rank // micro_batch
    targets = hf_targets(args.lora_targets, spec)
    writer = MetricsWriter(args.output_dir, enabled=runtime.is_main)
    tokenizer = load_tokenizer(spec, args.random_init, runtime)
    data = prepare_data(args.data, runtime, tokenizer, args.samples, args.eval_samples,
                        args.generation_samples, args.max_length)

    model = base_model(spec, args, runtime, precision)
    trainable_before, total_before = count_parameters(model)
    print_main(runtime, f"== before LoRA: {trainable_before:,} trainable of {total_before:,} parameters")
    model = add_adapters(model, targets, args.lora_rank, args.lora_alpha).to(runtime.device)
    trainable, total = count_parameters(model)
    print_main(runtime, f"== after LoRA (rank {args.lora_rank}, alpha {args.lora_alpha} on {', '.join(targets)}): "
                        f"{trainable:,} trainable of {total:,} parameters")
    print_header(runtime, "lora", args.model, trainable, total, precision=precision,
                 global_batch=args.global_batch, micro_batch_per_rank=micro_batch,
                 micro_batches_per_step=grad_accum, max_length=args.max_length)

    ddp = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[runtime.local_rank] if runtime.device_kind == "cuda" else None)
    trainable_parameters = [p for p in ddp.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable_parameters, lr=args.learning_rate, weight_decay=args.weight_decay,
                                  betas=(0.9, args.adam_beta2))
    settings = LoopSettings(epochs=args.epochs, max_steps=args.max_steps, micro_batch=micro_batch,
                            grad_accum=grad_accum, clip_norm=args.clip_grad or None,
                            learning_rate=args.learning_rate, weight_decay=args.weight_decay,
                            warmup_steps=args.warmup_steps, precision=precision, seed=args.seed,
                            data_rank=runtime.rank, data_world=runtime.world_size)
    quality = None
    if data.generation_examples:
        quality = lambda: answer_quality(ddp, model, tokenizer, data.generation_examples,  # noqa: E731
                                         runtime, precision, args.max_length)
    result = run_loop(ddp, optimizer, data.train, data.validation, runtime, writer, settings,
                      clip=lambda norm: torch.nn.utils.clip_grad_norm_(trainable_parameters, norm),
                      answer_quality=quality)
    engine_settings = {"global_batch": args.global_batch, "micro_batch_per_rank": micro_batch,
                       "micro_batches_per_step": grad_accum, "lora_rank": args.lora_rank,
                       "lora_alpha": args.lora_alpha, "nemo_target_modules": args.lora_targets.split(","),
                       "target_modules": targets, "warmup_steps": args.warmup_steps,
                       "built_on_meta_device": not spec.is_tiny and args.random_init,
                       "max_steps": args.max_steps, "learning_rate": args.learning_rate,
                       "max_length": args.max_length, "trainable_params_before": trainable_before,
                       "total_params_before": total_before}
    summary = summary_fields(runtime=runtime, engine="lora", settings=engine_settings, model=args.model,
                             precision=precision, samples=len(data.train),
                             trainable_params=trainable, total_params=total, local_params=total,
                             **result.outcome())
    return writer.summary(**summary)


def main(argv=None) -> int:
    return run_entry_point(parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
