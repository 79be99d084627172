"""The commands a job runs: the torchrun launch and the entry point's arguments for the Hugging Face and GPT
engines, the `nemo llm finetune` factory and overrides, the bandwidth check.
"""

from __future__ import annotations

import re
import shlex

from workshop_lib.core.errors import WorkshopError
from workshop_lib.core.paths import DS_CONFIGS_DIR
from workshop_lib.core.run_directory import TRAIN_DIR
from workshop_lib.core.vocabulary import GPT, HF, NEMO
from workshop_lib.experiments import Experiment
from workshop_lib.sites.profiles import Profile
from workshop_lib.sites.schema import SHELL_PATH
from workshop_lib.sites.step_cap import step_cap

# A full fine-tune's recipe saves weights and optimizer state every 50 steps (about 0.34 TB per Llama run,
# 2 TB per Mixtral run) and no lesson reads them back. NeMo 2.4.1's parser takes both keys: without the
# logger's ModelCheckpoint, Lightning would add its own unless checkpointing is switched off as well.
NO_CHECKPOINTS = ("log.ckpt=None", "trainer.enable_checkpointing=False")


def torchrun_launch(experiment: Experiment, profile: Profile, arguments: list[str]) -> str:
    """The torchrun command line, one flag per line so that a reader can follow it."""
    torchrun = shlex.quote(profile.python.torchrun)
    if experiment.multi_node:
        # Static rendezvous on the head node; each node says which one it is with --node_rank.
        launcher = [torchrun, '--nnodes="$SLURM_NNODES"', f"--nproc_per_node={experiment.gpus_per_node}",
                    '--node_rank="$SLURM_NODEID"', '--master_addr="$MASTER_ADDR"', '--master_port="$MASTER_PORT"']
    else:
        launcher = [torchrun, "--standalone", f"--nproc_per_node={experiment.gpus_per_node}"]
    words = [shlex.quote(argument) for argument in arguments]
    lines = [" ".join(launcher), " ".join(words[:2])]
    # Pair each --flag with its value on one line.
    rest, index = words[2:], 0
    while index < len(rest):
        if index + 1 < len(rest) and not rest[index + 1].startswith("--"):
            lines.append(f"{rest[index]} {rest[index + 1]}")
            index += 2
        else:
            lines.append(rest[index])
            index += 1
    return " \\\n    ".join(lines)


def bandwidth_context(experiment: Experiment, profile: Profile) -> dict:
    """The inter-node all-reduce check: the torch test under the training's own launcher, or nccl-tests."""
    check = profile.bandwidth_check
    context = {"check": check, "environment": sorted(check.environment.items())}
    if check.tool == "torch":
        arguments = ["-m", "workshop_lib.train.bandwidth", "--size-mb", str(check.size_mb),
                     "--iterations", str(check.iterations)]
        context["launch"] = torchrun_launch(experiment, profile, arguments)
    else:
        # One MPI rank per GPU across all nodes: only then does all_reduce_perf cross the network.
        context["modules"] = check.nccl_tests_modules
        context["command"] = _join([check.nccl_tests_command, *check.nccl_tests_arguments, "-g", "1"])
    return context


def nemo_context(experiment: Experiment, profile: Profile) -> dict:
    """The NeMo Factory command: factory name and the overrides, one per line in the script."""
    factory = profile.nemo.factories.get(experiment.model)
    if not factory:
        raise WorkshopError(f"profile {profile.name!r} has no NeMo factory for model {experiment.model!r}: "
                            f"add it under nemo.factories")
    return {"factory": nemo_factory(experiment, factory),
            "overrides": nemo_overrides(experiment, profile.training.max_steps),
            "container": container_prefix(profile) if profile.nemo.image else "",
            "command": " ".join(shlex.quote(word) for word in profile.nemo.command.split())}


# The recipes' sequence length for SQuAD (unpacked); packing fills sequences of this length.
RECIPE_SEQ_LENGTH = 2048


def nemo_factory(experiment: Experiment, factory: str) -> str:
    """The recipe: LoRA is the factories' default; a full fine-tune asks for the recipe's own
    (peft_scheme=None: learning rate 5e-6, distributed optimizer), not LoRA's recipe with `peft=none`.
    Packing is the recipe's own option too; it would pack to 4,096 tokens unless told the unpacked length."""
    arguments = [] if experiment.peft == "lora" else ["peft_scheme=None"]
    if experiment.packed_sequence:
        arguments += ["packed_sequence=True", f"seq_length={RECIPE_SEQ_LENGTH}"]
    return f"{factory}({', '.join(arguments)})" if arguments else factory


