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
import shlex
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from workshop_lib.core.paths import SOURCE_ROOT
from workshop_lib.sites.class_folder import CLASS_SUBFOLDER
from workshop_lib.sites.nemo_checkpoint import (
    COMPLETE_FILES,
    LOCK_SUFFIX,
    checkpoint_shell_path,
    complete_test,
    lock_owner_function,
)
from workshop_lib.sites.profiles import (
    STAGED_BUNDLE,
    STAGED_CACHE,
    STAGED_CHECKOUT,
    STAGED_SQUAD,
    Profile,
    staged_profile,
)
from workshop_lib.sites.requirements import (
    CACHE_VARIABLES,
    MANIFEST,
    SetupError,
    hub_models,
    import_step,
    is_staged_step,
    marker,
    marker_test,
    profile_argument,
    shared_exports,
    state_dir,
)
from workshop_lib.sites.reservation import reservation_for

ENVIRONMENT_FILE = "environment.yml"
LOCK_FILE = "requirements.lock"
MINIFORGE_INSTALLER = "https://github.com/conda-forge/miniforge/releases/latest/download/Miniforge3-Linux-x86_64.sh"


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
    state = state_dir(profile)
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
                 'rm -rf "$CHECKOUT" && mv "$CHECKOUT.partial" "$CHECKOUT"',
                 # Participants clone the class's commit from the folder itself (`git clone DIR/workshop.bundle`):
                 # a bundle is a plain file, and git refuses to clone a repository another user owns.
                 f'rm -f "$STAGE/{STAGED_BUNDLE}"',
                 'if git -C "$SOURCE" rev-parse --is-inside-work-tree >/dev/null 2>&1; then '
                 f'git -C "$SOURCE" bundle create "$STAGE/{STAGED_BUNDLE}.partial" HEAD '
                 f'&& mv "$STAGE/{STAGED_BUNDLE}.partial" "$STAGE/{STAGED_BUNDLE}"; '
                 'if [ -n "$(git -C "$SOURCE" status --porcelain --untracked-files=no)" ]; then '
                 f'echo "  note: {STAGED_BUNDLE} holds the last commit; the staged copy also has your uncommitted '
                 'changes, which participants\x27 clones will lack: commit, then run this step again"; fi; '
                 f'else echo "  note: $SOURCE is not a git checkout, so there is no {STAGED_BUNDLE} to clone"; fi'),
                marker_test("workshop-copy"), produces=(f"{STAGED_CHECKOUT}",))


def _publish_step(profile: Profile, staged: list[str]) -> Step:
    """The staging's last step: SQuAD as JSON lines, the manifest participants check, read-only for all."""
    python_bin = ('"$CONDA_ROOT/envs/$CONDA_ENV/bin/python"' if profile.python.conda_root
                  else shlex.quote(sys.executable))
    commands = []
    if profile.offline and profile.training.data == "squad":
        commands.append(f'{python_bin} -m workshop_lib.site_check export-squad "$STAGE/{STAGED_SQUAD}"')
    commands += [
        # The commit the class's copy was taken from, as its bundle holds it: participants clone that commit.
        f'{python_bin} -m workshop_lib.site_check manifest "$STAGE" '
        f'--commit "$(git bundle list-heads "$STAGE/{STAGED_BUNDLE}" 2>/dev/null | cut -d " " -f 1 | grep . '
        '|| echo unknown)" '
        + " ".join(f"--step {name}" for name in staged),
        # Everyone reads, nobody but the instructor writes (participants' jobs never write here) - except the
        # class folder, whose group-writable, sticky layout `workshop class init` made (participants publish there).
        f'find "$STAGE" -path "$STAGE/{CLASS_SUBFOLDER}" -prune -o -exec chmod a+rX,go-w {{}} +',
    ]
    return Step("publish", "SQuAD as JSON lines, the manifest (STAGED.json), read-only for the class",
                tuple(commands), f'[ -f "$STAGE/{MANIFEST}" ] && {marker_test("publish")}',
                produces=(MANIFEST,))


