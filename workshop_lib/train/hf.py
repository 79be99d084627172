"""Hugging Face Trainer fine-tuning (chapters 3 and 4): plain / DDP, DeepSpeed ZeRO, FSDP.

    torchrun --nproc_per_node=N -m workshop_lib.train.hf --output-dir DIR [--deepspeed CONFIG.json
        | --fsdp FULL_SHARD|SHARD_GRAD_OP|HYBRID_SHARD [--offload]] [--samples-per-gpu 500]
        [--recipe seed|tuned] ...

``--recipe seed`` (default) is the seeds' recipe; ``--recipe tuned`` the workshop's faster one
(``workshop_lib.train.recipes`` says what it changes and where each change applies).

On a GPU, FSDP is the Trainer's own. On a CPU the Trainer would silently run plain DDP instead,
so ``--fsdp`` there wraps the model by hand (FSDP1) and trains it with the workshop's loop;
either way every rank's local parameter count lands in the summary, so the sharding shows.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import torch

from workshop_lib.core.errors import WorkshopError
from workshop_lib.core.vocabulary import parse_recipe
from workshop_lib.train.cli import add_sample_count_flags, common_parser, resolve_precision, sample_counts
from workshop_lib.train.common import answer_quality, load_tokenizer, prepare_data, print_header
from workshop_lib.train.features.compile import COMPILE_MODES
from workshop_lib.train.flags import check_positive, report_user_error
from workshop_lib.train.metrics import MetricsWriter, summary_fields
from workshop_lib.train.models import build_model, count_parameters, model_spec
from workshop_lib.train.recipes import (
    ARGUMENTS,
    CALLBACKS,
    MODEL,
    AppliedRecipe,
    TrainerParts,
    apply_features,
    apply_recipe,
)
from workshop_lib.train.runtime import Runtime, print_main, start_runtime, stop_runtime
from workshop_lib.train.sharding import STRATEGIES, fsdp_layout, local_parameter_count, wrap_fsdp
from workshop_lib.train.tensor_census import MemoryProbe
from workshop_lib.train.throughput import counting_trainer_class, write_throughput


def parse_args(argv=None):
    parser = common_parser("workshop_lib.train.hf", __doc__.splitlines()[0])
    add_sample_count_flags(parser)
    parser.add_argument("--per-device-batch", type=int, default=4)
    parser.add_argument("--grad-accum", type=int, default=4)
    parser.add_argument("--eval-samples", type=int, default=100)
    parser.add_argument("--generation-samples", type=int, default=20,
                        help="validation examples answered by greedy generation for EM/F1 (0: skip)")
    engine = parser.add_mutually_exclusive_group()
    engine.add_argument("--deepspeed", metavar="CONFIG.json", help="a DeepSpeed JSON (slurm/ds_configs/)")
    engine.add_argument("--fsdp", choices=STRATEGIES, help="FSDP sharding strategy")
    parser.add_argument("--offload", action="store_true", help="with --fsdp: keep parameters on the CPU")
    parser.add_argument("--save-checkpoints", action="store_true",
                        help="save a checkpoint every epoch as the seeds do (off: runs stay small)")
    parser.add_argument("--recipe", default="seed",
                        help="seed (the seeds' fp16, batch 4 x accumulation 4, padded to 512), tuned, "
                             "or seed+FEATURE+... (see workshop_lib.train.recipes)")
    parser.add_argument("--compile-mode", default="blocks-cpp", choices=COMPILE_MODES,
                        help="what the recipe's compile feature compiles and how (benchmarks/NOTES.md)")
    parser.add_argument("--pad-multiple", type=int, default=None,
                        help="with the recipe's padding: round each batch's length up to a multiple of this "
                             "(default 16, or 64 with its graphs feature)")
    args = parser.parse_args(argv)
    parse_recipe(args.recipe)  # a typo fails here, before any process group exists
    args.samples_total, args.samples_per_gpu = sample_counts(args)
    check_positive(per_device_batch=args.per_device_batch,
                   grad_accum=args.grad_accum, eval_samples=args.eval_samples)
    if args.pad_multiple is not None:
        check_positive(pad_multiple=args.pad_multiple)
    if args.offload and not args.fsdp:
        raise WorkshopError("--offload goes with --fsdp; for DeepSpeed pick an *_offload.json config")
    if args.deepspeed and not Path(args.deepspeed).is_file():
        raise WorkshopError(f"--deepspeed {args.deepspeed}: no such file; the configs live in slurm/ds_configs/")
    return args


def engine_of(args) -> str:
    return "deepspeed" if args.deepspeed else "fsdp" if args.fsdp else "hf"


def deepspeed_settings(path: str) -> dict:
    config = json.loads(Path(path).read_text())
    zero = config.get("zero_optimization", {})
    optimizer_offload = zero.get("offload_optimizer", {})
    param_offload = zero.get("offload_param", {})
    settings = {"config": Path(path).name, "zero_stage": int(zero.get("stage", 0)),
                "offload_optimizer": optimizer_offload.get("device", "none"),
                "offload_param": param_offload.get("device", "none"),
                "pin_memory": bool(optimizer_offload.get("pin_memory") or param_offload.get("pin_memory"))}
    # Buffer sizes the memory estimate needs, where the config sets them (absent: DeepSpeed's defaults)
    for key in ("reduce_bucket_size", "stage3_param_persistence_threshold"):
        if key in zero:
            settings[key] = zero[key]
    return settings


def engine_settings(args, fsdp_implementation: str | None) -> dict:
    settings = {"per_device_batch": args.per_device_batch, "grad_accum": args.grad_accum,
                "samples_per_gpu": args.samples_per_gpu, "samples_total": args.samples_total or None, "epochs": args.epochs,
                "max_steps": args.max_steps, "learning_rate": args.learning_rate,
                "max_length": args.max_length}
    if args.deepspeed:
        settings.update(deepspeed_settings(args.deepspeed))
    if args.fsdp:
        settings.update({"strategy": args.fsdp, "offload": args.offload,
                         "implementation": fsdp_implementation,
                         # FSDP1 offload needs an accelerator; on a CPU it is recorded but not applied
                         "offload_applied": args.offload and fsdp_implementation != "fsdp1-manual"})
    return settings


def trainer_fsdp_arguments(args, layer_class: str) -> dict:
    """The Trainer's FSDP options, as in seed 003's fsdp_cfg.

    Transformers 5 runs FSDP2 by default, which has FULL_SHARD and SHARD_GRAD_OP only; HYBRID_SHARD
    needs the FSDP1 implementation (``version: 1``, deprecated there). FSDP1 builds its shard groups
    from the GPUs each node sees, so on a cluster every node is one shard group.
    """
    options = [args.fsdp.lower(), "auto_wrap"] + (["offload"] if args.offload else [])
    config = {"transformer_layer_cls_to_wrap": [layer_class], "backward_prefetch": "backward_post",
              "forward_prefetch": True, "sync_module_states": True}
    extra = {}
    if args.fsdp == "HYBRID_SHARD":
        config["version"] = 1
        # FSDP1's sharded loss scaler hands the fused AdamW a found-inf tensor of shape [1] where it
        # expects a scalar (RuntimeError in _fused_adam on 4×H200, torch 2.11): the foreach AdamW.
        extra["optim"] = "adamw_torch"
    return {"fsdp": " ".join(options), "fsdp_config": config, **extra}


def pin_fsdp1_strategy(strategy: str) -> None:
    """Make Accelerate's FSDP1 plugin use ``strategy``.

    Transformers 5 hands an FSDP1 strategy to Accelerate as ``reshard_after_forward``, but Accelerate
    (1.15) fills the older ``sharding_strategy`` field from $FSDP_SHARDING_STRATEGY, FULL_SHARD when
    unset, and that field wins: HYBRID_SHARD silently ran as FULL_SHARD on 4×H200 (the run's
    ``fsdp_sharding_strategy`` said so). Setting the variable makes both fields agree.
    """
    os.environ["FSDP_SHARDING_STRATEGY"] = strategy


def recipe_for(args, runtime: Runtime, precision: str) -> AppliedRecipe:
    zero_stage = offload = None
    if args.deepspeed:
        ds = deepspeed_settings(args.deepspeed)
        zero_stage, offload = ds["zero_stage"], ds["offload_optimizer"] != "none"
    recipe = apply_recipe(args.recipe, precision=precision, per_device_batch=args.per_device_batch,
                          grad_accum=args.grad_accum, device_kind=runtime.device_kind, engine=engine_of(args),
                          zero_stage=zero_stage, offload=bool(offload or args.offload),
                          world_size=runtime.world_size)
    if getattr(args, "pad_multiple", None):
        recipe = dataclasses.replace(recipe, pad_multiple=args.pad_multiple)
    return recipe


def engine_training_arguments(args, layer_class: str) -> dict:
    """The TrainingArguments of the engine: DeepSpeed's config, or the Trainer's FSDP."""
    if args.deepspeed:
        return {"deepspeed": args.deepspeed}
    if not args.fsdp:
        return {}
    arguments = trainer_fsdp_arguments(args, layer_class)
    if arguments["fsdp_config"].get("version") == 1:
        pin_fsdp1_strategy(args.fsdp)
    return arguments


def train_with_trainer(args, runtime: Runtime, spec, tokenizer, data, precision: str, writer,
                       recipe: AppliedRecipe, clock=None):
    """Build a Trainer with the recipe's features (``recipes.FEATURE_STEPS``, stage by stage), train, evaluate."""
    from transformers import TrainingArguments

    from workshop_lib.train.callbacks import MemoryProbeCallback, MetricsCallback, ShardSizeCallback
    from workshop_lib.train.profiling import ProfilerCallback, requested_steps
    from workshop_lib.train.timing import PhaseClock

    parts = TrainerParts(recipe, data.train, tokenizer.pad_token_id, args.max_length, spec.layer_class,
                         args.compile_mode)
    apply_features(parts, ARGUMENTS)
    parts.arguments.update(engine_training_arguments(args, spec.layer_class))  # HYBRID_SHARD's optimizer wins
    # TrainingArguments first: with ZeRO-3 it makes from_config build the model already partitioned.
    training_args = TrainingArguments(
        output_dir=args.output_dir, eval_strategy="epoch",
        save_strategy="epoch" if args.save_checkpoints else "no",
        per_device_train_batch_size=args.per_device_batch, per_device_eval_batch_size=recipe.eval_batch,
        gradient_accumulation_steps=args.grad_accum, num_train_epochs=args.epochs, max_steps=args.max_steps,
        learning_rate=args.learning_rate, weight_decay=args.weight_decay,
        bf16=precision == "bf16", fp16=precision == "fp16", use_cpu=runtime.device_kind == "cpu",
        logging_steps=1, report_to="none", seed=args.seed, disable_tqdm=True,
        # Every parameter gets a gradient. The Trainer's default for a model without gradient
        # checkpointing (True) makes DDP walk the autograd graph after every forward (its cost on
        # 4×H200 is in benchmarks/NOTES.md).
        ddp_find_unused_parameters=False, **parts.arguments)
    clock = clock or PhaseClock()
    with clock.phase("model"):
        parts.model = build_model(spec, args.random_init, args.seed)
    trainable, total = count_parameters(parts.model)
    print_header(runtime, engine_of(args), args.model, trainable, total, precision=precision,
                 **({"deepspeed": Path(args.deepspeed).name} if args.deepspeed else {}),
                 **({"fsdp": args.fsdp, "offload": args.offload} if args.fsdp else {}))
    apply_features(parts, MODEL)
    global_batch = args.per_device_batch * args.grad_accum * runtime.world_size
    shard_size = ShardSizeCallback(local_parameter_count)
    memory_probe = MemoryProbe(device_kind=runtime.device_kind)  # first: its census stays out of the step time
    apply_features(parts, CALLBACKS)
    callbacks = [MemoryProbeCallback(memory_probe), MetricsCallback(writer, global_batch, runtime.device_kind),
                 shard_size, *parts.callbacks]
    profile_steps = requested_steps()
    if profile_steps and runtime.is_main:
        callbacks.append(ProfilerCallback(profile_steps, Path(args.output_dir) / "profile.txt", runtime.device_kind))
    with clock.phase("trainer setup"):
        trainer = counting_trainer_class()(
            model=parts.model, args=training_args, train_dataset=parts.train_set, eval_dataset=data.validation,
            callbacks=callbacks,
            **({"data_collator": parts.collator} if parts.collator is not None else {}))
    with clock.phase("train"):
        result = trainer.train()
    trainer.save_state()  # trainer_state.json then carries the final train_* metrics
    eval_seconds = sum(entry.get("eval_runtime", 0.0) for entry in trainer.state.log_history)
    clock.add("train", -eval_seconds)
    clock.add("eval", eval_seconds)
    graph_summary = parts.graph_summary()
    if graph_summary:
        print_main(runtime, "== graphs: " + " ".join(f"{k}={v}" for k, v in graph_summary.items()))
    if runtime.is_main:
        write_throughput(Path(args.output_dir) / "throughput.json", trainer.token_counter, args.grad_accum,
                         recipe, runtime.device_kind, graph_summary)
    eval_loss = next((entry["eval_loss"] for entry in reversed(trainer.state.log_history)
                      if "eval_loss" in entry), None)
    em = f1 = None
    if data.generation_examples:
        with parts.generation(), clock.phase("generation"):
            em, f1 = answer_quality(trainer.model_wrapped, trainer.model, tokenizer, data.generation_examples,
                                    runtime, precision, args.max_length)
        writer.evaluation(trainer.state.global_step, eval_loss if eval_loss is not None else float("nan"), em, f1)
    return {"train_runtime_s": result.metrics["train_runtime"],
            "final_loss": writer.last_loss if writer.last_loss is not None else result.training_loss,
            "samples_processed": trainer.state.global_step * global_batch,
            "trainable_params": trainable, "total_params": total,
            "local_params": shard_size.local_params or local_parameter_count(trainer.model_wrapped),
            "step_times": writer.step_times, "eval_loss": eval_loss, "eval_em": em, "eval_f1": f1,
            "layout": fsdp_layout(trainer.model_wrapped) if args.fsdp else {}, **memory_probe.outcome()}


