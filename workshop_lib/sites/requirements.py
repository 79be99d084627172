"""What a site must hold before a job starts, and the setup steps that provide it.

The job scripts check the same markers and files the setup writes (`job_requirements`): a job whose setup
step was skipped stops at once with the name of that step, instead of reaching for the network. Also the
cache and offline variables every job and setup step exports, and the staged folder's shared stores.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from workshop_lib.core.errors import WorkshopError
from workshop_lib.core.vocabulary import HUB_CHECKPOINTS, NEMO
from workshop_lib.experiments import Experiment
from workshop_lib.sites.profiles import STAGED_CACHE, STAGED_CHECKOUT, STAGED_SQUAD, Profile

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
    return f"{state_dir(profile)}/{step}.done"


def is_staged_step(step: str) -> bool:
    """Steps whose product a staged folder holds for the whole class (the rest stay per participant)."""
    return step in {"miniforge", "environment", "hub-download", "nemo-image"} or step.startswith("nemo-import-")


def is_staged_copy(folder: Path) -> bool:
    """Whether a workshop folder is the copy inside a published staged folder (the class's shared code)."""
    return folder.name == STAGED_CHECKOUT and (folder.parent / MANIFEST).is_file()


def state_dir(profile: Profile) -> str:
    if not profile.cache_root:
        raise SetupError(f"profile {profile.name!r} has no cache_root, so `workshop setup` has nowhere to put "
                         "models, data and its records: set cache_root (see slurm/profiles/ibex.yml)")
    return f"{profile.cache_root}/setup"


def hub_models(profile: Profile) -> list[str]:
    """Hugging Face repositories the Hugging Face jobs load (chapters 3-4 and off-NeMo chapters 1-2)."""
    from workshop_lib.experiments import all_experiments

    if profile.training.random_init:
        return []
    names = []
    for experiment in all_experiments():
        if not profile.supports(experiment) or (experiment.engine == NEMO and profile.nemo.enabled):
            continue
        hub_name = HUB_CHECKPOINTS.get(profile.model_name(experiment.model))
        if hub_name and hub_name not in names:
            names.append(hub_name)
    return names


def job_requirements(experiment: Experiment, profile: Profile) -> list[Requirement]:
    """What a job needs that only `workshop setup` makes; empty for a profile without a cache root."""
    if not profile.cache_root:
        return []
    uses_nemo = experiment.engine == NEMO and profile.nemo.enabled
    site = profile_argument(profile)
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
    site = profile_argument(profile)
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


def import_step(model: str) -> str:
    """The setup step that converts one model for NeMo."""
    return f"nemo-import-{model}"


def setup_command(profile: Profile, only: str | None = None) -> str:
    """The `workshop setup` command line for this profile (one step with `only`), as a participant types it."""
    words = ["workshop", "setup", profile_argument(profile)] + (["--only", only] if only else [])
    return shlex.join(words)


def profile_argument(profile: Profile) -> str:
    """How a command line names this profile: by name where the name finds this very file, else by its path."""
    from workshop_lib.sites.profiles import named_profile_file

    if profile.source and named_profile_file(profile.name).resolve() != profile.source.resolve():
        return str(profile.source)
    return profile.name


def marker_test(step: str) -> str:
    return f'[ -f "$SETUP_STATE/{step}.done" ]'
