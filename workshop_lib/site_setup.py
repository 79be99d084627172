"""`workshop setup ibex`: everything a participant prepares once on a login node, as numbered steps.

Each step is a short bash program built from the profile (its paths are shell text: $USER expands),
with a test that says whether it is already done. Running the plan skips done steps, runs the rest in
order and records each success in a marker file, so a second run does nothing and an interrupted run
resumes at the step that failed. `--dry-run` prints the same programs without running them.

The job scripts check the same markers and files before they start (`job_requirements`): a job whose
setup step was skipped stops at once with the name of that step, instead of reaching for the network.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .errors import WorkshopError
from .experiments import NEMO, Experiment
from .nemo_checkpoint import COMPLETE_FILES, checkpoint_shell_path, complete_test
from .paths import SOURCE_ROOT
from .profiles import Profile
from .reservation import describe_reservation

ENVIRONMENT_FILE = "environment.yml"
LOCK_FILE = "requirements.lock"
MINIFORGE_INSTALLER = "https://github.com/conda-forge/miniforge/releases/latest/download/Miniforge3-Linux-x86_64.sh"
SETUP_COMMAND = "workshop setup ibex"
MISSING_SETUP_EXIT = 45  # a job whose setup step was skipped exits with this status
# The cache variables that would otherwise fill $HOME (seed 000's list plus TORCH_EXTENSIONS_DIR).
CACHE_VARIABLES = {
    "TORCH_HOME": "torch",
    "TORCH_EXTENSIONS_DIR": "torch_extensions",
    "HF_HOME": "hf_cache",
    "HF_DATASETS_CACHE": "datasets_cache",
    "NEMO_HOME": "nemo_cache",
    "NEMO_DATASETS_CACHE": "nemo_datasets",
    "TRITON_CACHE_DIR": "triton",
    "TMPDIR": "tmp",
}
# Variables that keep Hugging Face libraries from reaching the hub inside jobs.
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")


class SetupError(WorkshopError):
    """A setup step failed or cannot run; the message names the step and how to resume."""


@dataclass(frozen=True)
class Step:
    """One setup step: a bash program, and the test that says it is already done."""

    name: str
    title: str
    commands: tuple[str, ...]
    done_test: str  # bash condition; true when the step's product exists
    produces: tuple[str, ...] = ()  # shell paths the step creates (jobs and the rehearsal check them)
    requires_environment: tuple[str, ...] = ()  # variables that must be set before it runs

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256("\n".join(self.commands).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Requirement:
    """A file a job needs and the setup step that makes it."""

    path: str  # shell text (double-quoted in the script)
    step: str
    what: str
    site: str = "ibex"  # what `workshop setup` is given for this profile

    @property
    def message(self) -> str:
        return (f"Missing: {self.what} ({self.path}); the setup step {self.step!r} has not run. "
                f"On a login node: workshop setup {self.site} --only {self.step}")


# ---- what the profile asks for ------------------------------------------------------------------
def marker(profile: Profile, step: str) -> str:
    """The marker file a step leaves when it succeeded (shell text under the cache root)."""
    return f"{_state_dir(profile)}/{step}.done"


def _state_dir(profile: Profile) -> str:
    if not profile.cache_root:
        raise SetupError(f"profile {profile.name!r} has no cache_root, so `workshop setup` has nowhere to put "
                         "models, data and its records: set cache_root (see slurm/profiles/ibex.yml)")
    return f"{profile.cache_root}/setup"


def hub_models(profile: Profile) -> list[str]:
    """Hugging Face repositories the Hugging Face jobs load (chapters 3-4 and off-NeMo chapters 1-2)."""
    from .experiments import all_experiments
    # The registry is the one place for hub names; importing it loads no torch (checked by a test).
    from .train.models import REGISTRY

    if profile.training.random_init:
        return []
    names = []
    for experiment in all_experiments():
        if not profile.supports(experiment) or (experiment.engine == NEMO and profile.nemo.enabled):
            continue
        spec = REGISTRY.get(profile.model_name(experiment.model))
        if spec and spec.hub_name and spec.hub_name not in names:
            names.append(spec.hub_name)
    return names


def job_requirements(experiment: Experiment, profile: Profile) -> list[Requirement]:
    """What a job needs that only `workshop setup` makes; empty for a profile without a cache root."""
    if not profile.cache_root:
        return []
    uses_nemo = experiment.engine == NEMO and profile.nemo.enabled
    site = _profile_argument(profile)
    needs = []
    if uses_nemo:
        needs.append(Requirement(profile.nemo.image, "nemo-image", "The NeMo container image", site))
        needs.append(Requirement(marker(profile, "nemo-data"), "nemo-data", "NeMo's prepared SQuAD", site))
        needs.append(Requirement(marker(profile, import_step(experiment.model)), import_step(experiment.model),
                                 f"The NeMo checkpoint of {experiment.model}", site))
        return needs
    python = profile.python
    if python.conda_root:
        needs.append(Requirement(f"{python.conda_root}/etc/profile.d/conda.sh", "miniforge", "Miniforge", site))
        needs.append(Requirement(marker(profile, "environment"), "environment",
                                 f"The conda environment {python.conda_environment}", site))
    if profile.offline and (hub_models(profile) or profile.training.data == "squad"):
        needs.append(Requirement(marker(profile, "hub-download"), "hub-download", "The models and SQuAD", site))
    return needs


def import_requirements(profile: Profile) -> list[Requirement]:
    """The image and the downloaded checkpoint a `nemo llm import` job reads."""
    if not profile.cache_root:
        return []
    site = _profile_argument(profile)
    needs = [Requirement(profile.nemo.image, "nemo-image", "The NeMo container image", site)]
    if profile.offline:
        needs.append(Requirement(marker(profile, "hub-download"), "hub-download", "The downloaded checkpoints", site))
    return needs


def check_before_submit(experiment: Experiment, profile: Profile, environ: dict | None = None) -> None:
    """Refuse to submit a job whose setup step has not run, on the machine that submits it.

    The job checks the same files again when it starts (on a compute node, where storage could differ),
    but a participant should hear about a skipped step before waiting in the queue.
    """
    environ = dict(os.environ if environ is None else environ)
    environ.setdefault("USER", os.environ.get("USER") or _login_name())
    missing = [need for need in job_requirements(experiment, profile)
               if not Path(_expand(need.path, environ)).exists()]
    if missing:
        raise SetupError(f"{experiment.id} cannot run yet. " + " ".join(need.message for need in missing))


def _expand(shell_path: str, environ: dict) -> str:
    # Profile paths only hold $NAME / ${NAME} (profile_schema.SHELL_PATH): expand those, as bash would.
    import re

    return re.sub(r"\$(?:\{(\w+)\}|(\w+))", lambda match: environ.get(match.group(1) or match.group(2), ""),
                  shell_path)


def _login_name() -> str:
    import getpass

    return getpass.getuser()


# ---- the plan -------------------------------------------------------------------------------------
@dataclass
class Plan:
    profile: Profile
    steps: list[Step]
    preamble: str  # variable assignments every step starts with
    checkout: Path = SOURCE_ROOT
    records: list[str] = field(default_factory=list)


def build_plan(profile: Profile, checkout: Path = SOURCE_ROOT,
               miniforge_installer: str = MINIFORGE_INSTALLER) -> Plan:
    """The steps that prepare this profile's site, in order."""
    python, nemo = profile.python, profile.nemo
    state = _state_dir(profile)
    lines = ['USER="${USER:-$(id -un)}"',  # the profile's paths name $USER; a bare cron or container shell lacks it
             f'CACHE_ROOT="{profile.cache_root}"', f'SETUP_STATE="{state}"',
             f"CHECKOUT={shlex.quote(str(checkout))}"]
    lines += [f'export {name}="$CACHE_ROOT/{folder}"' for name, folder in CACHE_VARIABLES.items()]
    if python.conda_root:
        lines += [f'CONDA_ROOT="{python.conda_root}"', f"CONDA_ENV={shlex.quote(python.conda_environment or '')}"]
    if nemo.enabled:
        lines.append(f'NEMO_IMAGE="{nemo.image}"')
    steps = [Step("folders", "folders for caches, images and setup records under the cache root",
                  ('mkdir -p "$SETUP_STATE" ' + " ".join(f'"${name}"' for name in CACHE_VARIABLES),),
                  '[ -d "$SETUP_STATE" ]', produces=(state,))]
    if python.conda_root:
        steps += _conda_steps(profile, miniforge_installer)
    if profile.offline:
        steps.append(_hub_download_step(profile, nemo_models=list(nemo.hub_ids.values()) if nemo.enabled else []))
    if nemo.enabled:
        steps += _nemo_steps(profile)
    return Plan(profile, steps, "\n".join(lines), checkout)


