"""Each chapter's experiments as data (the seeds' tables), the chapter registry (`CHAPTER_SPECS`: the one list
of chapters), the large-GPU and engine-scaling extras, and lookups by chapter and id.

Adding a chapter is one builder function and one `ChapterSpec` line here; the CLI's --chapter choices, the
calculator's presets, the experiment builder's form, the profile schema's time-limit keys and the book's parts
derive from `CHAPTER_SPECS` (tests/test_chapter_registry.py checks that each of them follows it).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Callable, Iterable

from workshop_lib.core.errors import WorkshopError
from workshop_lib.core.vocabulary import FSDP_STRATEGIES, GPT, HF, NEMO, GptShape
from workshop_lib.experiments.experiment import RECIPE_LORA_RANK, Experiment

# ---------------------------------------------------------------------------------------------
# Chapter 1: data parallel + LoRA (seed 000). Same NeMo overrides everywhere; only the devices change.
# Micro-batch (1), sequence length (2048), learning rate and LoRA targets are the NeMo recipe's own;
# `workshop_lib.nemo_check` resolves every command with NeMo and the stand-in engines read the result.
# ---------------------------------------------------------------------------------------------
_NEMO_SHORT_RUN = dict(max_steps=250, global_batch=8, warmup_steps=50, limit_val_batches=10)


def _chapter_1() -> list[Experiment]:
    rows = []
    for gpus in (1, 2, 4, 8):
        rows.append(Experiment(
            id=f"lora/llama/{_gpus(gpus)}", chapter=1, group="llama", engine=NEMO, model="llama-3.1-8b",
            title=f"Llama 3.1 8B + LoRA on {_gpus(gpus, ' ')}", gpus_per_node=gpus, memory="256G",
            peft="lora", lora_rank=RECIPE_LORA_RANK["llama-3.1-8b"], **_NEMO_SHORT_RUN))
    for gpus in (2, 4, 8):
        # Mixtral will not start without an expert-parallel size. Seed 000 says "=N" and, in the same
        # breath, "no expert sharding"; its own resolved-arguments example shows devices=2, ep=2, so the
        # experts are spread over every GPU of the run: EP = GPUs.
        rows.append(Experiment(
            id=f"lora/mixtral/{_gpus(gpus)}", chapter=1, group="mixtral", engine=NEMO, model="mixtral-8x7b",
            title=f"Mixtral 8x7B + LoRA on {_gpus(gpus, ' ')} (EP={gpus})", gpus_per_node=gpus,
            memory="256G", peft="lora", lora_rank=RECIPE_LORA_RANK["mixtral-8x7b"], expert_parallel=gpus,
            **_NEMO_SHORT_RUN))
    return rows


# ---------------------------------------------------------------------------------------------
# Chapter 2: model parallel without PEFT (seed 001), the recipes' full fine-tune (peft_scheme='none':
# learning rate 5e-6, distributed optimizer). Every layout fits an 80 GB A100 with a margin by the
# estimator (`workshop validate` refuses those that do not). Seed 001's own layouts did not fit:
# Llama TP=2 on 2 GPUs needs ~78 GiB per GPU, Mixtral TP=2 x EP=2 on 4 GPUs ~209 GiB and TP=4 x EP=2
# on 8 GPUs ~105 GiB (46.7 B parameters x 18 bytes of model states do not fit one 8-GPU node at all).
# ---------------------------------------------------------------------------------------------
def _chapter_2() -> list[Experiment]:
    rows = []
    # Llama: TP=2 needs a second data-parallel rank so that the distributed optimizer halves its states.
    for tp, gpus in ((2, 4), (4, 4), (8, 8)):
        dp = gpus // tp
        rows.append(Experiment(
            id=f"model-parallel/llama/tp{tp}" + (f"-dp{dp}" if dp > 1 else ""), chapter=2, group="llama",
            engine=NEMO, model="llama-3.1-8b",
            title=f"Llama 3.1 8B, full fine-tune, TP={tp}" + (f" x DP={dp}" if dp > 1 else "") + f" on {gpus} GPUs",
            gpus_per_node=gpus, memory="256G", tensor_parallel=tp, **_NEMO_SHORT_RUN))
    # Mixtral: seed 001's TP x EP pairs (2 x 2 and 4 x 2, with sequence parallelism), plus pipeline stages
    # that spread the layers over two 8-GPU nodes, as NeMo's own full fine-tune recipe does (PP=4).
    for tp, pp, ep in ((2, 4, 2), (4, 2, 2)):
        rows.append(Experiment(
            id=f"model-parallel/mixtral/tp{tp}-pp{pp}-ep{ep}-sp", chapter=2, group="mixtral", engine=NEMO,
            model="mixtral-8x7b", title=f"Mixtral 8x7B, full fine-tune, TP={tp} x PP={pp} x EP={ep} + SP, 2 nodes",
            nodes=2, gpus_per_node=8, memory="256G", tensor_parallel=tp, pipeline_parallel=pp,
            expert_parallel=ep, sequence_parallel=True, **_NEMO_SHORT_RUN))
    return rows


def large_gpu_experiments() -> list[Experiment]:
    """Beyond the matrix: a layout that fits a 141 GB H200 but not an 80 GB A100. The reference run on
    two H200s measures what the fit check predicts for the smallest tensor-parallel layout."""
    return [Experiment(
        id="model-parallel/llama/tp2", chapter=2, group="llama-large-gpu", engine=NEMO, model="llama-3.1-8b",
        title="Llama 3.1 8B, full fine-tune, TP=2 on 2 GPUs (needs more than 80 GB per GPU)",
        gpus_per_node=2, memory="256G", tensor_parallel=2, **_NEMO_SHORT_RUN)]


# Mixtral's reduced-depth layouts: the chapter's TP x EP (+SP) and PP x EP factors on 4 GPUs, at Mixtral
# 8x7B's full width with 4 of its 32 layers. All 32 layers need 16 GPUs for a full fine-tune (46.7 B
# parameters x 18 bytes of model states); 4 layers keep every kind of communication (tensor-parallel
# all-reduce, expert all-to-all, pipeline send/receive) at the real tensor sizes, and keep the model states
# of one GPU (~29 GiB by the estimator) inside an 80 GB card with room for the activations.
MIXTRAL_REDUCED_LAYERS = 4


def nemo_lesson_experiments() -> list[Experiment]:
    """Beyond the matrix: NeMo lessons measured on the lent GPUs. The packed-sequence twin of chapter 1's
    1-GPU run, and chapter 2's Mixtral parallel factors at reduced depth (clearly not the 16-GPU layouts)."""
    rows = [Experiment(
        id="lora/llama/1-gpu-packed", chapter=1, group="llama-packing", engine=NEMO, model="llama-3.1-8b",
        title="Llama 3.1 8B + LoRA on 1 GPU, SQuAD packed into 2,048-token sequences", gpus_per_node=1,
        memory="256G", peft="lora", lora_rank=RECIPE_LORA_RANK["llama-3.1-8b"], packed_sequence=True,
        **_NEMO_SHORT_RUN)]
    layers = MIXTRAL_REDUCED_LAYERS
    for tp, pp, ep, sp in ((2, 1, 2, True), (1, 2, 2, False)):
        name = f"tp{tp}-" * (tp > 1) + f"pp{pp}-" * (pp > 1) + f"ep{ep}" + "-sp" * sp
        rows.append(Experiment(
            id=f"model-parallel/mixtral-{layers}-layers/{name}", chapter=2, group="mixtral-reduced", engine=NEMO,
            model="mixtral-8x7b",
            title=(f"Mixtral 8x7B width, {layers} of 32 layers, full fine-tune, TP={tp} x PP={pp} x EP={ep}"
                   + (" + SP" if sp else "") + " on 4 GPUs"),
            gpus_per_node=4, memory="256G", tensor_parallel=tp, pipeline_parallel=pp, expert_parallel=ep,
            sequence_parallel=sp, num_layers=layers, **_NEMO_SHORT_RUN))
    return rows


