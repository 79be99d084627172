"""Full fine-tuning with tensor and expert parallelism (chapter 2's stand-in for NeMo).

    torchrun --nproc_per_node=N -m workshop_lib.train.parallel --output-dir DIR --model tiny-llama --tp 2
    torchrun --nproc_per_node=4 -m workshop_lib.train.parallel ... --model tiny-mixtral --tp 2 --ep 2

No PEFT: every weight trains. Dense models are split Megatron-style with PyTorch's tensor parallel
(column-parallel Q/K/V and MLP inputs, row-parallel output projections, vocabulary-parallel embedding
and LM head) over ``--tp`` consecutive ranks; the ranks left over are data parallel (GPUs / TP wide):
they split the global batch and average gradients. Real shapes are built on the meta device and each
rank materialises only its shard. Mixtral's experts (``--ep``, equal to ``--tp`` here) go through
``transformers``' native distributed loading. The loss is the mean over samples of each sample's mean
token loss, so it does not depend on how the batch is split: a run with --tp 1 on one process is the
unsharded reference and gives the same losses. The micro-batch, sequence length and learning rate come
from NeMo's resolved recipe (the job script passes them).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from workshop_lib.core.errors import WorkshopError
from workshop_lib.train.cli import common_parser, resolve_precision
from workshop_lib.train.common import load_tokenizer, prepare_data, print_header
from workshop_lib.train.data import IGNORE_INDEX
from workshop_lib.train.flags import check_positive
from workshop_lib.train.loop import LoopSettings, run_loop
from workshop_lib.train.metrics import MetricsWriter, summary_fields
from workshop_lib.train.models import build_model, build_on_meta, count_parameters, materialise, model_spec
from workshop_lib.train.runtime import Runtime, barrier, print_main, run_entry_point
from workshop_lib.train.sharding import local_parameter_count


def parse_args(argv=None):
    parser = common_parser("workshop_lib.train.parallel", __doc__.splitlines()[0])
    parser.set_defaults(model="tiny-llama", learning_rate=1e-4)
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    parser.add_argument("--ep", type=int, default=1, help="expert-parallel size (Mixtral)")
    parser.add_argument("--sp", action="store_true", help="sequence parallel (where the library supports it)")
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--micro-batch", type=int, default=None,
                        help="samples per forward pass per data-parallel rank (NeMo's micro_batch_size); "
                             "default: the whole per-rank share of the global batch")
    parser.add_argument("--adam-beta2", type=float, default=0.999)
    parser.add_argument("--clip-grad", type=float, default=1.0, help="gradient-norm clipping (0: off)")
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


def distributed_config(tp: int, ep: int, dp_width: int):
    """transformers' DistributedConfig for TP x EP. Before 5.21 there is no ``ep_size``; that version's
    ``enable_expert_parallel`` path hangs after loading the weights (seen with 5.17 on 4 GPUs, TP 2 x EP 2),
    so expert parallelism there is refused with the remedy instead of waiting until the time limit."""
    import dataclasses

    import transformers
    from transformers.distributed import DistributedConfig

    known = {item.name for item in dataclasses.fields(DistributedConfig)}
    experts = {}
    if ep > 1:
        if "ep_size" not in known:
            raise WorkshopError(f"--ep {ep} needs transformers 5.21 or newer (this environment has "
                                f"{transformers.__version__}, whose expert-parallel path hangs after loading the "
                                "weights): upgrade it (`pip install 'transformers>=5.21'`, or `make setup` in a "
                                "current checkout), or run with --ep 1")
        experts = {"ep_size": ep}
    return DistributedConfig(tp_size=tp, fsdp_size=dp_width if dp_width > 1 else None, **experts)


def device_mesh(runtime: Runtime, tp: int, dp_width: int):
    """(data parallel, tensor parallel) mesh; consecutive ranks form one tensor-parallel group."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(runtime.device_kind, (dp_width, tp), mesh_dim_names=("dp", "tp"))


