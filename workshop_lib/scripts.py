"""Render an experiment into the SLURM job script a participant reads and submits.

The templates in ``slurm/templates/`` hold the layout and the comments; this module decides what goes
in them (directives, the launch command, which monitors run) so that templates stay free of logic.
Every profile value reaches the script quoted: command words and names through ``shlex.quote``; paths,
which are shell text so that $USER expands in the job, inside double quotes after the schema's path rule
(profile_schema.SHELL_PATH: only $NAME expansions, no quotes, backquotes or $( )).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import jinja2

from workshop_lib.core.errors import WorkshopError
from workshop_lib.experiments import GPT, HF, NEMO, Experiment
from workshop_lib.profile_schema import SHELL_PATH
from workshop_lib.nemo_checkpoint import (
    COMPLETE_FILES, INCOMPLETE_EXIT, PARTIAL_SUFFIX, checkpoint_shell_path, complete_test,
)
from workshop_lib.core.paths import DS_CONFIGS_DIR, SLURM_DIR
from workshop_lib.profiles import Profile, load_profile
from workshop_lib.reservation import find_reservation
from workshop_lib.site_setup import (
    CACHE_VARIABLES, MISSING_SETUP_EXIT, OFFLINE_VARIABLES, import_requirements, import_step, shared_exports,
    job_requirements, setup_command,
)
from workshop_lib.checks.experiment_rules import raise_for_experiment

TEMPLATES_DIR = SLURM_DIR / "templates"
# Files every job writes into its run directory (the job's working directory); see workshop_lib.runs.
STDOUT_PATTERN = "slurm-%j.out"
TRAIN_DIR = "train"
CPU_MEMORY_LOG = "cpu_memory.txt"
NCCL_LOG = "nccl_allreduce.txt"
GPU_QUERY = "timestamp,index,name,utilization.gpu,memory.used,memory.total"
# A full fine-tune's recipe saves weights and optimizer state every 50 steps (about 0.34 TB per Llama run,
# 2 TB per Mixtral run) and no lesson reads them back. NeMo 2.4.1's parser takes both keys: without the
# logger's ModelCheckpoint, Lightning would add its own unless checkpointing is switched off as well.
NO_CHECKPOINTS = ("log.ckpt=None", "trainer.enable_checkpointing=False")
@dataclass(frozen=True)
class Directive:
    """One #SBATCH line and the short comment above it."""

    option: str
    value: str
    comment: str

    @property
    def line(self) -> str:
        return f"#SBATCH --{self.option}={self.value}"


STAND_IN = "stand-in"  # chapters 1-2 realised by the PyTorch/PEFT engines where NeMo is off
REHEARSAL = "rehearsal"  # the class rehearsal's jobs: they sleep and write made-up numbers


def run_engine(experiment: Experiment, profile: Profile) -> str:
    """What actually trains this experiment on this site: `nemo`, `stand-in` (a NeMo experiment on a
    profile without NeMo), or the experiment's own engine (`hf`, `gpt`); `rehearsal` where nothing trains."""
    if profile.rehearsal is not None:
        return REHEARSAL
    if experiment.engine == NEMO:
        return NEMO if profile.nemo.enabled else STAND_IN
    return experiment.engine


def template_for(experiment: Experiment, profile: Profile) -> str:
    """Which template realises this experiment on this site."""
    if profile.rehearsal is not None:
        return "rehearsal.sbatch.j2"
    if experiment.engine == NEMO and profile.nemo.enabled:
        return "nemo_finetune.sbatch.j2"
    return "torchrun_multi_node.sbatch.j2" if experiment.multi_node else "torchrun_single_node.sbatch.j2"


