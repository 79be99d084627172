"""Site profiles: how a site realises an experiment (modules, images, caches, models, time limits).

A profile is a YAML file in ``slurm/profiles/`` (``ibex.yml``, ``tiny.yml``) or anywhere on disk.
Unknown keys are errors, so a typo in a copied profile fails loudly instead of being ignored.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml

from .errors import WorkshopError
from .experiments import Experiment

SLURM_DIR = Path(__file__).resolve().parent.parent / "slurm"
PROFILES_DIR = SLURM_DIR / "profiles"
DEFAULT_PROFILE_VARIABLE = "WORKSHOP_PROFILE"


class ProfileError(WorkshopError):
    """A profile is missing, malformed, or cannot realise an experiment."""


@dataclass(frozen=True)
class Scheduler:
    """What goes into the #SBATCH lines besides the experiment's own resources."""

    constraint: str | None = None
    partition: str | None = None
    account: str | None = None
    reservation: str | None = None
    time_limits: dict[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NemoSetup:
    """NeMo Factory in a Singularity container (chapters 1-2 on a GPU site)."""

    enabled: bool = False
    modules: tuple[str, ...] = ()
    image: str | None = None
    binds: tuple[str, ...] = ()
    factories: dict[str, str] = field(default_factory=dict)
    hub_ids: dict[str, str] = field(default_factory=dict)
    hf_token_variable: str = "HF_TOKEN"


@dataclass(frozen=True)
class PythonSetup:
    """The Python environment of Hugging Face / GPT jobs and the tools they call."""

    setup: tuple[str, ...] = ()
    python: str = "python"
    torchrun: str = "torchrun"
    psrecord: str = "psrecord"


@dataclass(frozen=True)
class TrainingSetup:
    """How the experiment's model and data are realised here."""

    data: str = "squad"
    models: dict[str, str] = field(default_factory=dict)
    precision: str | None = None
    max_steps: int | None = None
    eval_samples: int | None = None
    gpt_shape: dict[str, int] = field(default_factory=dict)
    # Build the real architecture from its config with random weights: no hub download needed
    # (throughput and memory are the real model's; the loss means nothing).
    random_init: bool = False


@dataclass(frozen=True)
class NcclTests:
    """The all-reduce bandwidth check run before multi-node FSDP jobs."""

    command: str = "all_reduce_perf"
    arguments: str = "-b 4G -e 4G -f 2 -c 0 -n 50 -w 20"
    min_bus_bandwidth_gbps: float = 5.0
    modules: tuple[str, ...] = ()
    environment: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Limits:
    """The grid this site runs: experiments beyond it are not realised here."""

    max_gpus: int | None = None
    max_nodes: int | None = None


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    scheduler: Scheduler
    nemo: NemoSetup
    python: PythonSetup
    training: TrainingSetup
    limits: Limits
    cache_root: str | None = None
    has_nvidia_smi: bool = True
    gpu_monitor_interval_s: int = 5
    cpu_monitor_interval_s: int = 5
    rendezvous_host: str | None = None
    gpu_memory_gib: float | None = None  # memory of one GPU; the fit check refuses what cannot fit (null: no check)
    nccl_tests: NcclTests | None = None
    source: Path | None = None

    def time_limit(self, chapter: int) -> str:
        return self.scheduler.time_limits.get(chapter, "01:00:00")

    def model_name(self, model: str) -> str:
        """The training registry name this site uses for an experiment's model."""
        return self.training.models.get(model, model)

    def supports(self, experiment: Experiment) -> bool:
        return not self.unsupported_reason(experiment)

    def unsupported_reason(self, experiment: Experiment) -> str | None:
        """Why this profile does not realise the experiment, or None when it does."""
        if self.limits.max_gpus is not None and experiment.gpus > self.limits.max_gpus:
            return (f"{experiment.id} needs {experiment.gpus} GPUs; profile {self.name!r} runs at most "
                    f"{self.limits.max_gpus} per job")
        if self.limits.max_nodes is not None and experiment.nodes > self.limits.max_nodes:
            return (f"{experiment.id} needs {experiment.nodes} nodes; profile {self.name!r} runs at most "
                    f"{self.limits.max_nodes}")
        return None

    def require(self, experiment: Experiment) -> None:
        reason = self.unsupported_reason(experiment)
        if reason:
            raise ProfileError(f"{reason}. Pick another experiment, or a profile with larger limits "
                               "(e.g. --profile ibex)")


_SECTIONS = {"scheduler": Scheduler, "nemo": NemoSetup, "python": PythonSetup, "training": TrainingSetup,
             "limits": Limits, "nccl_tests": NcclTests}


def available_profiles() -> list[str]:
    return sorted(path.stem for path in PROFILES_DIR.glob("*.yml"))


def default_profile_name() -> str:
    """$WORKSHOP_PROFILE when set, else ibex."""
    return os.environ.get(DEFAULT_PROFILE_VARIABLE, "ibex")


def load_profile(name_or_path: str | Path | None = None) -> Profile:
    """A profile by name (a file in slurm/profiles/) or by path to a YAML file."""
    if isinstance(name_or_path, Profile):
        return name_or_path
    chosen = str(name_or_path or default_profile_name())
    path = Path(chosen)
    if not (chosen.endswith((".yml", ".yaml")) or path.is_file()):
        path = PROFILES_DIR / f"{chosen}.yml"
    if not path.is_file():
        raise ProfileError(f"unknown profile {chosen!r}: no file {path}. Known profiles: "
                           f"{', '.join(available_profiles())}; or pass the path of a YAML file")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ProfileError(f"profile {path} is not valid YAML: {error}") from error
    if not isinstance(data, dict):
        raise ProfileError(f"profile {path} must be a mapping of keys, not {type(data).__name__}")
    return profile_from_dict(data, source=path)


def profile_from_dict(data: dict, source: Path | None = None) -> Profile:
    """Build a Profile, rejecting unknown keys with the list of known ones."""
    where = str(source or "profile")
    top_level = {item.name for item in fields(Profile)} - {"source"}
    _reject_unknown(data, top_level, where)
    for required in ("name", "scheduler", "python", "training"):
        if required not in data:
            raise ProfileError(f"{where}: the key {required!r} is missing (see slurm/profiles/ibex.yml)")
    values = dict(data)
    for key, section_type in _SECTIONS.items():
        raw = values.get(key)
        if raw is None:
            values[key] = None if key == "nccl_tests" else section_type()
            continue
        if not isinstance(raw, dict):
            raise ProfileError(f"{where}: {key} must be a mapping, not {raw!r}")
        _reject_unknown(raw, {item.name for item in fields(section_type)}, f"{where}: {key}")
        values[key] = section_type(**{name: _freeze(value) for name, value in raw.items()})
    scheduler = values["scheduler"]
    limits = {int(chapter): str(limit) for chapter, limit in (scheduler.time_limits or {}).items()}
    values["scheduler"] = Scheduler(**{**scheduler.__dict__, "time_limits": limits})
    values.setdefault("description", "")
    return Profile(source=source, **values)


def _freeze(value):
    # Lists become tuples so that profiles stay hashable values like experiments.
    if isinstance(value, list):
        return tuple(value)
    return value


def _reject_unknown(data: dict, known: set[str], where: str) -> None:
    unknown = sorted(set(data) - known)
    if unknown:
        raise ProfileError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; "
                           f"known keys: {', '.join(sorted(known))}")
