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
from dataclasses import dataclass, field, replace
from pathlib import Path

from workshop_lib.core.errors import WorkshopError
from workshop_lib.experiments import NEMO, Experiment
from workshop_lib.nemo_checkpoint import COMPLETE_FILES, checkpoint_shell_path, complete_test
from workshop_lib.core.paths import SOURCE_ROOT
from workshop_lib.profiles import STAGED_CACHE, STAGED_CHECKOUT, STAGED_SQUAD, Profile, shared_root_of, staged_profile
from workshop_lib.reservation import describe_reservation, reservation_for

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
    # pip's, conda's and other tools' own caches: KAUST asks that none of them grow in $HOME
    # (kaust-rccl/ksl-docs docs/source/systems/ibex/filesystem.rst:27).
    "PIP_CACHE_DIR": "pip",
    "CONDA_PKGS_DIRS": "conda_pkgs",
    "XDG_CACHE_HOME": "xdg_cache",
}
# With a staged folder, jobs read the instructor's model stores in place (read-only); their writable
# caches above stay the participant's own. Values: folders under the staged folder's cache.
SHARED_STORES = {
    "HF_HUB_CACHE": "hf_cache/hub",  # Hugging Face model snapshots ($HF_HOME/hub when staged)
    "NEMO_MODELS_CACHE": "nemo_cache/models",  # NeMo's converted checkpoints ($NEMO_HOME/models when staged)
}
MANIFEST = "STAGED.json"  # written last by the staging: a staged folder without it is unfinished
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
    staged_in: str | None = None  # the class's staged folder, when the instructor makes this file

    @property
    def message(self) -> str:
        if self.staged_in:
            return (f"Missing: {self.what} ({self.path}); the staged folder {self.staged_in} lacks it (its step "
                    f"{self.step!r} has not run there). Tell the instructor, who runs: "
                    f"workshop setup {self.site} --stage {self.staged_in} --only {self.step}")
        return (f"Missing: {self.what} ({self.path}); the setup step {self.step!r} has not run. "
                f"On a login node: workshop setup {self.site} --only {self.step}")


# ---- what the profile asks for ------------------------------------------------------------------
def marker(profile: Profile, step: str) -> str:
    """The marker file a step leaves when it succeeded (shell text under the cache root, or under the
    staged folder's cache for what the instructor staged)."""
    if profile.shared_root and is_staged_step(step):
        return f"{profile.shared_root}/{STAGED_CACHE}/setup/{step}.done"
    return f"{_state_dir(profile)}/{step}.done"


def is_staged_step(step: str) -> bool:
    """Steps whose product a staged folder holds for the whole class (the rest stay per participant)."""
    return step in {"miniforge", "environment", "hub-download", "nemo-image"} or step.startswith("nemo-import-")


def _state_dir(profile: Profile) -> str:
    if not profile.cache_root:
        raise SetupError(f"profile {profile.name!r} has no cache_root, so `workshop setup` has nowhere to put "
                         "models, data and its records: set cache_root (see slurm/profiles/ibex.yml)")
    return f"{profile.cache_root}/setup"


def hub_models(profile: Profile) -> list[str]:
    """Hugging Face repositories the Hugging Face jobs load (chapters 3-4 and off-NeMo chapters 1-2)."""
    from workshop_lib.experiments import all_experiments
    # The registry is the one place for hub names; importing it loads no torch (checked by a test).
    from workshop_lib.train.models import REGISTRY

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

    def need(path: str, step: str, what: str) -> None:
        needs.append(Requirement(path, step, what, site, profile.shared_root if profile.shared_root
                                 and is_staged_step(step) else None))

    if uses_nemo:
        need(profile.nemo.image, "nemo-image", "The NeMo container image")
        need(marker(profile, "nemo-data"), "nemo-data", "NeMo's prepared SQuAD")
        need(marker(profile, import_step(experiment.model)), import_step(experiment.model),
             f"The NeMo checkpoint of {experiment.model}")
        return needs
    python = profile.python
    if python.conda_root:
        need(f"{python.conda_root}/etc/profile.d/conda.sh", "miniforge", "Miniforge")
        need(marker(profile, "environment"), "environment", f"The conda environment {python.conda_environment}")
    if profile.offline and (hub_models(profile) or _uses_squad(profile)):
        need(marker(profile, "hub-download"), "hub-download", "The models and SQuAD")
    return needs