def _conda_steps(profile: Profile, installer: str) -> list[Step]:
    python = profile.python
    conda = '"$CONDA_ROOT/bin/conda"'
    env_python = '"$CONDA_ROOT/envs/$CONDA_ENV/bin/python"'
    modules = [f"module load {shlex.quote(module)}" for module in python.modules]
    return [
        Step("miniforge", "Miniforge (conda) under the cache root's storage, not $HOME",
             (f"curl -fsSL --retry 3 -o \"$CONDA_ROOT.installer.sh\" {shlex.quote(installer)}",
              # -u: an interrupted installation is completed instead of refused.
              'bash "$CONDA_ROOT.installer.sh" -b -u -p "$CONDA_ROOT"',
              'rm -f "$CONDA_ROOT.installer.sh"'),
             '[ -x "$CONDA_ROOT/bin/conda" ] && [ -f "$CONDA_ROOT/etc/profile.d/conda.sh" ]',
             produces=(f"{python.conda_root}/etc/profile.d/conda.sh",)),
        Step("environment", f"the conda environment {python.conda_environment} from {ENVIRONMENT_FILE} "
             f"and {LOCK_FILE} (torch for CUDA 12)",
             (*modules,
              'cd "$CHECKOUT"',
              f'if [ -d "$CONDA_ROOT/envs/$CONDA_ENV" ]; then {conda} env update -n "$CONDA_ENV" -f {ENVIRONMENT_FILE} '
              f'--prune; else {conda} env create -n "$CONDA_ENV" -f {ENVIRONMENT_FILE}; fi',
              # What CI tested is what runs here: the locked torch, built for CUDA 12.
              f"{env_python} -m workshop_lib.site_check torch --lock {LOCK_FILE}",
              f'{env_python} -m ipykernel install --user --name "$CONDA_ENV" --display-name Workshop'),
             _marker_test("environment"), produces=(marker(profile, "environment"),)),
    ]


