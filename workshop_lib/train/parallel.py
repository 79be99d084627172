"""Full fine-tuning with tensor and expert parallelism (chapter 2's stand-in for NeMo).

    torchrun --nproc_per_node=N -m workshop_lib.train.parallel --output-dir DIR --model tiny-llama --tp 2
    torchrun --nproc_per_node=4 -m workshop_lib.train.parallel ... --model tiny-mixtral --tp 2 --ep 2

No PEFT: every weight trains. ``transformers``' native distributed loading splits each layer over
``--tp`` ranks (and Mixtral's experts over ``--ep`` ranks); ranks left over form a data-parallel
dimension (FSDP2), ``world size / tp`` wide, and split the global batch. The loss is the mean over
samples of each sample's mean token loss, so it does not depend on how the batch is split: a run
with --tp 1 on one process is the unsharded reference and gives the same losses.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from workshop_lib.errors import WorkshopError
from workshop_lib.train.cli import check_positive, common_parser, resolve_precision
from workshop_lib.train.common import load_tokenizer, prepare_data, print_header
from workshop_lib.train.data import IGNORE_INDEX
from workshop_lib.train.loop import LoopSettings, run_loop
from workshop_lib.train.metrics import MetricsWriter, summary_fields
from workshop_lib.train.models import build_model, count_parameters, model_spec
from workshop_lib.train.runtime import Runtime, barrier, print_main, run_entry_point
from workshop_lib.train.sharding import local_parameter_count


def parse_args(argv=None):
    parser = common_parser(__doc__.splitlines()[0])
    parser.set_defaults(model="tiny-llama", learning_rate=1e-4)
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    parser.add_argument("--ep", type=int, default=1, help="expert-parallel size (Mixtral)")
    parser.add_argument("--sp", action="store_true", help="sequence parallel (where the library supports it)")
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--eval-samples", type=int, default=32)
    parser.add_argument("--warmup-steps", type=int, default=0)
    args = parser.parse_args(argv)
    check_positive(tp=args.tp, ep=args.ep, global_batch=args.global_batch, samples=args.samples)
    return args


def parallel_layout(tp: int, ep: int, world_size: int, is_moe: bool) -> int:
    """Check the layout; return the data-parallel width (ranks that see distinct batches)."""
    if world_size % tp:
        raise WorkshopError(f"--tp {tp} does not divide the {world_size} processes; make the number of "
                            "GPUs a multiple of TP")
    if ep > 1 and not is_moe:
        raise WorkshopError(f"--ep {ep} needs a mixture-of-experts model (mixtral-8x7b, tiny-mixtral)")
    if ep > 1 and ep != tp:
        raise WorkshopError(f"--ep {ep} with --tp {tp}: this stand-in shards experts over the tensor-parallel "
                            "ranks, so EP must equal TP (e.g. --tp 2 --ep 2 on 4 GPUs)")
    return world_size // tp


def sample_mean_loss(model, batch) -> torch.Tensor:
    """Mean over samples of each sample's mean token loss: independent of how a batch is split."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    if hasattr(logits, "full_tensor"):  # a DTensor from a tensor-parallel output layer
        logits = logits.full_tensor()
    labels = batch["labels"][:, 1:]
    token_loss = F.cross_entropy(logits[:, :-1].float().transpose(1, 2), labels,
                                 ignore_index=IGNORE_INDEX, reduction="none")
    counted = (labels != IGNORE_INDEX).sum(dim=1).clamp(min=1)
    return (token_loss.sum(dim=1) / counted).mean()


def load_sharded(spec, args, runtime: Runtime, dp_width: int):
    """The model split over the ranks. Tiny and --random-init models are saved once, then reloaded,
    because only ``from_pretrained`` accepts a distributed configuration."""
    from transformers import AutoModelForCausalLM
    from transformers.distributed import DistributedConfig

    model = build_model(spec, args.random_init, args.seed)
    if args.tp == 1 and runtime.world_size == 1:
        return model.to(runtime.device), model
    source = spec.hub_name
    if spec.is_tiny or args.random_init:
        source = str(Path(args.output_dir) / "initial-model")
        if runtime.is_main:
            model.save_pretrained(source)
        barrier()
    reference = model
    config = DistributedConfig(tp_size=args.tp, ep_size=args.ep if args.ep > 1 else None,
                               fsdp_size=dp_width if dp_width > 1 else None)
    return AutoModelForCausalLM.from_pretrained(source, distributed_config=config, dtype=torch.float32), reference


def run(args, runtime: Runtime) -> dict:
    spec = model_spec(args.model)
    if spec.family == "gpt":
        raise WorkshopError("--model gpt runs with `-m workshop_lib.train.gpt`")
    dp_width = parallel_layout(args.tp, args.ep, runtime.world_size, spec.is_moe)
    if args.global_batch % dp_width:
        raise WorkshopError(f"--global-batch {args.global_batch} does not split over {dp_width} "
                            "data-parallel groups; pick a multiple")
    precision = resolve_precision(args.precision, runtime.device_kind)
    if args.sp:
        print_main(runtime, "== note: --sp requested; transformers' native TP does not wire sequence "
                            "parallelism yet, so this run goes without it")
    writer = MetricsWriter(args.output_dir, enabled=runtime.is_main)
    tokenizer = load_tokenizer(spec, args.random_init, runtime)
    data = prepare_data(args.data, runtime, tokenizer, args.samples, args.eval_samples, 0, args.max_length)

    model, unsharded = load_sharded(spec, args, runtime, dp_width)
    trainable, total = count_parameters(unsharded)
    del unsharded
    local_params = local_parameter_count(model)
    print_header(runtime, "parallel", args.model, trainable, total, precision=precision, tp=args.tp,
                 ep=args.ep, dp=dp_width, local_params_rank0=local_params)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=args.weight_decay)
    # Ranks of one tensor-parallel group (consecutive ranks) must read the same samples.
    settings = LoopSettings(epochs=args.epochs, max_steps=args.max_steps,
                            micro_batch=args.global_batch // dp_width, grad_accum=1,
                            learning_rate=args.learning_rate, weight_decay=args.weight_decay,
                            warmup_steps=args.warmup_steps, precision=precision, seed=args.seed,
                            data_rank=runtime.rank // args.tp, data_world=dp_width, clip_norm=None)
    # No gradient clipping: clip_grad_norm_ fails on a mix of DTensor and plain gradients.
    result = run_loop(model, optimizer, data.train, data.validation, runtime, writer, settings,
                      loss_fn=sample_mean_loss)
    engine_settings = {"tp": args.tp, "ep": args.ep, "dp": dp_width, "sp_requested": args.sp,
                       "sp_applied": False, "global_batch": args.global_batch,
                       "micro_batch_per_rank": args.global_batch // dp_width, "max_steps": args.max_steps,
                       "learning_rate": args.learning_rate, "max_length": args.max_length,
                       "gradient_clipping": False}
    summary = summary_fields(runtime=runtime, engine="parallel", settings=engine_settings, model=args.model,
                             precision=precision, samples=len(data.train),
                             trainable_params=trainable, total_params=total, local_params=local_params,
                             **result.outcome())
    return writer.summary(**summary)


def summary_line(summary: dict) -> str:
    return (f"== summary: {summary['samples_per_s']:.2f} samples/s, final loss {summary['final_loss']:.6f}, "
            f"local parameters per rank {summary['local_params_per_rank']}")


def main(argv=None) -> int:
    return run_entry_point(parse_args, run, argv, summary_line=summary_line)


if __name__ == "__main__":
    sys.exit(main())