def render_script(experiment: Experiment, profile: Profile | str | None = None,
                  deepspeed_config: str | None = None) -> str:
    """The job script for one experiment on one site.

    ``deepspeed_config`` is the path the job passes to ``--deepspeed``; by default the file in
    slurm/ds_configs/. Submission copies the file into the run directory and passes its name instead,
    so a later edit of the shared config cannot change a queued job.
    """
    profile = load_profile(profile) if not isinstance(profile, Profile) else profile
    raise_for_experiment(experiment, profile)
    uses_nemo = experiment.engine == NEMO and profile.nemo.enabled
    context = {
        "experiment": experiment,
        "profile": profile,
        "title": experiment.title,
        "origin": (f"Experiment {experiment.id} (content hash {experiment.content_hash}), "
                   f'site profile "{profile.name}", rendered by `workshop render`.'),
        "directives": directives(experiment, profile),
        "cache_exports": cache_exports(profile),
        "site": site_context(experiment, profile),
        "gpu_query": GPU_QUERY,
        "train_dir": TRAIN_DIR,
        "cpu_memory_log": CPU_MEMORY_LOG,
        "nccl_log": NCCL_LOG,
        "q": shlex.quote,
        "dq": _double_quoted,
    }
    if profile.rehearsal is not None:
        context["rehearsal"] = rehearsal_context(experiment, profile)
    elif uses_nemo:
        context["nemo"] = nemo_context(experiment, profile)
    else:
        if experiment.zero_stage is not None and deepspeed_config is None:
            deepspeed_config = str(DS_CONFIGS_DIR / experiment.deepspeed_config)
        arguments = training_arguments(experiment, profile, deepspeed_config)
        context["nproc_per_node"] = experiment.gpus_per_node
        context["launch"] = torchrun_launch(experiment, profile, arguments)
        if experiment.multi_node and experiment.nccl_check and profile.bandwidth_check:
            context["bandwidth"] = bandwidth_context(experiment, profile)
    text = _environment().get_template(template_for(experiment, profile)).render(context)
    return _tidy(text)


def render_import_script(model: str, profile: Profile | str | None = None) -> str:
    """The one-off job that converts a Hugging Face checkpoint for NeMo (`nemo llm import`)."""
    profile = load_profile(profile) if not isinstance(profile, Profile) else profile
    if not profile.nemo.enabled:
        raise WorkshopError(f"profile {profile.name!r} does not run NeMo, so there is nothing to import; "
                            "the tiny engines build their models on the spot")
    if model not in profile.nemo.factories or model not in profile.nemo.hub_ids:
        raise WorkshopError(f"profile {profile.name!r} has no NeMo factory or hub id for {model!r}: add it "
                            "under nemo.factories and nemo.hub_ids")
    context = {
        "model": model,
        "profile": profile,
        "title": f"Import {model} from the Hugging Face hub into NeMo's checkpoint format",
        "origin": f'Site profile "{profile.name}", rendered by `workshop render --import-model`.',
        "factory": profile.nemo.factories[model],
        "hub_id": profile.nemo.hub_ids[model],
        "directives": [
            Directive("job-name", f"import-{model}", "a CPU-heavy conversion; one GPU keeps the container happy"),
            Directive("nodes", "1", "one node"),
            Directive("ntasks-per-node", "1", "one task runs the conversion"),
            Directive("gpus-per-node", "1", "one GPU"),
            Directive("cpus-per-task", "8", "tokenizer and weight conversion use the CPUs"),
            Directive("mem", "256G", "the whole checkpoint passes through host memory"),
            *_site_directives(profile, time_limit="02:00:00"),
            Directive("output", STDOUT_PATTERN, "the log lands in the directory sbatch is called from"),
        ],
        "cache_exports": cache_exports(profile),
        "site": {"offline_variables": OFFLINE_VARIABLES if profile.offline else (),
                 "modules": profile.nemo.modules,
                 "conda_root": None,
                 "requirements": import_requirements(profile),
                 "missing_exit": MISSING_SETUP_EXIT},
        "container": _container_prefix(profile),
        "checkpoint": {"path": checkpoint_shell_path(profile.nemo.hub_ids[model]), "partial_suffix": PARTIAL_SUFFIX,
                       "files": COMPLETE_FILES, "test": complete_test('"$1"'), "incomplete_exit": INCOMPLETE_EXIT,
                       "rerun": setup_command(profile, only=import_step(model))},
        "q": shlex.quote,
        "dq": _double_quoted,
    }
    return _tidy(_environment().get_template("nemo_import.sbatch.j2").render(context))


