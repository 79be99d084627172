"""Site profiles: how a site realises an experiment (modules, images, caches, models, time limits).

A profile is a YAML file in ``slurm/profiles/`` (``ibex.yml``, ``tiny.yml``) or anywhere on disk.
It is checked against a schema when it is loaded (``profile_schema.py``): unknown keys, missing keys,
wrong types and out-of-range values are errors that name the file, the key and what was expected, so a
typo or a hostile value in a copied profile fails loudly instead of reaching a job script.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from workshop_lib.core.errors import WorkshopError
from workshop_lib.core.paths import SLURM_DIR, repository_root
from workshop_lib.experiments import Experiment

# The schema is a leaf below this module (it owns ProfileError; profiles re-exports it for callers).
from workshop_lib.sites.schema import ABSOLUTE_SHELL_PATH, ProfileError, build

PROFILES_DIR = SLURM_DIR / "profiles"  # the profiles shipped with this library
PROFILES_FOLDER = "slurm/profiles"  # where a workshop folder keeps its profiles
DEFAULT_PROFILE_VARIABLE = "WORKSHOP_PROFILE"


@dataclass(frozen=True)
class Scheduler:
    """What goes into the #SBATCH lines besides the experiment's own resources."""

    constraint: str | None = None
    partition: str | None = None
    account: str | None = None
    reservation: str | None = None
    time_limits: dict[int, str] = field(default_factory=dict)
    # GPUs per node of each node shape -> the node feature that names it (Ibex: 4 -> 4gpus, 8 -> 8gpus). A job
    # asks for the smallest shape that holds its GPUs per node, so small jobs leave the large nodes free.
    gpu_node_features: dict[int, str] = field(default_factory=dict)

    def node_feature(self, gpus_per_node: int) -> str | None:
        """The feature of the smallest node shape with at least ``gpus_per_node`` GPUs (None: no shapes, or
        none large enough: the job asks for the GPU type alone and SLURM says if no node fits)."""
        fitting = sorted(gpus for gpus in self.gpu_node_features if gpus >= gpus_per_node)
        return self.gpu_node_features[fitting[0]] if fitting else None

    def constraint_for(self, gpus_per_node: int) -> str | None:
        """The --constraint of a job with this many GPUs per node: the GPU type and the node shape, joined by
        a comma (SLURM's AND, as KAUST's own scripts write `a100,4gpus`)."""
        feature = self.node_feature(gpus_per_node)
        words = [word for word in (self.constraint, feature) if word]
        return ",".join(words) or None


@dataclass(frozen=True)
class NemoSetup:
    """NeMo Factory in a Singularity container (chapters 1-2 on a GPU site)."""

    enabled: bool = False
    modules: tuple[str, ...] = ()  # environment modules loaded before the container starts
    image: str | None = None  # the .sif file (shell path: $USER expands in the job); None: NeMo is on PATH
    # What the job runs for `nemo llm finetune`: NeMo's CLI, or a drop-in that takes the same words
    # (workshop_lib.train.nemo_finetune, on a GPU machine that has NeMo but not the models).
    command: str = "nemo llm finetune"
    image_source: str | None = None  # what `singularity pull` fetches, e.g. docker://nvcr.io/nvidia/nemo:25.07
    binds: tuple[str, ...] = ()
    factories: dict[str, str] = field(default_factory=dict)
    hub_ids: dict[str, str] = field(default_factory=dict)
    hf_token_variable: str = "HF_TOKEN"


@dataclass(frozen=True)
class PythonSetup:
    """The Python environment of Hugging Face / GPT jobs and the tools they call."""

    modules: tuple[str, ...] = ()  # environment modules loaded before the environment is activated
    conda_root: str | None = None  # the Miniforge installation (shell path); None: no conda, inherit PATH
    conda_environment: str | None = None  # the environment the jobs activate
    python: str = "python"
    torchrun: str = "torchrun"
    psrecord: str = "psrecord"
    # srun options that put the environment's creation on a compute node (KAUST: no conda environments
    # are created on login nodes); empty: build it where `workshop setup` runs.
    build_allocation: str | None = None