def _participant_steps(profile: Profile) -> list[Step]:
    """What a participant of a class with a staged folder still makes: nothing large is downloaded."""
    own_plan = build_plan(replace(profile, shared_root=None))
    staged = [step.name for step in own_plan.steps if is_staged_step(step.name)]
    site = profile_argument(profile)
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
                          marker_test("kernel"), produces=(marker(profile, "kernel"),)))
    if profile.nemo.enabled:
        # NeMo writes index files next to the SQuAD files on first use: each participant needs a writable copy.
        steps.append(Step("nemo-data", "a copy of the staged NeMo SQuAD files (NeMo writes its index files there)",
                          ('rm -rf "$NEMO_DATASETS_CACHE/squad.partial"',
                           f'cp -r "$SHARED_ROOT/{STAGED_CACHE}/{CACHE_VARIABLES["NEMO_DATASETS_CACHE"]}/squad" '
                           '"$NEMO_DATASETS_CACHE/squad.partial"',
                           'chmod -R u+w "$NEMO_DATASETS_CACHE/squad.partial"',
                           'rm -rf "$NEMO_DATASETS_CACHE/squad"',
                           'mv "$NEMO_DATASETS_CACHE/squad.partial" "$NEMO_DATASETS_CACHE/squad"'),
                          marker_test("nemo-data"), produces=(marker(profile, "nemo-data"),)))
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
             marker_test("environment"), produces=(marker(profile, "environment"),)),
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
                marker_test("hub-download"), produces=(marker(profile, "hub-download"),),
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
             marker_test("nemo-data"), produces=(marker(profile, "nemo-data"),)),
    ]
    for model in nemo.hub_ids:
        step = import_step(model)
        checkpoint = checkpoint_shell_path(nemo.hub_ids[model])
        running = "".join([shlex.quote(f"An import of {nemo.hub_ids[model]} is running as job "), '"$owner"',
                           shlex.quote(" (its log: "), '"$PWD/slurm-$owner.out"',
                           shlex.quote("). Leave it running; once it has ended (squeue -j "), '"$owner"',
                           shlex.quote(" shows nothing), run the setup again: it resumes at this step.")])
        missing = (shlex.quote("The import job ended without a complete checkpoint in ") + '"$CHECKPOINT"'
                   + shlex.quote(f" (it needs {', '.join(COMPLETE_FILES)}); the job's log is slurm-*.out in ") + '"$PWD"')
        steps.append(Step(
            step, f"convert {nemo.hub_ids[model]} to NeMo's format (`nemo llm import`, a batch job; waits for it)",
            ('mkdir -p "$SETUP_STATE"/' + shlex.quote(step),
             'cd "$SETUP_STATE"/' + shlex.quote(step),
             f"CHECKPOINT={checkpoint}",
             # The job refuses to start beside a running import too (its lock); this says so before submitting.
             f'LOCK="$CHECKPOINT{LOCK_SUFFIX}"',
             lock_owner_function(),
             f'owner=$(running_owner); if [ -n "$owner" ]; then echo {running} >&2; exit 1; fi',
             f"{workshop} render --import-model {shlex.quote(model)} --profile {shlex.quote(profile_argument(profile))} "
             + ('--stage "$STAGE" ' if staging else "") + "-o job.sbatch",
             # --wait: sbatch returns when the job ends, with the job's exit status.
             "sbatch --wait job.sbatch",
             # Checked again on this side: the step is done only once the complete checkpoint is in place.
             f'{complete_test(chr(34) + "$CHECKPOINT" + chr(34))} || {{ echo {missing} >&2; exit 1; }}'),
            f"{marker_test(step)} && {complete_test(checkpoint)}", produces=(marker(profile, step),)))
    return steps