def site_context(experiment: Experiment, profile: Profile) -> dict:
    """The site's environment for one job: modules, conda, offline switches and the setup checks."""
    uses_nemo = experiment.engine == NEMO and profile.nemo.enabled
    python = profile.python
    conda_root = None if uses_nemo else python.conda_root
    return {
        "offline_variables": OFFLINE_VARIABLES if profile.offline else (),
        "modules": profile.nemo.modules if uses_nemo else python.modules,
        "conda_root": conda_root,
        "conda_environment": python.conda_environment,
        "requirements": job_requirements(experiment, profile),
        "missing_exit": MISSING_SETUP_EXIT,
    }


def directives(experiment: Experiment, profile: Profile) -> list[Directive]:
    """The #SBATCH lines: the experiment's resources, then the site's placement and limits."""
    if experiment.engine == NEMO:
        # Lightning starts one rank per SLURM task: tasks per node must equal the GPUs per node.
        tasks = Directive("ntasks-per-node", str(experiment.gpus_per_node),
                          "Lightning/NeMo start one process per task: one task per GPU (never --ntasks)")
        processes_per_task = 1
    else:
        tasks = Directive("ntasks-per-node", "1", "one task per node: torchrun starts one process per GPU")
        processes_per_task = experiment.gpus_per_node
    cpus = experiment.cpus_per_task * processes_per_task
    return [
        Directive("job-name", experiment.job_name, "the name squeue and the log show"),
        Directive("nodes", str(experiment.nodes), "nodes of the job"),
        tasks,
        Directive("gpus-per-node", str(experiment.gpus_per_node), "GPUs on each node (not --gpus-per-task)"),
        Directive("cpus-per-task", str(cpus), f"CPU cores per task: {experiment.cpus_per_task} per training process "
                  f"({processes_per_task} in each task) for data loading and offload"),
        Directive("mem", experiment.memory, "host memory per node"),
        *_site_directives(profile, time_limit=profile.time_limit(experiment.chapter)),
        Directive("output", STDOUT_PATTERN, "stdout and stderr, in the run directory sbatch is called from"),
    ]


def _site_directives(profile: Profile, time_limit: str) -> list[Directive]:
    scheduler = profile.scheduler
    lines = []
    if scheduler.constraint:
        lines.append(Directive("constraint", scheduler.constraint, "node feature: the GPU type (NeMo needs A100)"))
    if scheduler.partition:
        lines.append(Directive("partition", scheduler.partition, "partition of this site"))
    if scheduler.account:
        lines.append(Directive("account", scheduler.account, "account charged for the job"))
    reservation = find_reservation(profile)
    if reservation:
        lines.append(Directive("reservation", reservation.name,
                               f"the workshop's reserved nodes (set by {reservation.origin})"))
    lines.append(Directive("time", time_limit, "wall-clock limit"))
    return lines


def site_directives_without_gpu_type(profile: Profile, time_limit: str) -> list[Directive]:
    """The site's placement for a CPU-only job (JupyterLab): partition, account, reservation and time,
    without the GPU-type constraint (any compute node will do)."""
    return [line for line in _site_directives(profile, time_limit) if line.option != "constraint"]


def render_template(name: str, context: dict) -> str:
    """A template of slurm/templates with the quoting helpers every script uses."""
    return _tidy(_environment().get_template(name).render({"q": shlex.quote, "dq": _double_quoted, **context}))


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


def cache_exports(profile: Profile) -> list[tuple[str, str]]:
    """(variable, shell value) pairs redirecting caches under the profile's cache root, if it has one."""
    if not profile.cache_root:
        return []
    return [(name, f'"$CACHE_ROOT/{folder}"') for name, folder in CACHE_VARIABLES.items()] + shared_exports(profile)


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


def rehearsal_context(experiment: Experiment, profile: Profile) -> dict:
    """The rehearsal's stand-in for training (workshop_lib.train.rehearsal): read the staged folder, sleep,
    write the run's files."""
    rehearsal = profile.rehearsal
    words = [shlex.quote(profile.python.python), "-m", "workshop_lib.train.rehearsal",
             "--experiment", shlex.quote(experiment.id), "--output-dir", TRAIN_DIR, "--sleep", f"{rehearsal.sleep_s:g}"]
    if rehearsal.staged:
        words += ["--staged", _double_quoted(rehearsal.staged)]
    return {"sleep_s": f"{rehearsal.sleep_s:g}", "command": " ".join(words)}