def shard_dense(model, tp_mesh) -> None:
    """Megatron's tensor-parallel split of a Llama-family model, with PyTorch's DTensor plans."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plan = {"model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),
            "lm_head": ColwiseParallel(output_layouts=Replicate())}
    parallelize_module(model, tp_mesh, plan)
    layer_plan = {"self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
                  "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
                  "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
                  "mlp.down_proj": RowwiseParallel()}
    for layer in model.model.layers:
        parallelize_module(layer, tp_mesh, layer_plan)


def load_sharded(spec, args, runtime: Runtime, dp_width: int):
    """(model split over the ranks, the unsharded model or None). Real shapes never exist whole:
    built on the meta device, split, then each rank materialises its shard on its GPU."""
    from transformers import AutoModelForCausalLM

    if spec.is_moe and args.ep > 1:
        # Experts through transformers' native EP: only from_pretrained accepts a distributed config.
        model = build_model(spec, args.random_init, args.seed)
        source = str(Path(args.output_dir) / "initial-model")
        if runtime.is_main:
            model.save_pretrained(source)
        barrier()
        config = distributed_config(args.tp, args.ep, dp_width)
        return AutoModelForCausalLM.from_pretrained(source, distributed_config=config, dtype=torch.float32), model
    if spec.is_tiny:  # small enough to build whole: the sharded run then starts from the reference's weights
        model = build_model(spec, args.random_init, args.seed)
        reference = model
        if runtime.world_size > 1:
            shard_dense(model, device_mesh(runtime, args.tp, dp_width)["tp"])
        return model.to(runtime.device), reference
    if not args.random_init:
        raise WorkshopError(f"--model {args.model} without --random-init would load the hub checkpoint whole "
                            "on every rank; the stand-in runs real shapes with --random-init")
    model = build_on_meta(spec)
    if runtime.world_size > 1:
        shard_dense(model, device_mesh(runtime, args.tp, dp_width)["tp"])
    return materialise(model, runtime.device, args.seed), None


def synchronise_and_clip(parameters, dp_width: int, tp: int, max_norm: float) -> float:
    """Average gradients over the data-parallel ranks, then clip by the global norm (NeMo clips at 1.0).
    torch's clip_grad_norm_ refuses a mix of sharded (DTensor) and plain gradients, hence by hand:
    a sharded gradient's squared norm is summed over its tensor-parallel group, a replicated one
    counted once."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    dp_group = tp_group = None
    if world > 1:
        dp_group, tp_group = _groups(world, tp)[rank]
    sharded_sq = torch.zeros((), dtype=torch.float64, device=next(iter(parameters)).device)
    replicated_sq = sharded_sq.clone()
    for parameter in parameters:
        if parameter.grad is None:
            continue
        is_sharded = isinstance(parameter.grad, DTensor)
        local = parameter.grad.to_local() if is_sharded else parameter.grad
        if dp_width > 1:
            dist.all_reduce(local, group=dp_group)
            local.div_(dp_width)
        square = local.double().pow(2).sum()
        if is_sharded and parameter.grad.placements and parameter.grad.placements[0].is_shard():
            sharded_sq += square
        else:
            replicated_sq += square
    if tp > 1 and world > 1:
        dist.all_reduce(sharded_sq, group=tp_group)
    norm = float((sharded_sq + replicated_sq).sqrt())
    if max_norm and norm > max_norm:
        scale = max_norm / (norm + 1e-6)
        for parameter in parameters:
            if parameter.grad is not None:
                local = parameter.grad.to_local() if isinstance(parameter.grad, DTensor) else parameter.grad
                local.mul_(scale)
    return norm


_GROUPS: dict = {}


