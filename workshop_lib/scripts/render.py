"""Rendering a job script: the template an experiment needs on a profile, its context, and the tidy text."""

from __future__ import annotations

import functools
import shlex
from pathlib import Path

import jinja2

from workshop_lib.checks.experiment_rules import raise_for_experiment
from workshop_lib.core.errors import WorkshopError
from workshop_lib.core.paths import DS_CONFIGS_DIR, SLURM_DIR
from workshop_lib.core.run_directory import (
    CPU_LOG_OF_NODE,
    CPU_MEMORY_LOG,
    GPU_LOG_OF_NODE,
    GPU_QUERY,
    NCCL_LOG,
    RECORD_NAME,
    STDOUT_PATTERN,
    TRAIN_DIR,
)
from workshop_lib.core.vocabulary import NEMO
from workshop_lib.experiments import Experiment
from workshop_lib.scripts.commands import (
    bandwidth_context,
    container_prefix,
    double_quoted,
    nemo_context,
    torchrun_launch,
    training_arguments,
)
from workshop_lib.scripts.directives import Directive, directives, site_directives
from workshop_lib.sites.nemo_checkpoint import (
    BUSY_EXIT,
    COMPLETE_FILES,
    INCOMPLETE_EXIT,
    LOCK_SUFFIX,
    PARTIAL_SUFFIX,
    checkpoint_shell_path,
    complete_test,
    lock_owner_function,
)
from workshop_lib.sites.profiles import Profile, load_profile
from workshop_lib.sites.requirements import (
    CACHE_VARIABLES,
    MISSING_SETUP_EXIT,
    OFFLINE_VARIABLES,
    import_requirements,
    import_step,
    job_requirements,
    setup_command,
    shared_exports,
)

TEMPLATES_DIR = SLURM_DIR / "templates"


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


def leaves_memory_logs(experiment: Experiment, profile: Profile) -> bool:
    """Whether the job writes memory monitor files for its footer's `workshop memory` to summarise: a GPU
    monitor (nvidia-smi), a CPU one (psrecord, in the torchrun templates) or the rehearsal's own files."""
    if profile.rehearsal is not None:
        return True
    return profile.has_nvidia_smi or (experiment.monitor_cpu_memory and template_for(experiment, profile)
                                      .startswith("torchrun_"))


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
        "memory_monitored": leaves_memory_logs(experiment, profile),
        "cache_exports": cache_exports(profile),
        "site": site_context(experiment, profile),
        "gpu_query": GPU_QUERY,
        "train_dir": TRAIN_DIR,
        "record_name": RECORD_NAME,
        "cpu_memory_log": CPU_MEMORY_LOG,
        # Per-node monitor logs, named by the shell variable the job's node task sets (and as the comments say it)
        "gpu_log_of_node": GPU_LOG_OF_NODE.format(node="${node}"),
        "cpu_log_of_node": CPU_LOG_OF_NODE.format(node="${node}"),
        "gpu_log_of_any_node": GPU_LOG_OF_NODE.format(node="<node>"),
        "nccl_log": NCCL_LOG,
        "q": shlex.quote,
        "dq": double_quoted,
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
            *site_directives(profile, time_limit="02:00:00", gpus_per_node=1),
            Directive("output", STDOUT_PATTERN, "the log lands in the directory sbatch is called from"),
        ],
        "cache_exports": cache_exports(profile),
        "site": {"offline_variables": OFFLINE_VARIABLES if profile.offline else (),
                 "modules": profile.nemo.modules,
                 "conda_root": None,
                 "requirements": import_requirements(profile),
                 "missing_exit": MISSING_SETUP_EXIT},
        "container": container_prefix(profile),
        "checkpoint": {"path": checkpoint_shell_path(profile.nemo.hub_ids[model]), "partial_suffix": PARTIAL_SUFFIX,
                       "files": COMPLETE_FILES, "test": complete_test('"$1"'), "incomplete_exit": INCOMPLETE_EXIT,
                       "rerun": setup_command(profile, only=import_step(model)), "lock_suffix": LOCK_SUFFIX,
                       "running_owner": lock_owner_function(), "busy_exit": BUSY_EXIT},
        "q": shlex.quote,
        "dq": double_quoted,
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


def render_template(name: str, context: dict) -> str:
    """A template of slurm/templates with the quoting helpers every script uses."""
    return _tidy(_environment().get_template(name).render({"q": shlex.quote, "dq": double_quoted, **context}))


def cache_exports(profile: Profile) -> list[tuple[str, str]]:
    """(variable, shell value) pairs redirecting caches under the profile's cache root, if it has one."""
    if not profile.cache_root:
        return []
    return [(name, f'"$CACHE_ROOT/{folder}"') for name, folder in CACHE_VARIABLES.items()] + shared_exports(profile)


def rehearsal_context(experiment: Experiment, profile: Profile) -> dict:
    """The rehearsal's stand-in for training (workshop_lib.train.rehearsal): read the staged folder, sleep,
    write the run's files."""
    rehearsal = profile.rehearsal
    words = [shlex.quote(profile.python.python), "-m", "workshop_lib.train.rehearsal",
             "--experiment", shlex.quote(experiment.id), "--output-dir", TRAIN_DIR, "--sleep", f"{rehearsal.sleep_s:g}"]
    if rehearsal.staged:
        words += ["--staged", double_quoted(rehearsal.staged)]
    return {"sleep_s": f"{rehearsal.sleep_s:g}", "command": " ".join(words)}


@functools.lru_cache(maxsize=None)
def _environment() -> jinja2.Environment:
    # One per process: it compiles each template once (a script includes six: compiling them was 90 % of a
    # render). Jinja still reloads a template whose file changed since (auto_reload).
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