def _hub_download_step(profile: Profile, nemo_models: list[str]) -> Step:
    python_bin = ('"$CONDA_ROOT/envs/$CONDA_ENV/bin/python"' if profile.python.conda_root
                  else shlex.quote(sys.executable))
    arguments = [f"--model {shlex.quote(name)}" for name in hub_models(profile) + nemo_models]
    if profile.training.data == "squad":
        arguments.append("--dataset squad")
    gated = bool(nemo_models)
    return Step("hub-download", "models and SQuAD from the Hugging Face hub, once, into the shared caches",
                (f"{python_bin} -m workshop_lib.site_check download {' '.join(arguments)}",),
                _marker_test("hub-download"), produces=(marker(profile, "hub-download"),),
                requires_environment=(profile.nemo.hf_token_variable,) if gated else ())


def _nemo_steps(profile: Profile) -> list[Step]:
    nemo = profile.nemo
    modules = tuple(f"module load {shlex.quote(module)}" for module in nemo.modules)
    # The environment's own command: the setup may run without the environment activated.
    workshop = '"$CONDA_ROOT/envs/$CONDA_ENV/bin/workshop"' if profile.python.conda_root else "workshop"
    binds = " ".join(f'--bind "{bind}"' for bind in nemo.binds)
    steps = [
        Step("nemo-image", f"the NeMo container {nemo.image_source} as a Singularity image",
             (*modules,
              'export SINGULARITY_CACHEDIR="$CACHE_ROOT/singularity" SINGULARITY_TMPDIR="$TMPDIR"',
              'mkdir -p "$(dirname "$NEMO_IMAGE")" "$SINGULARITY_CACHEDIR"',
              # Pulled under a temporary name and renamed: a half-written image never looks finished.
              'rm -f "$NEMO_IMAGE.partial"',
              f'singularity pull "$NEMO_IMAGE.partial" {shlex.quote(nemo.image_source or "")}',
              'mv "$NEMO_IMAGE.partial" "$NEMO_IMAGE"'),
             '[ -s "$NEMO_IMAGE" ]', produces=(nemo.image,)),
        # NeMo's SquadDataModule downloads and splits SQuAD on first use; done here, jobs find it ready.
        Step("nemo-data", "NeMo's SQuAD files, prepared inside the container on this login node",
             (*modules,
              f'singularity exec {binds} "$NEMO_IMAGE" python -c '
              + shlex.quote("from nemo.collections.llm.gpt.data import SquadDataModule; "
                            "SquadDataModule(seq_length=2048, micro_batch_size=1, global_batch_size=8)"
                            ".prepare_data()"),),
             _marker_test("nemo-data"), produces=(marker(profile, "nemo-data"),)),
    ]
    for model in nemo.hub_ids:
        step = import_step(model)
        checkpoint = checkpoint_shell_path(nemo.hub_ids[model])
        missing = (shlex.quote("The import job ended without a complete checkpoint in ") + '"$CHECKPOINT"'
                   + shlex.quote(f" (it needs {', '.join(COMPLETE_FILES)}); the job's log is slurm-*.out in ") + '"$PWD"')
        steps.append(Step(
            step, f"convert {nemo.hub_ids[model]} to NeMo's format (`nemo llm import`, a batch job; waits for it)",
            ('mkdir -p "$SETUP_STATE"/' + shlex.quote(step),
             'cd "$SETUP_STATE"/' + shlex.quote(step),
             f"{workshop} render --import-model {shlex.quote(model)} --profile {shlex.quote(_profile_argument(profile))} "
             "-o job.sbatch",
             # --wait: sbatch returns when the job ends, with the job's exit status.
             "sbatch --wait job.sbatch",
             # Checked again on this side: the step is done only once the complete checkpoint is in place.
             f"CHECKPOINT={checkpoint}",
             f'{complete_test(chr(34) + "$CHECKPOINT" + chr(34))} || {{ echo {missing} >&2; exit 1; }}'),
            f"{_marker_test(step)} && {complete_test(checkpoint)}", produces=(marker(profile, step),)))
    return steps