def _uses_squad(profile: Profile) -> bool:
    return profile.training.data == "squad" or bool(profile.shared_root) and \
        profile.training.data == f"{profile.shared_root}/{STAGED_SQUAD}"


def shared_exports(profile: Profile) -> list[tuple[str, str]]:
    """(variable, double-quoted shell value): the staged model stores jobs and setup steps read in place."""
    if not profile.shared_root:
        return []
    return [(name, f'"{profile.shared_root}/{STAGED_CACHE}/{folder}"') for name, folder in SHARED_STORES.items()]


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
               miniforge_installer: str = MINIFORGE_INSTALLER, stage: str | None = None) -> Plan:
    """The steps that prepare this profile's site, in order.

    Three kinds: a participant's own storage (the default); the class's staged folder (`stage`: the same
    steps run once by the instructor under that folder, then published read-only); a participant of a
    class with a staged folder (the profile's shared_root): only what must be their own.
    """
    if stage:
        if profile.shared_root:
            raise SetupError(f"staging into {stage} while the profile already reads a staged folder "
                             f"({profile.shared_root}): unset $WORKSHOP_SHARED_ROOT (and shared_root in the "
                             "profile) for the instructor's staging run")
        profile = staged_profile(profile, stage)
    python, nemo = profile.python, profile.nemo
    state = _state_dir(profile)
    lines = ['USER="${USER:-$(id -un)}"',  # the profile's paths name $USER; a bare cron or container shell lacks it
             f'CACHE_ROOT="{profile.cache_root}"', f'SETUP_STATE="{state}"',
             f"CHECKOUT={shlex.quote(str(checkout))}"]
    if stage:
        # The environment is installed from a copy of the workshop inside the staged folder, so the
        # instructor's own checkout can change during the day without changing the class's code.
        lines += [f'STAGE="{stage.rstrip("/")}"', 'SOURCE="$CHECKOUT"', f'CHECKOUT="$STAGE/{STAGED_CHECKOUT}"']
    if profile.shared_root:
        lines.append(f'SHARED_ROOT="{profile.shared_root}"')
    lines += [f'export {name}="$CACHE_ROOT/{folder}"' for name, folder in CACHE_VARIABLES.items()]
    lines += [f"export {name}={value}" for name, value in shared_exports(profile)]
    if python.conda_root:
        lines += [f'CONDA_ROOT="{python.conda_root}"', f"CONDA_ENV={shlex.quote(python.conda_environment or '')}"]
    if nemo.enabled:
        lines.append(f'NEMO_IMAGE="{nemo.image}"')
    lines.append(_on_compute_node(profile))
    steps = [Step("folders", "folders for caches, images and setup records under the cache root",
                  ('mkdir -p "$SETUP_STATE" ' + " ".join(f'"${name}"' for name in CACHE_VARIABLES),),
                  '[ -d "$SETUP_STATE" ]', produces=(state,))]
    if profile.shared_root:
        return Plan(profile, steps + _participant_steps(profile), "\n".join(lines), checkout)
    if stage:
        steps.append(_checkout_copy_step())
    if python.conda_root:
        steps += _conda_steps(profile, miniforge_installer)
    if profile.offline:
        steps.append(_hub_download_step(profile, nemo_models=list(nemo.hub_ids.values()) if nemo.enabled else []))
    if nemo.enabled:
        steps += _nemo_steps(profile, staging=bool(stage))
    if stage:
        steps.append(_publish_step(profile, [step.name for step in steps if is_staged_step(step.name)]))
    return Plan(profile, steps, "\n".join(lines), checkout)