@dataclass(frozen=True)
class TrainingSetup:
    """How the experiment's model and data are realised here."""

    data: str = "squad"
    models: dict[str, str] = field(default_factory=dict)
    precision: str | None = None
    max_steps: int | None = None
    eval_samples: int | None = None
    # Caps the NeMo stand-ins' tokens per sample (their recipe says 2048 and pads every sample to it), so CPUs
    # train at the length chapters 3-4 already use (512). HF and GPT jobs take theirs from the experiment.
    max_length: int | None = None
    # Set: OMP_NUM_THREADS of every training process (CPU stand-ins share one machine's cores); None: torch's own.
    threads_per_process: int | None = None
    gpt_shape: dict[str, int] = field(default_factory=dict)
    # Build the real architecture from its config with random weights: no hub download needed
    # (throughput and memory are the real model's; the loss means nothing).
    random_init: bool = False


@dataclass(frozen=True)
class BandwidthCheck:
    """The inter-node all-reduce check run before multi-node jobs.

    ``tool: torch`` runs workshop_lib.train.bandwidth with the training's own launcher, NCCL and
    rendezvous; ``tool: nccl-tests`` runs nccl-tests' all_reduce_perf, which needs an MPI build of it
    (one rank per GPU across the nodes) to measure the network at all.
    """

    tool: str = "torch"
    min_bus_bandwidth_gbps: float = 5.0
    size_mb: int = 1024
    iterations: int = 20
    environment: dict[str, str] = field(default_factory=dict)
    nccl_tests_modules: tuple[str, ...] = ()
    nccl_tests_command: str = "all_reduce_perf"
    nccl_tests_arguments: tuple[str, ...] = ("-b", "4G", "-e", "4G", "-f", "2", "-c", "0", "-n", "50", "-w", "20")


@dataclass(frozen=True)
class JupyterSetup:
    """JupyterLab as a batch job (`workshop lab --batch`), the way KAUST documents Jupyter on Ibex: a job
    on a compute node, reached from a laptop through an SSH tunnel via the login node."""

    login_host: str | None = None  # the tunnel's host, e.g. glogin.ibex.kaust.edu.sa; None: this machine
    node_domain: str | None = None  # appended to the node's short name; None: the server listens on 127.0.0.1
    time: str = "04:00:00"
    cpus: int = 4  # the notebooks only render, submit and tabulate: no GPU
    memory: str = "16G"


@dataclass(frozen=True)
class RehearsalSetup:
    """A class rehearsal: jobs train nothing. Each reads the staged folder, sleeps, and writes the files a run
    leaves (metrics, log lines, monitors) with made-up numbers, so a chapter's tables fill while the
    scheduler, the run folders and the notebooks see a class's real traffic (benchmarks/class_rehearsal/)."""

    sleep_s: float = 3.0  # how long each job "trains"
    staged: str | None = None  # the shared read-only folder each job reads (shell path); None: none


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
    # The instructor's staged folder (read-only for participants): environment, image, models, converted
    # checkpoints and data, made once for the class; $WORKSHOP_SHARED_ROOT overrides it (see shared_folder).
    shared_root: str | None = None
    # Jobs run with HF_HUB_OFFLINE=1 / HF_DATASETS_OFFLINE=1: everything was fetched by `workshop setup`.
    offline: bool = False
    has_nvidia_smi: bool = True
    gpu_monitor_interval_s: int = 5
    cpu_monitor_interval_s: int = 5
    rendezvous_host: str | None = None
    bandwidth_check: BandwidthCheck | None = None
    gpu_memory_gib: float | None = None  # memory of one GPU; the fit check refuses what cannot fit (null: no check)
    jupyter: JupyterSetup = field(default_factory=JupyterSetup)
    rehearsal: RehearsalSetup | None = None  # set: jobs only sleep and write a run's files (no training)
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
        if (experiment.packed_sequence or experiment.num_layers is not None) and not self.nemo.enabled:
            return (f"{experiment.id} is a lesson of NeMo itself (packed sequences, reduced depth); profile "
                    f"{self.name!r} runs the PyTorch stand-in, which has neither")
        return None

    def require(self, experiment: Experiment) -> None:
        reason = self.unsupported_reason(experiment)
        if reason:
            raise ProfileError(f"{reason}. Pick another experiment, or a profile with larger limits "
                               "(e.g. --profile ibex)")