def import_step(model: str) -> str:
    """The setup step that converts one model for NeMo."""
    return f"nemo-import-{model}"


def setup_command(profile: Profile, only: str | None = None) -> str:
    """The `workshop setup` command line for this profile (one step with `only`), as a participant types it."""
    words = ["workshop", "setup", _profile_argument(profile)] + (["--only", only] if only else [])
    return shlex.join(words)


def _profile_argument(profile: Profile) -> str:
    from .profiles import PROFILES_DIR

    if profile.source and profile.source.resolve().parent != PROFILES_DIR.resolve():
        return str(profile.source)
    return profile.name


def _marker_test(step: str) -> str:
    return f'[ -f "$SETUP_STATE/{step}.done" ]'


# ---- running it ---------------------------------------------------------------------------------
def step_program(plan: Plan, step: Step, with_marker: bool = True) -> str:
    """The bash program of one step: variables, its commands, then its marker on success."""
    body = [plan.preamble, "set -euo pipefail", *step.commands]
    if with_marker:
        body.append(f'mkdir -p "$SETUP_STATE" && echo {step.fingerprint} > "$SETUP_STATE/{step.name}.done"')
    return "\n".join(body) + "\n"


def select(plan: Plan, only: list[str] | None = None, start: str | None = None) -> list[Step]:
    names = [step.name for step in plan.steps]
    for name in (only or []) + ([start] if start else []):
        if name not in names:
            raise SetupError(f"no setup step {name!r}; the steps are: {', '.join(names)}")
    steps = plan.steps
    if start:
        steps = steps[names.index(start):]
    if only:
        steps = [step for step in steps if step.name in only]
    return steps


