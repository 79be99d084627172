"""Resolve `nemo llm finetune` command lines with NeMo itself, in one process (runs in the NeMo environment).

    <nemo env>/bin/python resolve.py COMMANDS.json OUT_DIR

COMMANDS.json is a list of {"id": ..., "factory": ..., "overrides": [...]} (the words of a rendered job
script, see ``workshop_lib.nemo_check.check``). For each command this parses the overrides exactly as the
CLI does (NeMo-Run's ``RunContext.parse_fn``), prints NeMo's own "Resolved Arguments" table (its dry
run), writes the whole resolved configuration as the CLI's ``--to-yaml`` does, and adds what the dry run
does not check: ``trainer.strategy.*`` keys that ``MegatronStrategy`` does not take (it swallows
**kwargs), world-size and batch arithmetic, and Megatron's own TransformerConfig validation.
OUT_DIR/results.json gets one record per command.

Standalone on purpose: it imports nothing of workshop_lib, whose dependencies this environment lacks.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import traceback
from pathlib import Path

# Fusions that need Transformer Engine or Apex, which a CPU machine has not: Megatron's __post_init__
# refuses them there. They change kernels, not the layout being checked.
CPU_FUSIONS_OFF = ("apply_rope_fusion", "gradient_accumulation_fusion", "masked_softmax_fusion",
                   "persist_layer_norm", "bias_activation_fusion", "bias_dropout_fusion",
                   "cross_entropy_loss_fusion", "moe_grouped_gemm")
PARALLEL_FIELDS = ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                   "virtual_pipeline_model_parallel_size", "context_parallel_size", "sequence_parallel",
                   "expert_model_parallel_size", "expert_tensor_parallel_size")


def value(config, name, default=None):
    """An argument of a fiddle Config: the value set, else the signature's default."""
    try:
        return getattr(config, name)
    except AttributeError:
        return default


def strategy_key_errors(overrides: list[str], strategy_class) -> list[str]:
    accepted = {name for name, parameter in inspect.signature(strategy_class.__init__).parameters.items()
                if parameter.kind not in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL)}
    errors = []
    for override in overrides:
        key = override.split("=", 1)[0]
        if key.startswith("trainer.strategy."):
            name = key.removeprefix("trainer.strategy.").split(".")[0]
            if name not in accepted:
                errors.append(f"{key}: MegatronStrategy has no parameter {name!r} (it would be swallowed by "
                              f"**kwargs and ignored); known ones include "
                              f"{', '.join(sorted(n for n in accepted if n.endswith('_size') or 'parallel' in n))}")
    return errors


def layout(task) -> dict:
    strategy = task.trainer.strategy
    sizes = {name: value(strategy, name) for name in PARALLEL_FIELDS}
    tp = sizes["tensor_model_parallel_size"] or 1
    pp = sizes["pipeline_model_parallel_size"] or 1
    cp = sizes["context_parallel_size"] or 1
    ep = sizes["expert_model_parallel_size"] or 1
    etp = sizes["expert_tensor_parallel_size"] or tp  # Megatron: unset means the dense TP size
    world = int(value(task.trainer, "devices")) * int(value(task.trainer, "num_nodes", 1))
    micro = int(value(task.data, "micro_batch_size"))
    global_batch = int(value(task.data, "global_batch_size"))
    dense_dp = world // (tp * pp * cp) if world % (tp * pp * cp) == 0 else None
    expert_dp = world // (etp * ep * pp) if world % (etp * ep * pp) == 0 else None
    accumulation = (global_batch // (micro * dense_dp)
                    if dense_dp and global_batch % (micro * dense_dp) == 0 else None)
    return {"world_size": world, "tp": tp, "pp": pp, "vpp": sizes["virtual_pipeline_model_parallel_size"],
            "cp": cp, "ep": ep, "etp": etp, "sp": bool(sizes["sequence_parallel"]), "dp": dense_dp,
            "expert_dp": expert_dp, "micro_batch": micro, "global_batch": global_batch,
            "micro_batches_per_step": accumulation}


