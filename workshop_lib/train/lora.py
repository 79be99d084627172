"""LoRA fine-tuning with data parallelism (chapter 1's stand-in for NeMo's ``llm finetune``).

    torchrun --nproc_per_node=N -m workshop_lib.train.lora --output-dir DIR --model tiny-llama \\
        [--global-batch 8] [--lora-rank 32] [--warmup-steps 50] [--max-steps 250]

LoRA adapters of rank 32 go on the attention projections (NeMo's default targets linear_qkv and
linear_proj are Hugging Face's q/k/v/o projections). The global batch is split across the ranks,
each rank a DDP replica; the log shows trainable and total parameters before and after.
"""

from __future__ import annotations

import sys

import torch

from workshop_lib.errors import WorkshopError
from workshop_lib.train.cli import check_positive, common_parser, resolve_precision
from workshop_lib.train.common import answer_quality, load_tokenizer, prepare_data, print_header
from workshop_lib.train.loop import LoopSettings, run_loop
from workshop_lib.train.metrics import MetricsWriter, summary_fields
from workshop_lib.train.models import build_model, count_parameters, model_spec
from workshop_lib.train.runtime import Runtime, print_main, run_entry_point


def parse_args(argv=None):
    parser = common_parser(__doc__.splitlines()[0])
    parser.set_defaults(model="tiny-llama", learning_rate=1e-4, weight_decay=0.1)  # NeMo's recipe
    parser.add_argument("--global-batch", type=int, default=8, help="samples per step over all ranks")
    parser.add_argument("--lora-rank", type=int, default=32)
    parser.add_argument("--lora-alpha", type=int, default=32)
    parser.add_argument("--warmup-steps", type=int, default=50)
    parser.add_argument("--samples", type=int, default=2000, help="training samples (all ranks together)")
    parser.add_argument("--eval-samples", type=int, default=32)
    parser.add_argument("--generation-samples", type=int, default=0)
    args = parser.parse_args(argv)
    check_positive(global_batch=args.global_batch, lora_rank=args.lora_rank, samples=args.samples)
    return args


def micro_batch_per_rank(global_batch: int, world_size: int) -> int:
    if global_batch % world_size:
        raise WorkshopError(f"--global-batch {global_batch} does not split evenly over {world_size} ranks; "
                            "choose a global batch that is a multiple of the number of GPUs")
    return global_batch // world_size


def add_adapters(model, spec, rank: int, alpha: int):
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, bias="none",
                        target_modules=list(spec.attention_projections), task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def run(args, runtime: Runtime) -> dict:
    spec = model_spec(args.model)
    if spec.family not in ("llama", "mixtral"):
        raise WorkshopError(f"--model {args.model}: the LoRA track runs Llama- or Mixtral-shaped models "
                            "(llama-3.1-8b, tiny-llama, mixtral-8x7b, tiny-mixtral)")
    precision = resolve_precision(args.precision, runtime.device_kind)
    micro_batch = micro_batch_per_rank(args.global_batch, runtime.world_size)
    writer = MetricsWriter(args.output_dir, enabled=runtime.is_main)
    tokenizer = load_tokenizer(spec, args.random_init, runtime)
    data = prepare_data(args.data, runtime, tokenizer, args.samples, args.eval_samples,
                        args.generation_samples, args.max_length)

    model = build_model(spec, args.random_init, args.seed)
    trainable_before, total_before = count_parameters(model)
    print_main(runtime, f"== before LoRA: {trainable_before:,} trainable of {total_before:,} parameters")
    model = add_adapters(model, spec, args.lora_rank, args.lora_alpha).to(runtime.device)
    trainable, total = count_parameters(model)
    print_main(runtime, f"== after LoRA (rank {args.lora_rank} on {', '.join(spec.attention_projections)}): "
                        f"{trainable:,} trainable of {total:,} parameters")
    print_header(runtime, "lora", args.model, trainable, total, precision=precision,
                 global_batch=args.global_batch, micro_batch_per_rank=micro_batch)

    ddp = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[runtime.local_rank] if runtime.device_kind == "cuda" else None)
    trainable_parameters = [p for p in ddp.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable_parameters, lr=args.learning_rate, weight_decay=args.weight_decay)
    settings = LoopSettings(epochs=args.epochs, max_steps=args.max_steps, micro_batch=micro_batch, grad_accum=1,
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
                       "lora_rank": args.lora_rank, "lora_alpha": args.lora_alpha,
                       "target_modules": list(spec.attention_projections), "warmup_steps": args.warmup_steps,
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