def train_with_manual_fsdp(args, runtime: Runtime, spec, tokenizer, data, precision: str, writer):
    from workshop_lib.train.loop import LoopSettings, run_loop

    model = build_model(spec, args.random_init, args.seed)
    trainable, total = count_parameters(model)
    print_header(runtime, "fsdp", args.model, trainable, total, precision=precision, fsdp=args.fsdp,
                 offload=args.offload, implementation="fsdp1-manual (Trainer's fsdp= does not shard on CPU)")
    if args.offload:
        print_main(runtime, "== note: --offload is a no-op on a CPU (parameters already live in host memory)")
    wrapped = wrap_fsdp(model, args.fsdp, spec.layer_class, runtime.device, args.offload,
                        runtime.nodes, runtime.local_world_size)
    optimizer = torch.optim.AdamW(wrapped.parameters(), lr=args.learning_rate, weight_decay=args.weight_decay)
    settings = LoopSettings(epochs=args.epochs, max_steps=args.max_steps, micro_batch=args.per_device_batch,
                            grad_accum=args.grad_accum, learning_rate=args.learning_rate,
                            weight_decay=args.weight_decay, warmup_steps=0, precision=precision,
                            seed=args.seed, data_rank=runtime.rank, data_world=runtime.world_size)
    local_params = local_parameter_count(wrapped)  # between steps: only the shard is resident
    quality = None
    if data.generation_examples:
        quality = lambda: answer_quality(wrapped, model, tokenizer, data.generation_examples,  # noqa: E731
                                         runtime, precision, args.max_length)
    result = run_loop(wrapped, optimizer, data.train, data.validation, runtime, writer, settings,
                      clip=wrapped.clip_grad_norm_, answer_quality=quality)
    return {**result.outcome(), "trainable_params": trainable, "total_params": total, "local_params": local_params,
            "layout": fsdp_layout(wrapped)}