def nemo_context(experiment: Experiment, profile: Profile) -> dict:
    """The NeMo Factory command: factory name and the overrides, one per line in the script."""
    factory = profile.nemo.factories.get(experiment.model)
    if not factory:
        raise WorkshopError(f"profile {profile.name!r} has no NeMo factory for model {experiment.model!r}: "
                            f"add it under nemo.factories")
    return {"factory": nemo_factory(experiment, factory),
            "overrides": nemo_overrides(experiment, profile.training.max_steps),
            "container": _container_prefix(profile) if profile.nemo.image else "",
            "command": " ".join(shlex.quote(word) for word in profile.nemo.command.split())}


def nemo_factory(experiment: Experiment, factory: str) -> str:
    """The recipe: LoRA is the factories' default; a full fine-tune asks for the recipe's own
    (peft_scheme=None: learning rate 5e-6, distributed optimizer), not LoRA's recipe with `peft=none`."""
    return factory if experiment.peft == "lora" else f"{factory}(peft_scheme=None)"


def nemo_overrides(experiment: Experiment, max_steps_cap: int | None = None) -> list[str]:
    """NeMo Factory `key=value` overrides for an experiment, in the order the seeds explain them
    (``max_steps_cap``: a profile's cap on the optimizer steps, as the Hugging Face jobs get it)."""
    overrides = [
        f"trainer.num_nodes={experiment.nodes}",
        f"trainer.devices={experiment.gpus_per_node}",
    ]
    for key, value in (("trainer.max_steps", _smallest(experiment.max_steps, max_steps_cap)),
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
    if full_finetune:
        overrides += NO_CHECKPOINTS
    # LoRA is the recipe's default PEFT scheme (Llama: rank 8 on q/k/v, output and MLP; Mixtral: rank 32
    # on linear_qkv and linear_proj): nothing to add.
    return overrides


def _container_prefix(profile: Profile) -> str:
    # The image and bind paths are shell text from the profile ($USER expands in the job): kept in
    # double quotes rather than shlex-quoted, and refused when they could break out of those quotes.
    parts = ["singularity", "exec", "--nv"]
    for bind in profile.nemo.binds:
        parts += ["--bind", _double_quoted(bind)]
    parts.append('"$NEMO_IMAGE"')
    return " ".join(parts)


def _double_quoted(shell_text: str) -> str:
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
    max_steps = _smallest(experiment.max_steps, training.max_steps)
    if max_steps is not None:
        arguments += ["--max-steps", str(max_steps)]
    if experiment.epochs is not None:
        arguments += ["--epochs", str(experiment.epochs)]
    if experiment.engine == NEMO:
        arguments += _nemo_stand_in_arguments(experiment)
    elif experiment.engine == HF:
        arguments += _hf_arguments(experiment, profile, deepspeed_config)
    elif experiment.engine == GPT:
        arguments += _gpt_arguments(experiment, profile)
    return arguments


def _entry_point(experiment: Experiment) -> str:
    if experiment.engine == NEMO:
        return "lora" if experiment.peft == "lora" else "parallel"
    return experiment.engine


def _nemo_stand_in_arguments(experiment: Experiment) -> list[str]:
    # Off a NeMo site, the LoRA and tensor/expert-parallel engines stand in for NeMo Factory, with the
    # recipe NeMo resolved for the same experiment (book/reference/nemo/resolved.json, `make nemo-check`).
    from workshop_lib.core.reference import recipe_for

    recipe = recipe_for(experiment.id)
    arguments = ["--global-batch", str(recipe["global_batch"]), "--micro-batch", str(recipe["micro_batch"]),
                 "--max-length", str(recipe["seq_length"]), "--learning-rate", str(recipe["learning_rate"]),
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


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,  # shell, not HTML: quoting is done with shlex.quote
    )


def _tidy(text: str) -> str:
    # Templates leave runs of blank lines where optional blocks were skipped; keep one.
    lines, previous_blank = [], False
    for line in text.splitlines():
        blank = not line.strip()
        if not (blank and previous_blank):
            lines.append(line.rstrip())
        previous_blank = blank
    return "\n".join(lines).strip() + "\n"


def write_script(text: str, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