def _on_compute_node(profile: Profile) -> str:
    """A bash function running its words on a compute node when the setup runs on a login node.

    KAUST: "Please don't create conda environments in login nodes"; allocate a node with srun instead
    (kaust-rccl/ksl-docs docs/source/soft_env/prog_env/python_package_management/conda/ibex.rst:41-50).
    """
    options = (profile.python.build_allocation or "").split()
    reservation = reservation_for(profile)
    if reservation:
        options.append(f"--reservation={reservation}")
    if not options:
        return 'on_compute_node() { "$@"; }  # this profile builds where the setup runs'
    srun = " ".join(["srun", "--nodes=1", "--ntasks=1", *options])
    return ('on_compute_node() { if [ -n "${SLURM_JOB_ID:-}" ]; then "$@"; else '
            f'echo "  (on a compute node: {srun})"; {srun} "$@"; fi; }}')


def _checkout_copy_step() -> Step:
    # Tracked and new files, not runs/, .venv/ or build output; written aside and renamed into place.
    return Step("workshop-copy", "a copy of this workshop checkout that the staged environment is installed from",
                ('rm -rf "$CHECKOUT.partial" && mkdir -p "$CHECKOUT.partial"',
                 # A git checkout: its tracked and new files. Otherwise: all but runs, environments, builds.
                 'if git -C "$SOURCE" rev-parse --is-inside-work-tree >/dev/null 2>&1; then '
                 'git -C "$SOURCE" ls-files -z --cached --others --exclude-standard '
                 '| (cd "$SOURCE" && tar --null -T - -cf -) | tar -xf - -C "$CHECKOUT.partial"; '
                 'else tar -C "$SOURCE" --exclude=./runs --exclude=./.venv --exclude=./_build --exclude=./.state '
                 '-cf - . | tar -xf - -C "$CHECKOUT.partial"; fi',
                 'rm -rf "$CHECKOUT" && mv "$CHECKOUT.partial" "$CHECKOUT"'),
                _marker_test("workshop-copy"), produces=(f"{STAGED_CHECKOUT}",))


def _publish_step(profile: Profile, staged: list[str]) -> Step:
    """The staging's last step: SQuAD as JSON lines, the manifest participants check, read-only for all."""
    python_bin = ('"$CONDA_ROOT/envs/$CONDA_ENV/bin/python"' if profile.python.conda_root
                  else shlex.quote(sys.executable))
    commands = []
    if profile.offline and profile.training.data == "squad":
        commands.append(f'{python_bin} -m workshop_lib.site_check export-squad "$STAGE/{STAGED_SQUAD}"')
    commands += [
        # The commit the class's copy was taken from: a participant's clone can be compared with it.
        f'{python_bin} -m workshop_lib.site_check manifest "$STAGE" '
        '--commit "$(git -C "$SOURCE" rev-parse HEAD 2>/dev/null || echo unknown)" '
        + " ".join(f"--step {name}" for name in staged),
        # Everyone reads, nobody but the instructor writes (participants' jobs never write here).
        'chmod -R a+rX,go-w "$STAGE"',
    ]
    return Step("publish", "SQuAD as JSON lines, the manifest (STAGED.json), read-only for the class",
                tuple(commands), f'[ -f "$STAGE/{MANIFEST}" ] && {_marker_test("publish")}',
                produces=(MANIFEST,))