def profile_folders() -> list[Path]:
    """Where a profile name is looked up: the workshop folder in use first (a participant's own clone, where a
    copied profile lives), then this library's own folder. With a class's staged environment the library is
    the staged, read-only copy, which never holds a participant's profile."""
    folders = []
    try:
        folders.append(repository_root() / PROFILES_FOLDER)
    except WorkshopError:  # outside any workshop folder: the library's profiles only
        pass
    if not folders or folders[0].resolve() != PROFILES_DIR.resolve():
        folders.append(PROFILES_DIR)
    return folders


def named_profile_file(name: str) -> Path:
    """The file of a profile name: the first of profile_folders() that has it (the last if none has)."""
    candidates = [folder / f"{name}.yml" for folder in profile_folders()]
    return next((path for path in candidates if path.is_file()), candidates[-1])


def available_profiles() -> list[str]:
    return sorted({path.stem for folder in profile_folders() for path in folder.glob("*.yml")})


def default_profile_name() -> str:
    """$WORKSHOP_PROFILE when set, else ibex."""
    return os.environ.get(DEFAULT_PROFILE_VARIABLE, "ibex")


class DuplicateKey(yaml.YAMLError):
    """A key given twice in one block: YAML would keep the last silently."""


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load that refuses a key given twice in one block (a second `training:` block would otherwise
    replace the first without a word), naming the key and both lines."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: SafeLoader's own error says so
                break
            seen[key] = key_node.start_mark.line + 1
            if first is not None:
                raise DuplicateKey(f"key {key!r} is given twice, on line {first} and line "
                                   f"{key_node.start_mark.line + 1}: YAML would keep only the second. Merge the "
                                   "two blocks into one (or delete the one you do not mean)")
        return super().construct_mapping(node, deep=deep)


def load_profile(name_or_path: str | Path | None = None) -> Profile:
    """A profile by name (a file in slurm/profiles/ of your workshop folder, or of the library's) or by path to a
    YAML file."""
    if isinstance(name_or_path, Profile):
        return name_or_path
    chosen = str(name_or_path or default_profile_name())
    path = Path(chosen)
    named = not (chosen.endswith((".yml", ".yaml")) or path.is_file())
    if named:
        path = named_profile_file(chosen)
    if not path.is_file():
        missing = f"{path.name} in {' or '.join(map(str, profile_folders()))}" if named else f"file {path}"
        raise ProfileError(f"unknown profile {chosen!r}: no {missing}. Known profiles: "
                           f"{', '.join(available_profiles())}; or pass the path of a YAML file")
    try:
        data = yaml.load(path.read_text(), Loader=UniqueKeyLoader) or {}
    except DuplicateKey as duplicate:
        raise ProfileError(f"profile {path}: {duplicate}") from None
    except yaml.YAMLError as error:
        raise ProfileError(f"profile {path} is not valid YAML: {error}") from error
    except RecursionError:
        raise ProfileError(f"profile {path} nests its blocks too deeply to be a profile: compare it with "
                           "slurm/profiles/tiny.yml (a profile is a few levels of keys)") from None
    except UnicodeDecodeError:
        raise ProfileError(f"profile {path} is not a text file (a YAML profile is text): give the path of a "
                           f"profile such as slurm/profiles/tiny.yml, or a name: {', '.join(available_profiles())}"
                           ) from None
    except OSError as error:
        raise ProfileError(f"cannot read profile {path} ({error.strerror}): give a readable YAML file") from error
    if not isinstance(data, dict):
        raise ProfileError(f"profile {path} must be a mapping of keys, not {type(data).__name__}")
    return with_shared_folder(profile_from_dict(data, source=path))