# ---------------------------------------------------------------------------------------------
# Chapter 3: DeepSpeed ZeRO with the HF Trainer (seed 002): BLOOM-560m on SQuAD, fp16,
# batch 4 x accumulation 4, 3 epochs. CPU memory is recorded everywhere: the seed's tables ask for it.
# ---------------------------------------------------------------------------------------------
_ZERO_RECIPE = dict(engine=HF, model="bloom-560m", per_device_batch=4, grad_accum=4, epochs=3,
                    eval_samples=100, precision="fp16", memory="64G", monitor_cpu_memory=True)


def _zero_name(stage: int, offload: bool, pinned: bool = False) -> str:
    return f"zero{stage}" + ("-offload" if offload else "") + ("-pinned" if pinned else "")


def _chapter_3() -> list[Experiment]:
    rows = [Experiment(id="zero/baseline", chapter=3, group="baseline",
                       title="BLOOM-560m, HF Trainer without DeepSpeed, 1 GPU", samples=500, **_ZERO_RECIPE)]
    single = [(stage, False, False) for stage in (0, 1, 2, 3)]
    single += [(stage, True, False) for stage in (1, 2, 3)] + [(2, True, True)]
    for stage, offload, pinned in single:
        name = _zero_name(stage, offload, pinned)
        rows.append(Experiment(
            id=f"zero/single-gpu/{name}", chapter=3, group="single-gpu",
            title=f"ZeRO stage {stage}{' + CPU offload' if offload else ''}{' (pinned)' if pinned else ''}, 1 GPU",
            zero_stage=stage, offload=offload, pin_memory=pinned, samples=500, **_ZERO_RECIPE))
    # Multi-GPU weak scaling: "DeepSpeed's DataParallel (no ZeRO)", 500 samples per GPU. The seed's text
    # also names 6 GPUs; its table and scripts stop at 2/4/8, which is what we keep.
    for gpus in (2, 4, 8):
        rows.append(Experiment(
            id=f"zero/multi-gpu/{_gpus(gpus)}", chapter=3, group="multi-gpu",
            title=f"ZeRO stage 0 weak scaling, {_gpus(gpus, ' ')}, 500 samples per GPU",
            gpus_per_node=gpus, zero_stage=0, samples_per_gpu=500, **_ZERO_RECIPE))
    for stage in (1, 2, 3):
        for offload in (False, True):
            name = _zero_name(stage, offload)
            rows.append(Experiment(
                id=f"zero/two-gpus/{name}", chapter=3, group="two-gpus",
                title=f"ZeRO stage {stage}{' + CPU offload' if offload else ''}, 2 GPUs",
                gpus_per_node=2, zero_stage=stage, offload=offload, samples_per_gpu=500, **_ZERO_RECIPE))
    # Multi-node weak scaling, 2 GPUs per node. The seed's text says 250 samples per GPU, its code
    # 10 000. We keep 250: at 8 nodes x 2 GPUs, 10 000 per GPU asks for 160 000 examples while SQuAD v1.1
    # has 87 599 training examples, so the largest run could not be weakly scaled at all.
    for nodes in (2, 4, 8):
        rows.append(Experiment(
            id=f"zero/multi-node/{nodes}-nodes", chapter=3, group="multi-node",
            title=f"ZeRO stage 0 weak scaling, {nodes} nodes x 2 GPUs, 250 samples per GPU",
            nodes=nodes, gpus_per_node=2, zero_stage=0, samples_per_gpu=250, **_ZERO_RECIPE))
    return rows