def _participant_steps(profile: Profile) -> list[Step]:
    """What a participant of a class with a staged folder still makes: nothing large is downloaded."""
    own_plan = build_plan(replace(profile, shared_root=None))
    staged = [step.name for step in own_plan.steps if is_staged_step(step.name)]
    site = _profile_argument(profile)
    checks = [f'[ -f "$SHARED_ROOT/{MANIFEST}" ] || {{ echo "The staged folder $SHARED_ROOT is not published '
              f'(no {MANIFEST}). Tell the instructor, who runs: workshop setup {site} --stage $SHARED_ROOT" >&2; '
              'exit 1; }']
    checks += [f'[ -f "{marker(profile, name)}" ] || {{ echo "The staged folder $SHARED_ROOT lacks step '
               f'{name}. Tell the instructor, who runs: workshop setup {site} --stage $SHARED_ROOT --only {name}" >&2; '
               'exit 1; }' for name in staged]
    done = " && ".join([f'[ -f "$SHARED_ROOT/{MANIFEST}" ]'] + [f'[ -f "{marker(profile, name)}" ]' for name in staged])
    steps = [Step("shared-folder", "check the class's staged folder: environment, image, models, checkpoints",
                  (*checks, 'echo "  staged folder $SHARED_ROOT: ' + ", ".join(staged) + '"'),
                  done)]
    if profile.python.conda_root:
        steps.append(Step("kernel", "the Workshop Jupyter kernel (the staged environment) for this account",
                          ('"$CONDA_ROOT/envs/$CONDA_ENV/bin/python" -m ipykernel install --user --name "$CONDA_ENV" '
                           "--display-name Workshop",),
                          _marker_test("kernel"), produces=(marker(profile, "kernel"),)))
    if profile.nemo.enabled:
        # NeMo writes index files next to the SQuAD files on first use: each participant needs a writable copy.
        steps.append(Step("nemo-data", "a copy of the staged NeMo SQuAD files (NeMo writes its index files there)",
                          ('rm -rf "$NEMO_DATASETS_CACHE/squad.partial"',
                           f'cp -r "$SHARED_ROOT/{STAGED_CACHE}/{CACHE_VARIABLES["NEMO_DATASETS_CACHE"]}/squad" '
                           '"$NEMO_DATASETS_CACHE/squad.partial"',
                           'chmod -R u+w "$NEMO_DATASETS_CACHE/squad.partial"',
                           'rm -rf "$NEMO_DATASETS_CACHE/squad"',
                           'mv "$NEMO_DATASETS_CACHE/squad.partial" "$NEMO_DATASETS_CACHE/squad"'),
                          _marker_test("nemo-data"), produces=(marker(profile, "nemo-data"),)))
    return steps


def _conda_steps(profile: Profile, installer: str) -> list[Step]:
    python = profile.python
    conda = '"$CONDA_ROOT/bin/conda"'
    env_python = '"$CONDA_ROOT/envs/$CONDA_ENV/bin/python"'
    modules = [f"module load {shlex.quote(module)}" for module in python.modules]
    return [
        Step("miniforge", "Miniforge (conda) under the cache root's storage, not $HOME",
             (f"curl -fsSL --retry 3 -o \"$CONDA_ROOT.installer.sh\" {shlex.quote(installer)}",
              # -u: an interrupted installation is completed instead of refused.
              'on_compute_node bash "$CONDA_ROOT.installer.sh" -b -u -p "$CONDA_ROOT"',
              'rm -f "$CONDA_ROOT.installer.sh"'),
             '[ -x "$CONDA_ROOT/bin/conda" ] && [ -f "$CONDA_ROOT/etc/profile.d/conda.sh" ]',
             produces=(f"{python.conda_root}/etc/profile.d/conda.sh",)),
        Step("environment", f"the conda environment {python.conda_environment} from {ENVIRONMENT_FILE} "
             f"and {LOCK_FILE} (torch for CUDA 12)",
             (*modules,
              'cd "$CHECKOUT"',
              f'if [ -d "$CONDA_ROOT/envs/$CONDA_ENV" ]; then on_compute_node {conda} env update -n "$CONDA_ENV" '
              f'-f {ENVIRONMENT_FILE} --prune; else on_compute_node {conda} env create -n "$CONDA_ENV" '
              f'-f {ENVIRONMENT_FILE}; fi',
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


def _nemo_steps(profile: Profile, staging: bool = False) -> list[Step]:
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
             + ('--stage "$STAGE" ' if staging else "") + "-o job.sbatch",
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
    from workshop_lib.profiles import PROFILES_DIR

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