def profile_from_dict(data: dict, source: Path | None = None) -> Profile:
    """Build a Profile from parsed YAML, checked against the schema (see profile_schema.py)."""
    return build(Profile, data, str(source or "profile"), source=source)


# ---- the class's staged folder ----------------------------------------------------------------------
SHARED_ROOT_VARIABLE = "WORKSHOP_SHARED_ROOT"
# The staged folder has the layout of one participant's own storage (what `workshop setup` makes under the
# cache root, the Miniforge root and the image folder), so staging is the same setup run once, there.
STAGED_CACHE = "cache"
STAGED_MINIFORGE = "miniforge3"
STAGED_IMAGES = "images"
STAGED_CHECKOUT = "workshop"  # the copy of the workshop the staged environment is installed from
STAGED_BUNDLE = "workshop.bundle"  # its commit as a git bundle: participants clone it, no public URL needed
STAGED_SQUAD = "data/squad"  # SQuAD as JSON lines: read in place, no dataset cache written next to it


def shared_root_of(profile: Profile, environ: dict | None = None) -> tuple[str, str] | None:
    """(folder, where it was set): $WORKSHOP_SHARED_ROOT when set, else the profile's shared_root, else None."""
    environ = os.environ if environ is None else environ
    value = environ.get(SHARED_ROOT_VARIABLE, "").strip().rstrip("/")
    if value:
        origin = f"${SHARED_ROOT_VARIABLE}"
    elif profile.shared_root:
        value, origin = profile.shared_root.rstrip("/"), f"shared_root of profile {profile.name!r}"
    else:
        return None
    # The folder reaches scripts as double-quoted shell text: only $NAME / ${NAME} may expand in it.
    if not re.fullmatch(ABSOLUTE_SHELL_PATH.pattern, value):
        raise ProfileError(f"{origin} is {value!r}: it must be {ABSOLUTE_SHELL_PATH.expected}. Use the folder "
                           f"the instructor announced, e.g. export {SHARED_ROOT_VARIABLE}=/ibex/project/c1234/dist-ft-workshop")
    return value, origin


def with_shared_folder(profile: Profile, environ: dict | None = None) -> Profile:
    """The profile a participant uses when the class has a staged folder: what the instructor made is read
    from there (environment, image, models, checkpoints, SQuAD); caches, runs and logs stay their own."""
    found = shared_root_of(profile, environ)
    if found is None:
        return profile
    root = found[0]
    python, nemo = _site_under(profile, root, binds_first=False)
    training = profile.training
    if training.data == "squad" and profile.offline:
        training = replace(training, data=f"{root}/{STAGED_SQUAD}")
    return replace(profile, python=python, nemo=nemo, training=training, shared_root=root)


def staged_profile(profile: Profile, folder: str) -> Profile:
    """The profile the instructor stages with: everything `workshop setup` makes goes under `folder`."""
    folder = folder.rstrip("/")
    python, nemo = _site_under(profile, folder, binds_first=True)
    return replace(profile, cache_root=f"{folder}/{STAGED_CACHE}", python=python, nemo=nemo, shared_root=None)


def _site_under(profile: Profile, folder: str, binds_first: bool) -> tuple[PythonSetup, NemoSetup]:
    """The profile's Miniforge and NeMo image moved under a staged folder's layout, the folder bound into the
    container (first for the instructor's staging, after the profile's own binds for a participant)."""
    python, nemo = profile.python, profile.nemo
    if python.conda_root:
        python = replace(python, conda_root=f"{folder}/{STAGED_MINIFORGE}")
    if nemo.enabled and nemo.image:
        binds = (folder, *nemo.binds) if binds_first else (*nemo.binds, folder)
        nemo = replace(nemo, image=f"{folder}/{STAGED_IMAGES}/{nemo.image.rsplit('/', 1)[-1]}",
                       binds=tuple(dict.fromkeys(binds)))
    return python, nemo