# ---------------------------------------------------------------------------------------------
# Chapter 4: FSDP (seed 003): BLOOM-560m, batch 1 x accumulation 4, 5 epochs, 500 train / 100 eval
# samples, fp16; then the custom GPT.
# ---------------------------------------------------------------------------------------------
_FSDP_RECIPE = dict(engine=HF, model="bloom-560m", per_device_batch=1, grad_accum=4, epochs=5,
                    samples=500, eval_samples=100, precision="fp16", memory="64G")
_GPT_RECIPE = dict(engine=GPT, model="gpt", per_device_batch=1, grad_accum=4, epochs=5, samples=500,
                   eval_samples=100, precision="fp16", memory="64G")


def _chapter_4() -> list[Experiment]:
    rows = [
        Experiment(id="fsdp/baseline", chapter=4, group="baseline",
                   title="BLOOM-560m, HF Trainer without FSDP, 1 GPU", **_FSDP_RECIPE),
        Experiment(id="fsdp/single-gpu/full-shard", chapter=4, group="single-gpu",
                   title="FSDP FULL_SHARD on 1 GPU", fsdp="FULL_SHARD", **_FSDP_RECIPE),
    ]
    # Strategies only differ when there is something to shard across: with one GPU all three are the
    # same, and HYBRID_SHARD (shard inside a node, replicate across nodes) needs two nodes. So the
    # comparison runs on 2 nodes x 2 GPUs.
    for strategy in FSDP_STRATEGIES:
        for offload in (False, True):
            name = strategy.lower().replace("_", "-") + ("-offload" if offload else "")
            rows.append(Experiment(
                id=f"fsdp/strategies/{name}", chapter=4, group="strategies",
                title=f"FSDP {strategy}{' + CPU offload' if offload else ''}, 2 nodes x 2 GPUs",
                nodes=2, gpus_per_node=2, fsdp=strategy, offload=offload, monitor_cpu_memory=offload,
                nccl_check=True, **_FSDP_RECIPE))
    for gpus in (2, 4, 8):
        rows.append(Experiment(
            id=f"fsdp/multi-gpu/{_gpus(gpus)}", chapter=4, group="multi-gpu",
            title=f"FSDP FULL_SHARD on {_gpus(gpus, ' ')}", gpus_per_node=gpus, fsdp="FULL_SHARD",
            **_FSDP_RECIPE))
    # Seed 003's multi-node tables count one GPU per node (2 nodes -> 2 GPUs); its custom-model script
    # asked for 8 GPUs per node and used one. We ask for what we use.
    for nodes in (2, 4, 8):
        rows.append(Experiment(
            id=f"fsdp/multi-node/{nodes}-nodes", chapter=4, group="multi-node",
            title=f"FSDP FULL_SHARD on {nodes} nodes x 1 GPU", nodes=nodes, fsdp="FULL_SHARD",
            nccl_check=True, **_FSDP_RECIPE))
    rows.append(Experiment(id="fsdp/gpt/1-gpu", chapter=4, group="gpt", title="Custom GPT on 1 GPU",
                           gpt=GptShape(), **_GPT_RECIPE))
    for gpus in (2, 4, 8):
        rows.append(Experiment(
            id=f"fsdp/gpt/{_gpus(gpus)}", chapter=4, group="gpt", title=f"Custom GPT, FSDP on {_gpus(gpus, ' ')}",
            gpus_per_node=gpus, fsdp="FULL_SHARD", gpt=GptShape(), **_GPT_RECIPE))
    for nodes in (2, 4, 8):
        rows.append(Experiment(
            id=f"fsdp/gpt/{nodes}-nodes", chapter=4, group="gpt",
            title=f"Custom GPT, FSDP on {nodes} nodes x 1 GPU", nodes=nodes, fsdp="FULL_SHARD",
            gpt=GptShape(), nccl_check=True, **_GPT_RECIPE))
    # Weak scaling by depth: layers grow with the GPUs while the per-GPU batch halves (seed 003's table).
    # The seed's scripts exported BATCH_SIZE but read another variable, so the per-GPU batch stayed at
    # its default in every run; here it is a field and reaches the trainer as --per-device-batch.
    # 16 GPUs do not fit one node: 2 nodes x 8 GPUs.
    for gpus, layers, batch in ((2, 3, 8), (4, 6, 4), (8, 12, 2), (16, 24, 1)):
        nodes = 2 if gpus > 8 else 1
        rows.append(Experiment(
            id=f"fsdp/weak-scaling/{_gpus(gpus)}", chapter=4, group="weak-scaling",
            title=f"Custom GPT weak scaling: {_gpus(gpus, ' ')}, {layers} layers, batch {batch} per GPU",
            nodes=nodes, gpus_per_node=gpus // nodes, fsdp="FULL_SHARD", nccl_check=nodes > 1,
            gpt=GptShape(layers=layers), **{**_GPT_RECIPE, "per_device_batch": batch}))
    return rows