def is_done(plan: Plan, step: Step) -> bool:
    program = f"{plan.preamble}\n{step.done_test}\n"
    return subprocess.run(["bash", "-c", program], capture_output=True).returncode == 0


def describe(plan: Plan, steps: list[Step]) -> str:
    """The dry run: each step, whether it is done, and the commands it would run."""
    lines = [f"# {SETUP_COMMAND} --dry-run, profile {plan.profile.name!r} ({plan.profile.source or 'built in'})",
             f"# Batch jobs: {describe_reservation(plan.profile)}",
             "# Variables every step starts with:"]
    lines += [f"    {line}" for line in plan.preamble.splitlines()]
    for number, step in enumerate(steps, 1):
        state = "done, skipped" if is_done(plan, step) else "would run"
        lines.append(f"[{number}/{len(steps)}] {step.name}: {step.title} ({state})")
        if step.requires_environment:
            lines.append(f"    needs: {', '.join('$' + name for name in step.requires_environment)} set in this shell")
        lines += [f"    {command}" for command in step.commands]
        lines.append(f"    then: {_marker_note(step)}")
    return "\n".join(lines)


def _marker_note(step: Step) -> str:
    return f"record $SETUP_STATE/{step.name}.done"


def run(plan: Plan, steps: list[Step], force: bool = False, echo=print, env: dict | None = None) -> list[str]:
    """Run the steps in order, skipping done ones; returns the names of the steps that ran."""
    env = dict(os.environ if env is None else env)
    # The import steps submit batch jobs: a bad reservation name stops the setup before anything runs.
    echo(f"Batch jobs: {describe_reservation(plan.profile, env)}")
    ran = []
    for number, step in enumerate(steps, 1):
        prefix = f"[{number}/{len(steps)}] {step.name}"
        if not force and is_done(plan, step):
            echo(f"{prefix}: already done, skipped")
            continue
        missing = [name for name in step.requires_environment if not env.get(name)]
        if missing:
            raise SetupError(f"{prefix}: set {', '.join(missing)} first (`read -rs {missing[0]} && export {missing[0]}`: "
                             f"the gated models need your Hugging Face token), then run `{SETUP_COMMAND}` again; "
                             "it resumes at this step")
        echo(f"{prefix}: {step.title} ...")
        started = time.monotonic()
        result = subprocess.run(["bash", "-c", step_program(plan, step)], env=env, cwd=str(plan.checkout))
        if result.returncode != 0:
            raise SetupError(f"{prefix} failed (exit status {result.returncode}); its output is above. Fix the cause "
                             f"and run `{SETUP_COMMAND}` again: finished steps are skipped, it resumes here. "
                             f"`{SETUP_COMMAND} --dry-run` shows the commands of every step")
        echo(f"{prefix}: done in {time.monotonic() - started:.1f} s")
        ran.append(step.name)
    return ran