def _groups(world: int, tp: int) -> dict:
    """For each rank: (its data-parallel group, its tensor-parallel group). Every rank must create every
    group, in the same order, so they are made once for all ranks."""
    import torch.distributed as dist

    if (world, tp) not in _GROUPS:
        tp_groups = [dist.new_group(list(range(start, start + tp))) for start in range(0, world, tp)]
        dp_groups = [dist.new_group(list(range(offset, world, tp))) for offset in range(tp)]
        _GROUPS[(world, tp)] = {rank: (dp_groups[rank % tp], tp_groups[rank // tp]) for rank in range(world)}
    return _GROUPS[(world, tp)]


def run(args, runtime: Runtime) -> dict:
    spec = model_spec(args.model)
    if spec.family == "gpt":
        raise WorkshopError("--model gpt runs with `-m workshop_lib.train.gpt`")
    dp_width = parallel_layout(args.tp, args.ep, runtime.world_size, spec.is_moe)
    precision = resolve_precision(args.precision, runtime.device_kind)
    if args.sp:
        print_main(runtime, "== note: --sp requested; transformers' native TP does not wire sequence "
                            "parallelism yet, so this run goes without it")
    writer = MetricsWriter(args.output_dir, enabled=runtime.is_main)
    tokenizer = load_tokenizer(spec, args.random_init, runtime)
    data = prepare_data(args.data, runtime, tokenizer, args.samples, args.eval_samples, 0, args.max_length)

    model, unsharded = load_sharded(spec, args, runtime, dp_width)
    trainable, total = count_parameters(unsharded) if unsharded is not None else _global_parameter_count(model)
    del unsharded
    local_params = local_parameter_count(model)
    micro_batch, grad_accum = batch_split(args.global_batch, dp_width, args.micro_batch)
    print_header(runtime, "parallel", args.model, trainable, total, precision=precision, tp=args.tp,
                 ep=args.ep, dp=dp_width, micro_batch=micro_batch, micro_batches_per_step=grad_accum,
                 local_params_rank0=local_params)
    # Sharded (DTensor) and replicated (plain) parameters in separate groups: the fused multi-tensor
    # Adam refuses a mix of the two in one call (torch 2.11).
    from torch.distributed.tensor import DTensor

    groups = [[p for p in model.parameters() if isinstance(p, DTensor)],
              [p for p in model.parameters() if not isinstance(p, DTensor)]]
    optimizer = torch.optim.AdamW([{"params": group} for group in groups if group], lr=args.learning_rate,
                                  weight_decay=args.weight_decay, betas=(0.9, args.adam_beta2))
    # Ranks of one tensor-parallel group (consecutive ranks) must read the same samples.
    own_sync = not (spec.is_moe and args.ep > 1)  # transformers' FSDP handles the EP path's data parallelism
    settings = LoopSettings(epochs=args.epochs, max_steps=args.max_steps, micro_batch=micro_batch,
                            grad_accum=grad_accum, learning_rate=args.learning_rate,
                            weight_decay=args.weight_decay, warmup_steps=args.warmup_steps,
                            precision=precision, seed=args.seed, data_rank=runtime.rank // args.tp,
                            data_world=dp_width, clip_norm=args.clip_grad or None)
    parameters = [p for p in model.parameters() if p.requires_grad]
    clip = None
    if own_sync:
        clip = lambda norm: synchronise_and_clip(parameters, dp_width, args.tp, norm)  # noqa: E731
        if not settings.clip_norm and dp_width > 1:
            raise WorkshopError("--clip-grad 0 with data parallelism: the gradient average runs in the clipping "
                                "step; keep --clip-grad > 0")
    result = run_loop(model, optimizer, data.train, data.validation, runtime, writer, settings,
                      loss_fn=sample_mean_loss, clip=clip)
    engine_settings = {"tp": args.tp, "ep": args.ep, "dp": dp_width, "sp_requested": args.sp,
                       "sp_applied": False, "global_batch": args.global_batch,
                       "micro_batch_per_rank": micro_batch, "micro_batches_per_step": grad_accum,
                       "max_steps": args.max_steps, "learning_rate": args.learning_rate,
                       "max_length": args.max_length, "gradient_clipping": bool(own_sync and settings.clip_norm),
                       "built_on_meta_device": not spec.is_tiny}
    summary = summary_fields(runtime=runtime, engine="parallel", settings=engine_settings, model=args.model,
                             precision=precision, samples=len(data.train),
                             trainable_params=trainable, total_params=total, local_params=local_params,
                             **result.outcome())
    return writer.summary(**summary)


def batch_split(global_batch: int, dp_width: int, micro_batch: int | None) -> tuple[int, int]:
    """(micro-batch, micro-batches per step) of one data-parallel rank, as Megatron splits a global batch."""
    if global_batch % dp_width:
        raise WorkshopError(f"--global-batch {global_batch} does not split over {dp_width} data-parallel "
                            "groups; pick a multiple")
    per_rank = global_batch // dp_width
    micro_batch = micro_batch or per_rank
    if per_rank % micro_batch:
        raise WorkshopError(f"--micro-batch {micro_batch} does not divide the {per_rank} samples of each "
                            f"data-parallel rank (global batch {global_batch} / DP {dp_width})")
    return micro_batch, per_rank // micro_batch


def _global_parameter_count(model) -> tuple[int, int]:
    """(trainable, total) of a sharded model: DTensors know their global shape."""
    total = sum(p.numel() for p in model.parameters())  # DTensor.numel() is the global size
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, total


def summary_line(summary: dict) -> str:
    return (f"== summary: {summary['samples_per_s']:.2f} samples/s, final loss {summary['final_loss']:.6f}, "
            f"local parameters per rank {summary['local_params_per_rank']}")


def main(argv=None) -> int:
    return run_entry_point(parse_args, run, argv, summary_line=summary_line)


if __name__ == "__main__":
    sys.exit(main())