# ---------------------------------------------------------------------------------------------
# Beyond the seeds: the same weak-scaling run (BLOOM-560m, the seed recipe, 500 samples per GPU) under
# the three data-parallel engines of chapters 3-4, to compare their scaling. Not part of a chapter's
# matrix (the tiny workshop stays short); `workshop submit scaling/zero2/4-gpus` runs one.
# ---------------------------------------------------------------------------------------------
SCALING_ENGINES = {"ddp": {}, "zero2": {"zero_stage": 2}, "full-shard": {"fsdp": "FULL_SHARD"}}


def engine_scaling_experiments() -> list[Experiment]:
    names = {"ddp": "DDP (no sharding)", "zero2": "ZeRO stage 2", "full-shard": "FSDP FULL_SHARD"}
    recipe = {**_ZERO_RECIPE, "monitor_cpu_memory": False}
    rows = []
    for engine, knobs in SCALING_ENGINES.items():
        for gpus in (1, 2, 4, 8):
            rows.append(Experiment(
                id=f"scaling/{engine}/{_gpus(gpus)}", chapter=3, group="engine-scaling",
                title=f"{names[engine]} weak scaling, {_gpus(gpus, ' ')}, 500 samples per GPU",
                gpus_per_node=gpus, samples_per_gpu=500, **knobs, **recipe))
    return rows


