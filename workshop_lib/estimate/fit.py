"""Predict, then run: does an experiment fit the profile's GPUs, and which layout would?

The NeMo experiments (chapters 1-2) are estimated as Megatron lays them out with the recipe NeMo
resolved (micro-batch 1, sequence length 2048, bf16 mixed precision, distributed optimizer for full
fine-tunes); where a profile runs the PyTorch stand-ins instead, as the stand-in runs them (LoRA over
DDP with the whole 16-bit base on every GPU; tensor parallel with fp32 weights and no optimizer sharding).
The estimate leaves out the CUDA context, NCCL/cuBLAS workspaces and allocator fragmentation, so a run
fits when the prediction stays under the GPU's memory less ``MARGIN``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from workshop_lib.core.reference import MissingResolvedRecipes, load_resolved
from workshop_lib.estimate.memory import GIB, MemoryEstimate, TrainingSetup, estimate_memory
from workshop_lib.estimate.report import setup_from_experiment
from workshop_lib.estimate.shapes import ModelShape, model_shape

MARGIN = 0.10  # share of the GPU kept for what the estimate leaves out
RECIPE_DEFAULTS = {"micro_batch": 1, "seq_length": 2048}  # NeMo's finetune recipes (SquadDataModule)


@dataclass(frozen=True)
class FitVerdict:
    experiment_id: str
    predicted_gib: float
    gpu_memory_gib: float
    usable_gib: float
    description: str  # what was estimated: engine and layout
    suggestion: str | None = None  # a layout that fits, when this one does not

    @property
    def fits(self) -> bool:
        return self.predicted_gib <= self.usable_gib

    def message(self) -> str:
        return (f"{self.experiment_id} needs {self.predicted_gib:.1f} GiB per GPU by the estimate ({self.description}), "
                f"more than the {self.usable_gib:.1f} GiB usable of the profile's {self.gpu_memory_gib:g} GiB GPUs "
                f"({MARGIN:.0%} kept for the CUDA context, communication buffers and fragmentation)")


def _recipe(experiment) -> dict:
    """Micro-batch and sequence length NeMo resolved for the experiment (book/reference/nemo), else the
    recipes' defaults."""
    try:
        record = load_resolved().get(experiment.id)
    except MissingResolvedRecipes:  # nothing resolved yet: the recipes' defaults are what NeMo resolves today
        record = None
    if record and record.get("accepted"):
        return {"micro_batch": record["layout"]["micro_batch"], "seq_length": record["resolved"]["seq_length"]}
    return dict(RECIPE_DEFAULTS)


def nemo_setup(experiment, stand_in: bool = False) -> TrainingSetup:
    """The TrainingSetup of a chapter 1-2 experiment, as NeMo (or the stand-in) runs it."""
    recipe = _recipe(experiment)
    base = setup_from_experiment(experiment, seq_len=recipe["seq_length"])
    lora = experiment.peft == "lora"
    setup = replace(base, batch=recipe["micro_batch"], pipeline_parallel=experiment.pipeline_parallel,
                    lora_modules=None)
    if stand_in:
        if lora:  # DDP replicas with the frozen base in 16-bit on every GPU (no EP in the stand-in)
            return replace(setup, engine="ddp", expert_parallel=1, micro_batches=_micro_batches(setup, experiment))
        return replace(setup, engine="megatron", distributed_optimizer=False,
                       micro_batches=_micro_batches(setup, experiment))
    return replace(setup, engine="megatron", distributed_optimizer=not lora or "mixtral" in experiment.model,
                   micro_batches=_micro_batches(setup, experiment))


def _micro_batches(setup: TrainingSetup, experiment) -> int:
    dp = setup.data_parallel if setup.resolved_engine == "megatron" else setup.gpus
    return max((experiment.global_batch or 8) // (setup.batch * max(dp, 1)), 1)


def experiment_shape(experiment) -> ModelShape:
    """The model's shape as the experiment trains it: fewer layers where it asks for fewer (num_layers)."""
    shape = model_shape(experiment.model)
    layers = getattr(experiment, "num_layers", None)
    if layers is None or layers == shape.num_layers:
        return shape
    return replace(shape, num_layers=layers, name=f"{shape.name} ({layers} of {shape.num_layers} layers)")


def predict(experiment, stand_in: bool = False) -> MemoryEstimate:
    return estimate_memory(experiment_shape(experiment), nemo_setup(experiment, stand_in))


def describe(setup: TrainingSetup) -> str:
    layout = f"TP={setup.tensor_parallel} x PP={setup.pipeline_parallel} x EP={setup.expert_parallel}"
    if setup.sequence_parallel:
        layout += " + SP"
    engine = {"megatron": "Megatron", "ddp": "DDP stand-in"}.get(setup.resolved_engine, setup.resolved_engine)
    kind = f"LoRA r={setup.lora_rank}" if setup.lora_rank else "full fine-tune"
    return (f"{engine}, {kind}, {setup.gpus} GPU{'s' if setup.gpus > 1 else ''}, {layout}, DP={setup.data_parallel}, "
            f"micro-batch {setup.batch} x {setup.seq_len} tokens")


def check_fit(experiment, gpu_memory_gib: float, stand_in: bool = False) -> FitVerdict:
    setup = nemo_setup(experiment, stand_in)
    estimate = estimate_memory(experiment_shape(experiment), setup)
    usable = gpu_memory_gib * (1 - MARGIN)
    verdict = FitVerdict(experiment.id, estimate.total / GIB, gpu_memory_gib, usable, describe(setup))
    if verdict.fits:
        return verdict
    return replace(verdict, suggestion=suggest_layout(experiment, usable, stand_in))


def suggest_layout(experiment, usable_gib: float, stand_in: bool = False, gpus_per_node: int = 8) -> str | None:
    """The layout with the fewest GPUs (then the least model parallelism) whose estimate fits."""
    if stand_in and experiment.peft == "lora":
        return None  # every DDP replica holds the whole model: more GPUs do not help
    moe = "mixtral" in experiment.model
    candidates = []
    for gpus in (1, 2, 4, 8, 16, 32, 64):
        nodes = max(gpus // gpus_per_node, 1)
        for tp, pp, ep in itertools.product((1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8) if moe else (1,)):
            if gpus % (tp * pp * ep) or (moe and experiment.peft == "lora" and (tp > 1 or pp > 1)):
                continue
            if experiment.peft == "lora" and not moe and (tp > 1 or pp > 1):
                continue
            trial = replace(experiment, nodes=nodes, gpus_per_node=gpus // nodes, tensor_parallel=tp,
                            pipeline_parallel=pp, expert_parallel=ep if moe else None,
                            sequence_parallel=moe and tp > 1)
            try:
                predicted = predict(trial, stand_in).total / GIB
            except Exception:  # a layout the model cannot take (heads, layers or experts not divisible)
                continue
            if predicted <= usable_gib:
                candidates.append((gpus, tp * pp, predicted, trial))
        if candidates:
            break
    if not candidates:
        return None
    gpus, _, predicted, trial = min(candidates, key=lambda item: item[:3])
    where = f"{trial.nodes} nodes x {trial.gpus_per_node} GPUs" if trial.nodes > 1 else f"{gpus} GPU{'s' if gpus > 1 else ''}"
    layout = f"TP={trial.tensor_parallel} x PP={trial.pipeline_parallel}"
    if moe:
        layout += f" x EP={trial.expert_parallel}" + (" + SP" if trial.sequence_parallel else "")
    return f"{where}, {layout} ({predicted:.1f} GiB per GPU predicted)"