def arithmetic_errors(shape: dict, model_config) -> list[str]:
    errors = []
    world, tp, pp, cp, ep, etp = (shape[k] for k in ("world_size", "tp", "pp", "cp", "ep", "etp"))
    if shape["dp"] is None:
        errors.append(f"world size {world} is not divisible by TP x PP x CP = {tp} x {pp} x {cp}")
    if shape["expert_dp"] is None and ep > 1:
        errors.append(f"world size {world} is not divisible by expert TP x EP x PP = {etp} x {ep} x {pp} "
                      "(Megatron carves the experts out of the data-parallel ranks)")
    if shape["dp"] and shape["micro_batches_per_step"] is None:
        errors.append(f"global batch {shape['global_batch']} is not divisible by micro batch x DP = "
                      f"{shape['micro_batch']} x {shape['dp']}")
    experts = value(model_config, "num_moe_experts")
    if experts and experts % ep:
        errors.append(f"{experts} experts are not divisible by expert_model_parallel_size {ep}")
    layers = value(model_config, "num_layers")
    if layers % pp:
        errors.append(f"{layers} layers are not divisible by pipeline_model_parallel_size {pp}")
    elif shape["vpp"] and (layers // pp) % shape["vpp"]:
        errors.append(f"{layers // pp} layers per pipeline stage are not divisible by "
                      f"virtual_pipeline_model_parallel_size {shape['vpp']}")
    return errors


def megatron_config_errors(task, shape: dict) -> list[str]:
    """Build the model's TransformerConfig with the run's parallel sizes: its __post_init__ is Megatron's
    own validation (e.g. TP with EP needs sequence parallelism, heads divisible by TP)."""
    import copy

    import fiddle as fdl

    config = copy.deepcopy(task.model.config)
    # What MegatronStrategy hands the model config at start-up: the parallel sizes and the pipeline dtype.
    for name in PARALLEL_FIELDS + ("pipeline_dtype",):
        strategy_value = value(task.trainer.strategy, name)
        if strategy_value is not None:
            setattr(config, name, strategy_value)
    for name in CPU_FUSIONS_OFF:
        if name in inspect.signature(config.__fn_or_cls__).parameters:
            setattr(config, name, False)
    try:
        fdl.build(config)
    except Exception as error:  # Megatron raises ValueError/AssertionError/RuntimeError alike
        return [f"Megatron refuses the model config: {type(error).__name__}: {error}"]
    return []


def summary(task) -> dict:
    """The settings the stand-in engines and the book read."""
    import fiddle as fdl

    optimizer = fdl.build(task.optim.config)
    scheduler = task.optim.lr_scheduler
    peft = None
    if task.peft is not None:
        built = fdl.build(task.peft)
        peft = {"class": type(built).__name__, "dim": built.dim, "alpha": built.alpha,
                "dropout": built.dropout, "target_modules": list(built.target_modules)}
    precision = value(task.trainer, "plugins")
    model_config = task.model.config
    return {
        "model_config": model_config.__fn_or_cls__.__name__,
        "num_layers": value(model_config, "num_layers"),
        "model_seq_length": value(model_config, "seq_length"),
        "seq_length": value(task.data, "seq_length"),
        "learning_rate": optimizer.lr, "min_learning_rate": value(scheduler, "min_lr"),
        "warmup_steps": value(scheduler, "warmup_steps"), "weight_decay": optimizer.weight_decay,
        "adam_beta1": optimizer.adam_beta1, "adam_beta2": optimizer.adam_beta2, "clip_grad": optimizer.clip_grad,
        "distributed_optimizer": optimizer.use_distributed_optimizer,
        "precision": value(precision, "precision") if precision is not None else None,
        "max_steps": value(task.trainer, "max_steps"), "val_check_interval": value(task.trainer, "val_check_interval"),
        "limit_val_batches": value(task.trainer, "limit_val_batches"),
        "restore_path": value(value(value(task, "resume"), "restore_config"), "path"),
        "peft": peft,
        "checkpoints": checkpoints(task),
    }


def checkpoints(task) -> dict:
    """What the run writes to disk besides its logs: the logger's ModelCheckpoint, if any (None: Lightning's
    default, on)."""
    ckpt = value(task.log, "ckpt")
    saved = None if ckpt is None else {name: value(ckpt, name) for name in
                                       ("every_n_train_steps", "save_top_k", "save_last", "save_weights_only")}
    return {"enable_checkpointing": value(task.trainer, "enable_checkpointing"), "model_checkpoint": saved}


def resolve_one(command: dict, out_dir: Path) -> dict:
    from nemo.collections import llm
    from nemo.lightning import MegatronStrategy
    from nemo_run.api import CONSOLE
    from nemo_run.cli.api import RunContext, _serialize_configuration
    from nemo_run.run.task import dryrun_fn

    name = command["id"].replace("/", "_")
    record = {"id": command["id"], "factory": command["factory"], "overrides": command["overrides"],
              "flags": command.get("flags", []), "refused_by_workshop": command.get("refused_by_workshop"),
              "accepted": False, "errors": []}
    try:
        task = RunContext(name="finetune", factory=command["factory"]).parse_fn(llm.finetune, command["overrides"])
    except BaseException as error:  # NeMo-Run exits (SystemExit) or raises on a refused override
        message = str(error)
        if " for <" in message:  # NeMo-Run appends the whole configuration: keep what names the problem
            message = message.split(" for <")[0] + " " + message.rsplit(")]>", 1)[-1].strip()
        record["errors"].append(f"NeMo-Run refuses the command: {type(error).__name__}: {message}")
        return record
    with CONSOLE.capture() as captured:
        dryrun_fn(task)
    (out_dir / f"{name}.dryrun.txt").write_text(captured.get())
    _serialize_configuration(task, to_yaml=str(out_dir / f"{name}.yaml"))
    record["dryrun"] = f"{name}.dryrun.txt"
    record["yaml"] = f"{name}.yaml"
    record["errors"] += strategy_key_errors(command["overrides"], MegatronStrategy)
    record["layout"] = layout(task)
    record["errors"] += arithmetic_errors(record["layout"], task.model.config)
    record["errors"] += megatron_config_errors(task, record["layout"])
    record["resolved"] = summary(task)
    record["accepted"] = not record["errors"]
    return record


def main(argv: list[str]) -> int:
    commands_path, out_dir = Path(argv[0]), Path(argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("COLUMNS", "120")
    records = []
    for command in json.loads(commands_path.read_text()):
        try:
            records.append(resolve_one(command, out_dir))
        except Exception:
            records.append({"id": command["id"], "accepted": False,
                            "errors": ["the checker itself failed:\n" + traceback.format_exc()]})
        print(f"{command['id']}: {'accepted' if records[-1]['accepted'] else 'REFUSED'}", flush=True)
    (out_dir / "results.json").write_text(json.dumps(records, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
