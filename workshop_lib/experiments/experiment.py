"""One experiment: a row of one of the seeds' tables, as a frozen value with its id and content hash.

The content hash names a run's folder contents: a run is reused only when it matches. The hash rule
(`Experiment.content_hash`; tests/test_experiment_hash_rule.py): a field added to Experiment, at its default, does
not change any existing hash, so finished runs stay finished; set to another value, it does.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import MISSING, Field, asdict, dataclass, fields

from workshop_lib.core.errors import WorkshopError
from workshop_lib.core.vocabulary import DEFAULT_RECIPE, HF, NEMO, RECIPES, GptShape


@dataclass(frozen=True)
class Experiment:
    """One run of one chapter: a row of one of the seeds' tables."""

    id: str
    chapter: int
    group: str  # the table the row belongs to, e.g. "single-gpu"
    title: str
    engine: str
    model: str  # a name of the training registry: llama-3.1-8b, mixtral-8x7b, bloom-560m, gpt
    nodes: int = 1
    gpus_per_node: int = 1
    cpus_per_task: int = 4
    memory: str = "64G"  # --mem, per node

    # NeMo Factory overrides (chapters 1-2)
    peft: str = "none"  # "lora" or "none"
    tensor_parallel: int = 1
    expert_parallel: int | None = None
    pipeline_parallel: int = 1
    sequence_parallel: bool = False
    max_steps: int | None = None
    global_batch: int | None = None
    warmup_steps: int | None = None
    limit_val_batches: int | None = None
    lora_rank: int | None = None
    # NeMo's packed sequences: SQuAD records packed into sequences of the recipe's length (the recipe's
    # `packed_sequence=True`), instead of one record per micro-batch.
    packed_sequence: bool = False
    # Fewer transformer layers than the model has, at its full width: a layout measured where the whole
    # model does not fit (the lent GPUs); never shown as the full model's layout.
    num_layers: int | None = None

    # Hugging Face Trainer (chapters 3-4)
    zero_stage: int | None = None  # None: no DeepSpeed at all
    fsdp: str | None = None  # one of FSDP_STRATEGIES, or None
    offload: bool = False  # DeepSpeed: optimizer (+ parameters at stage 3) to CPU; FSDP: CPU offload
    pin_memory: bool = False
    per_device_batch: int | None = None
    grad_accum: int | None = None
    epochs: int | None = None
    samples: int | None = None  # a fixed training set, whatever the GPU count (strong scaling)
    samples_per_gpu: int | None = None  # grows with the GPU count (weak scaling)
    eval_samples: int | None = None
    precision: str = "auto"
    gpt: GptShape | None = None
    recipe: str = DEFAULT_RECIPE  # one of RECIPES; only the Hugging Face Trainer engine reads it

    # What the job measures besides training
    monitor_cpu_memory: bool = False  # psrecord on the training processes
    nccl_check: bool = False  # nccl-tests all_reduce_perf before training, abort when slow

    def __post_init__(self):
        if (self.packed_sequence or self.num_layers is not None) and self.engine != NEMO:
            raise WorkshopError(f"{self.id}: packed_sequence and num_layers are NeMo settings (engine is "
                                f"{self.engine!r}); leave them at their defaults")
        if self.num_layers is not None and self.num_layers < 1:
            raise WorkshopError(f"{self.id}: num_layers={self.num_layers} must be a positive number of layers")
        if self.recipe not in RECIPES:
            raise WorkshopError(f"{self.id}: recipe={self.recipe!r} is not one of {', '.join(RECIPES)}; "
                                "use 'seed' (the seeds' recipe) or 'tuned'")
        if self.recipe != DEFAULT_RECIPE and self.engine != HF:
            raise WorkshopError(f"{self.id}: recipe={self.recipe!r} applies to the Hugging Face Trainer "
                                f"engine only (engine is {self.engine!r}); leave recipe='seed'")

    @property
    def gpus(self) -> int:
        """GPUs of the whole job."""
        return self.nodes * self.gpus_per_node

    @property
    def multi_node(self) -> bool:
        return self.nodes > 1

    @property
    def deepspeed_config(self) -> str | None:
        """File name in slurm/ds_configs/ for this run, or None without DeepSpeed."""
        if self.zero_stage is None:
            return None
        name = f"zero{self.zero_stage}"
        if self.offload:
            name += "_offload"
        if self.pin_memory:
            name += "_pinned"
        return name + ".json"

    @property
    def job_name(self) -> str:
        """Short SLURM job name (squeue shows 8 characters by default)."""
        return self.id.replace("/", "-")

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def content_hash(self) -> str:
        """Stable across processes and machines: sha256 of the canonical JSON of the hashed fields.

        The hash rule: the fields of the first recorded runs (`FIELDS_OF_FIRST_RUNS`) are always hashed, by name
        and value (names sorted, so field order does not matter). Every other field, one added since, is hashed
        only when its value differs from its default, so adding a field with a default changes no existing hash
        and no finished run is taken for a new experiment. Renaming or removing a field of the first runs, or
        changing one's default, changes hashes: don't. GptShape's fields are hashed inside ``gpt`` as they are."""
        hashed = self.to_dict()
        for field_ in fields(self):
            if field_.name not in FIELDS_OF_FIRST_RUNS and getattr(self, field_.name) == _default(field_):
                del hashed[field_.name]
        canonical = json.dumps(hashed, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


# The fields the first recorded runs were hashed with. Never add to this list: a field added to Experiment
# stays out of it, and so out of the hash while it holds its default (`Experiment.content_hash`).
FIELDS_OF_FIRST_RUNS = frozenset((
    "id", "chapter", "group", "title", "engine", "model", "nodes", "gpus_per_node", "cpus_per_task", "memory",
    "peft", "tensor_parallel", "expert_parallel", "pipeline_parallel", "sequence_parallel", "max_steps",
    "global_batch", "warmup_steps", "limit_val_batches", "lora_rank", "zero_stage", "fsdp", "offload", "pin_memory",
    "per_device_batch", "grad_accum", "epochs", "samples", "samples_per_gpu", "eval_samples", "precision", "gpt",
    "monitor_cpu_memory", "nccl_check",
))
# Fields added since the first runs: at their default they are not part of the content hash.
HASH_OMITS_AT_DEFAULT = tuple(field_.name for field_ in fields(Experiment) if field_.name not in FIELDS_OF_FIRST_RUNS)


def _default(field_: Field):
    """A field's default value; a marker equal to nothing for a field without one (always hashed)."""
    if field_.default is not MISSING:
        return field_.default
    if field_.default_factory is not MISSING:
        return field_.default_factory()
    return _NO_DEFAULT


_NO_DEFAULT = object()

# The recipes' LoRA rank (`llama31_8b`: LoRA(dim=8, alpha=16) on q/k/v, output, both MLP matrices;
# `mixtral_8x7b`: dim=32 on linear_qkv and linear_proj). Not rendered: the recipe's default is used.
RECIPE_LORA_RANK = {"llama-3.1-8b": 8, "mixtral-8x7b": 32}


def with_recipe(experiment: Experiment, recipe: str) -> Experiment:
    """The same run with another training recipe. A tuned run gets its own id (``…-tuned``), so its
    run directory sits next to the seed's and neither result replaces the other."""
    import dataclasses

    if recipe == experiment.recipe:
        return experiment
    base_id = experiment.id.removesuffix(f"-{experiment.recipe}")
    new_id = base_id if recipe == DEFAULT_RECIPE else f"{base_id}-{recipe}"
    base_title = experiment.title.removesuffix(f" ({experiment.recipe} recipe)")
    new_title = base_title if recipe == DEFAULT_RECIPE else f"{base_title} ({recipe} recipe)"
    return dataclasses.replace(experiment, id=new_id, title=new_title, recipe=recipe)


def summary_row(experiment: Experiment) -> dict:
    """The columns `workshop experiments` shows: what differs between rows, nothing else."""
    knobs = []
    if experiment.engine == NEMO:
        knobs.append(f"peft={experiment.peft}")
        if experiment.tensor_parallel > 1:
            knobs.append(f"tp={experiment.tensor_parallel}")
        if experiment.pipeline_parallel > 1:
            knobs.append(f"pp={experiment.pipeline_parallel}")
        if experiment.expert_parallel:
            knobs.append(f"ep={experiment.expert_parallel}")
        if experiment.sequence_parallel:
            knobs.append("sp")
    if experiment.zero_stage is not None:
        knobs.append(f"zero={experiment.zero_stage}")
    if experiment.fsdp:
        knobs.append(f"fsdp={experiment.fsdp}")
    if experiment.offload:
        knobs.append("offload")
    if experiment.pin_memory:
        knobs.append("pinned")
    if experiment.gpt:
        knobs.append(f"layers={experiment.gpt.layers}")
    if experiment.samples_per_gpu:
        knobs.append(f"{experiment.samples_per_gpu}/gpu")
    if experiment.engine != NEMO and experiment.per_device_batch:
        knobs.append(f"batch={experiment.per_device_batch}")
    if experiment.recipe != DEFAULT_RECIPE:
        knobs.append(f"recipe={experiment.recipe}")
    return {"id": experiment.id, "chapter": experiment.chapter, "nodes": experiment.nodes,
            "gpus": experiment.gpus, "engine": experiment.engine, "model": experiment.model,
            "knobs": " ".join(knobs), "hash": experiment.content_hash}


def field_names() -> list[str]:
    """Names of the Experiment fields (for documentation and the notebooks' parameter cells)."""
    return [item.name for item in fields(Experiment)]