def nemo_overrides(experiment: Experiment, max_steps_cap: int | None = None) -> list[str]:
    """NeMo Factory `key=value` overrides for an experiment, in the order the seeds explain them
    (``max_steps_cap``: a profile's cap on the optimizer steps, as the Hugging Face jobs get it)."""
    overrides = [
        f"trainer.num_nodes={experiment.nodes}",
        f"trainer.devices={experiment.gpus_per_node}",
    ]
    for key, value in (("trainer.max_steps", step_cap(experiment.max_steps, max_steps_cap)),
                       ("data.global_batch_size", experiment.global_batch),
                       ("optim.lr_scheduler.warmup_steps", experiment.warmup_steps),
                       ("trainer.limit_val_batches", experiment.limit_val_batches)):
        if value is not None:
            overrides.append(f"{key}={value}")
    full_finetune = experiment.peft == "none"
    # The full fine-tune recipes bring their own layout (Llama TP=2; Mixtral PP=4, VPP=8, EP=8): say every size.
    if experiment.tensor_parallel > 1 or full_finetune:
        overrides.append(f"trainer.strategy.tensor_model_parallel_size={experiment.tensor_parallel}")
    if experiment.pipeline_parallel > 1 or full_finetune:
        overrides.append(f"trainer.strategy.pipeline_model_parallel_size={experiment.pipeline_parallel}")
    if full_finetune:
        overrides.append("trainer.strategy.virtual_pipeline_model_parallel_size=None")
    if experiment.expert_parallel is not None:
        overrides.append(f"trainer.strategy.expert_model_parallel_size={experiment.expert_parallel}")
    if experiment.sequence_parallel:
        overrides.append("trainer.strategy.sequence_parallel=True")
    if experiment.num_layers is not None:
        overrides.append(f"model.config.num_layers={experiment.num_layers}")
    if full_finetune:
        overrides += NO_CHECKPOINTS
    # LoRA is the recipe's default PEFT scheme (Llama: rank 8 on q/k/v, output and MLP; Mixtral: rank 32
    # on linear_qkv and linear_proj): nothing to add.
    return overrides


def container_prefix(profile: Profile) -> str:
    # The image and bind paths are shell text from the profile ($USER expands in the job): kept in
    # double quotes rather than shlex-quoted, and refused when they could break out of those quotes.
    parts = ["singularity", "exec", "--nv"]
    for bind in profile.nemo.binds:
        parts += ["--bind", double_quoted(bind)]
    parts.append('"$NEMO_IMAGE"')
    return " ".join(parts)


def double_quoted(shell_text: str) -> str:
    # The schema's path rule, applied again here: a Profile built in code never passed the schema.
    if not re.fullmatch(SHELL_PATH.pattern, shell_text):
        raise WorkshopError(f"profile path {shell_text!r} is not {SHELL_PATH.expected}; use a plain path")
    return f'"{shell_text}"'


def training_arguments(experiment: Experiment, profile: Profile, deepspeed_config: str | None = None) -> list[str]:
    """`-m workshop_lib.train.<engine> ...` for torchrun, realised for the profile."""
    training = profile.training
    precision = training.precision or experiment.precision
    arguments = ["-m", f"workshop_lib.train.{_entry_point(experiment)}",
                 "--output-dir", TRAIN_DIR,
                 "--model", profile.model_name(experiment.model),
                 "--data", training.data,
                 "--precision", precision]
    if training.random_init:
        arguments.append("--random-init")
    max_steps = step_cap(experiment.max_steps, training.max_steps)
    if max_steps is not None:
        arguments += ["--max-steps", str(max_steps)]
    if experiment.epochs is not None:
        arguments += ["--epochs", str(experiment.epochs)]
    if experiment.engine == NEMO:
        arguments += _nemo_stand_in_arguments(experiment, profile)
    elif experiment.engine == HF:
        arguments += _hf_arguments(experiment, profile, deepspeed_config)
    elif experiment.engine == GPT:
        arguments += _gpt_arguments(experiment, profile)
    return arguments