def _gpus(count: int, separator: str = "-") -> str:
    return f"{count}{separator}gpu" if count == 1 else f"{count}{separator}gpus"


# ---------------------------------------------------------------------------------------------
# The chapter registry: the one declaration of which chapters exist.
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ChapterSpec:
    """One chapter: its number and title, its matrix, and what the experiment builder offers for it."""

    number: int
    title: str
    experiments: Callable[[], list[Experiment]]  # the chapter's matrix, in table order
    start: str  # the experiment builder's starting row (an id of the matrix)
    knobs: tuple[str, ...]  # the Experiment fields the builder lets a reader change on this chapter's track


_NEMO_KNOBS = ("peft", "tensor_parallel", "expert_parallel", "sequence_parallel")
CHAPTER_SPECS: tuple[ChapterSpec, ...] = (
    ChapterSpec(1, "Data parallel + LoRA (NeMo)", _chapter_1, "lora/llama/1-gpu", _NEMO_KNOBS),
    ChapterSpec(2, "Model parallel, no PEFT (NeMo)", _chapter_2, "model-parallel/llama/tp4", _NEMO_KNOBS),
    ChapterSpec(3, "DeepSpeed ZeRO (HF Trainer)", _chapter_3, "zero/two-gpus/zero2",
                ("zero_stage", "offload", "pin_memory", "per_device_batch")),
    ChapterSpec(4, "FSDP (HF Trainer and a custom GPT)", _chapter_4, "fsdp/multi-gpu/2-gpus",
                ("fsdp", "offload", "per_device_batch")),
)
# Chapter number -> title, in chapter order: what most readers of the registry need.
CHAPTERS: dict[int, str] = {spec.number: spec.title for spec in CHAPTER_SPECS}


def chapter_spec(chapter: int) -> ChapterSpec:
    """The registry's entry for ``chapter``; a WorkshopError naming the chapters there are."""
    for spec in CHAPTER_SPECS:
        if spec.number == chapter:
            return spec
    raise WorkshopError(f"there is no chapter {chapter}: choose one of {sorted(CHAPTERS)}")


def all_experiments() -> list[Experiment]:
    """Every experiment of every chapter, in chapter and table order."""
    return [experiment for spec in CHAPTER_SPECS for experiment in spec.experiments()]


def chapter_experiments(chapter: int) -> list[Experiment]:
    """The matrix of one chapter."""
    return chapter_spec(chapter).experiments()


def _every_experiment_by_id() -> dict[str, Experiment]:
    """The chapters' matrices and the extras beyond them, by id."""
    return {experiment.id: experiment
            for experiment in all_experiments() + engine_scaling_experiments() + large_gpu_experiments()
            + nemo_lesson_experiments()}


def known_id(experiment_id: str) -> str:
    """``experiment_id`` itself when an experiment has it; otherwise a WorkshopError naming the closest known ids.

    Code that names experiments by literal id (the book's sentences and figures) looks them up through this, so a
    misspelt id fails loudly instead of matching no run and silently dropping what it would have shown."""
    known = _every_experiment_by_id()
    if experiment_id in known:
        return experiment_id
    closest = difflib.get_close_matches(experiment_id, list(known), n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(map(repr, closest))}?" if closest else "no known id is close to it"
    raise WorkshopError(f"unknown experiment id {experiment_id!r}: {hint} (`workshop experiments` lists them all)")


def get_experiment(experiment_id: str) -> Experiment:
    """The experiment with this id; the error lists close matches."""
    by_id = _every_experiment_by_id()
    if experiment_id in by_id:
        return by_id[experiment_id]
    prefix = experiment_id.split("/")[0]
    near = [known for known in by_id if known.startswith(prefix)] or list(by_id)[:8]
    raise WorkshopError(f"unknown experiment {experiment_id!r}; known ids include: {', '.join(near)} "
                        "(`workshop experiments` lists them all)")


def select_experiments(ids: Iterable[str] = (), chapter: int | None = None) -> list[Experiment]:
    """Experiments by id, or a whole chapter; ids keep their order and duplicates are dropped."""
    chosen = [get_experiment(experiment_id) for experiment_id in ids]
    if chapter is not None:
        chosen += chapter_experiments(chapter)
    unique = list({experiment.id: experiment for experiment in chosen}.values())
    if not unique:
        raise WorkshopError("no experiment selected: give experiment ids or --chapter N")
    return unique