def run(args, runtime: Runtime, clock=None) -> dict:
    from workshop_lib.train.timing import PhaseClock

    clock = clock or PhaseClock()
    spec = model_spec(args.model)
    if spec.family == "gpt":
        raise WorkshopError("--model gpt runs with `-m workshop_lib.train.gpt`")
    precision = resolve_precision(args.precision, runtime.device_kind)
    manual_fsdp = bool(args.fsdp) and runtime.device_kind == "cpu"
    recipe = None if manual_fsdp else recipe_for(args, runtime, precision)
    if recipe is not None:  # the recipe may change precision and fold accumulation into the batch
        precision = recipe.precision
        args.per_device_batch, args.grad_accum = recipe.per_device_batch, recipe.grad_accum
        args.learning_rate *= recipe.learning_rate_factor
        if args.max_steps and args.max_steps > 0:  # the same samples in fewer, larger steps
            args.max_steps = max(1, args.max_steps // recipe.batch_factor)
    writer = MetricsWriter(args.output_dir, enabled=runtime.is_main)
    with clock.phase("tokenizer+data"):
        tokenizer = load_tokenizer(spec, args.random_init, runtime)
        data = prepare_data(args.data, runtime, tokenizer, args.samples_total, args.eval_samples,
                            args.generation_samples, args.max_length, per_gpu=args.samples_per_gpu)
    if manual_fsdp:
        with clock.phase("train"):
            outcome = train_with_manual_fsdp(args, runtime, spec, tokenizer, data, precision, writer)
    else:
        outcome = train_with_trainer(args, runtime, spec, tokenizer, data, precision, writer, recipe, clock)
    fsdp_implementation = ("fsdp1-manual" if manual_fsdp else "trainer") if args.fsdp else None
    settings = engine_settings(args, fsdp_implementation)
    settings.update(outcome.pop("layout", {}))  # what FSDP really did with the ranks
    if recipe is not None and args.recipe != "seed":
        settings.update(recipe.settings())  # seed runs keep the settings they always had
    summary = summary_fields(runtime=runtime, engine=engine_of(args),
                             settings=settings, model=args.model,
                             precision=precision, samples=len(data.train), **outcome)
    return writer.summary(**summary)


def main(argv=None) -> int:
    from workshop_lib.train.timing import PhaseClock

    try:
        args = parse_args(argv)
        clock = PhaseClock()
        with clock.phase("process group"):
            runtime = start_runtime(deepspeed=bool(args.deepspeed), cpu_collectives=bool(args.fsdp and args.offload))
        summary = run(args, runtime, clock)
        print_main(runtime, clock.line())
        if runtime.is_main:
            print(f"== summary: {summary['samples_per_s']:.2f} samples/s, final loss {summary['final_loss']:.4f}, "
                  f"peak memory {max(summary['peak_memory_mib_per_rank']):.0f} MiB "
                  f"({summary['peak_memory_kind']})", flush=True)
    except WorkshopError as error:
        return report_user_error(error)
    finally:
        stop_runtime()
    return 0


if __name__ == "__main__":
    sys.exit(main())