def _entry_point(experiment: Experiment) -> str:
    if experiment.engine == NEMO:
        return "lora" if experiment.peft == "lora" else "parallel"
    return experiment.engine


def _nemo_stand_in_arguments(experiment: Experiment, profile: Profile) -> list[str]:
    # Off a NeMo site, the LoRA and tensor/expert-parallel engines stand in for NeMo Factory, with the
    # recipe NeMo resolved for the same experiment (book/reference/nemo/resolved.json, `make nemo-check`).
    from workshop_lib.core.reference import recipe_for

    recipe = recipe_for(experiment.id)
    arguments = ["--global-batch", str(recipe["global_batch"]), "--micro-batch", str(recipe["micro_batch"]),
                 "--max-length", str(_smallest(recipe["seq_length"], profile.training.max_length)),
                 "--learning-rate", str(recipe["learning_rate"]),
                 "--warmup-steps", str(recipe["warmup_steps"]), "--weight-decay", str(recipe["weight_decay"]),
                 "--adam-beta2", str(recipe["adam_beta2"]), "--clip-grad", str(recipe["clip_grad"])]
    if experiment.peft == "lora":
        peft = recipe["peft"]
        return arguments + ["--lora-rank", str(peft["dim"]), "--lora-alpha", str(peft["alpha"]),
                            "--lora-targets", ",".join(peft["target_modules"])]
    arguments += ["--tp", str(experiment.tensor_parallel)]
    if experiment.expert_parallel:
        arguments += ["--ep", str(experiment.expert_parallel)]
    if experiment.sequence_parallel:
        arguments.append("--sp")
    return arguments


def _hf_arguments(experiment: Experiment, profile: Profile, deepspeed_config: str | None) -> list[str]:
    arguments = []
    if experiment.per_device_batch is not None:
        arguments += ["--per-device-batch", str(experiment.per_device_batch)]
    if experiment.grad_accum is not None:
        arguments += ["--grad-accum", str(experiment.grad_accum)]
    if experiment.samples_per_gpu is not None:
        arguments += ["--samples-per-gpu", str(experiment.samples_per_gpu)]
    elif experiment.samples is not None:
        # On one GPU a fixed set and a per-GPU share are the same number.
        flag = "--samples-per-gpu" if experiment.gpus == 1 else "--samples"
        arguments += [flag, str(experiment.samples)]
    eval_samples = _smallest(experiment.eval_samples, profile.training.eval_samples)
    if eval_samples is not None:
        arguments += ["--eval-samples", str(eval_samples)]
    if experiment.zero_stage is not None:
        arguments += ["--deepspeed", deepspeed_config or str(DS_CONFIGS_DIR / experiment.deepspeed_config)]
    if experiment.fsdp:
        arguments += ["--fsdp", experiment.fsdp]
        if experiment.offload:
            arguments.append("--offload")
    if experiment.recipe != "seed":  # the seed's recipe is the entry point's default: scripts stay as they were
        arguments += ["--recipe", experiment.recipe]
    return arguments


def _gpt_arguments(experiment: Experiment, profile: Profile) -> list[str]:
    shape = experiment.gpt.__dict__ if experiment.gpt else {}
    # The profile may shrink the width of the model; depth and batch are the experiment's knobs.
    shape = {**shape, **{key: value for key, value in profile.training.gpt_shape.items() if key != "layers"}}
    arguments = []
    for key in ("layers", "hidden", "heads", "ffn", "vocab", "seq_len"):
        if key in shape:
            arguments += [f"--{key.replace('_', '-')}", str(shape[key])]
    if "seq_len" in shape:
        # Samples are tokenized to the model's context length (the position table has no more rows).
        arguments += ["--max-length", str(shape["seq_len"])]
    if experiment.per_device_batch is not None:
        arguments += ["--per-device-batch", str(experiment.per_device_batch)]
    if experiment.samples_per_gpu is not None:
        arguments += ["--samples-per-gpu", str(experiment.samples_per_gpu)]
    if experiment.fsdp:
        arguments += ["--fsdp", experiment.fsdp]
        if experiment.offload:
            arguments.append("--offload")
    return arguments


def _smallest(*values: int | None) -> int | None:
    present = [value for value in values if value is not None]
    return min(present) if present else None


def _join(arguments: list[str]) -> str:
    return " ".join(shlex.quote(argument) for argument in arguments)
