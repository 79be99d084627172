"""The experiment builder's form, as data: the controls (an Experiment field, or chapter/start/profile, with
label, help and the chapters that show it), where each chapter's form starts and which models and sizes it offers,
and how a form names its experiment (custom_id, custom_title) and encodes None ("off"). No widgets here:
builder.py makes the form live and checks it as it is typed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from workshop_lib.core.errors import WorkshopError
from workshop_lib.core.vocabulary import NEMO
from workshop_lib.experiments import CHAPTER_SPECS, CHAPTERS, Experiment

OFF = "off"  # what a dropdown shows for None ("no DeepSpeed", "no FSDP", "no EP size")
# The form follows the chapter registry (experiments.CHAPTER_SPECS): its chapters, where each starts (a row of its
# matrix; every field no control sets comes from it), the models its matrix trains and the knobs of its track.
NEMO_CHAPTERS = tuple(spec.number for spec in CHAPTER_SPECS if all(row.engine == NEMO for row in spec.experiments()))
START_ROWS = {spec.number: spec.start for spec in CHAPTER_SPECS}
MODELS = {spec.number: tuple(dict.fromkeys(row.model for row in spec.experiments())) for spec in CHAPTER_SPECS}
SIZES = (1, 2, 4, 8)


def _chapters_with(knob: str) -> tuple[int, ...]:
    """The chapters whose track offers ``knob`` (an Experiment field)."""
    return tuple(spec.number for spec in CHAPTER_SPECS if knob in spec.knobs)


@dataclass(frozen=True)
class Control:
    """One knob: its name (an Experiment field, or chapter/start/profile), label, help and chapters."""

    name: str
    label: str
    help: str
    chapters: tuple[int, ...] = tuple(CHAPTERS)


CONTROLS = (
    Control("chapter", "Chapter", "the chapter whose track the experiment follows"),
    Control("start", "Start from", "a row of the chapter's matrix; fields without a control come from it"),
    Control("model", "Model", "the model (the tiny profile trains a small stand-in of the same family)"),
    Control("nodes", "Nodes", "nodes of the job (--nodes)"),
    Control("gpus_per_node", "GPUs per node", "GPUs (and tasks) per node; GPUs = nodes x GPUs per node"),
    Control("peft", "PEFT", "LoRA adapters, or a full fine-tune (none)", _chapters_with("peft")),
    Control("tensor_parallel", "TP", "tensor-parallel size", _chapters_with("tensor_parallel")),
    Control("expert_parallel", "EP", "expert-parallel size (Mixtral needs one)", _chapters_with("expert_parallel")),
    Control("sequence_parallel", "SP", "sequence parallelism (needs TP >= 2)", _chapters_with("sequence_parallel")),
    Control("zero_stage", "ZeRO stage", "DeepSpeed ZeRO stage; off: the plain HF Trainer",
            _chapters_with("zero_stage")),
    Control("fsdp", "FSDP", "FSDP sharding strategy; off: the plain HF Trainer", _chapters_with("fsdp")),
    Control("offload", "CPU offload", "optimizer (ZeRO 1-2) or parameters (ZeRO 3, FSDP) to CPU",
            _chapters_with("offload")),
    Control("pin_memory", "Pinned memory", "page-locked CPU buffers for the offloaded states",
            _chapters_with("pin_memory")),
    Control("per_device_batch", "Batch per GPU", "micro batch per GPU (--per-device-batch)",
            _chapters_with("per_device_batch")),
    Control("profile", "Profile", "where it runs: ibex (A100s) or tiny (CPU stand-in); never what runs"),
)
CONTROL_NAMES = tuple(control.name for control in CONTROLS)
_BY_NAME = {control.name: control for control in CONTROLS}
_CHECKBOXES = ("sequence_parallel", "offload", "pin_memory")


# ---- ids, titles and value encoding -------------------------------------------------------------------
def custom_id(experiment: Experiment) -> str:
    """A readable id naming every knob the builder sets, e.g. custom/ch3/bloom-560m-1x2gpu-zero3-offload-b4."""
    parts = [experiment.model, f"{experiment.nodes}x{experiment.gpus_per_node}gpu"]
    if experiment.chapter in NEMO_CHAPTERS:
        parts.append("lora" if experiment.peft == "lora" else "full")
        if experiment.tensor_parallel > 1:
            parts.append(f"tp{experiment.tensor_parallel}")
        if experiment.expert_parallel:
            parts.append(f"ep{experiment.expert_parallel}")
        if experiment.sequence_parallel:
            parts.append("sp")
    if experiment.zero_stage is not None:
        parts.append(f"zero{experiment.zero_stage}")
    if experiment.fsdp:
        parts.append(experiment.fsdp.lower().replace("_", "-"))
    if experiment.offload:
        parts.append("offload")
    if experiment.pin_memory:
        parts.append("pinned")
    if experiment.chapter not in NEMO_CHAPTERS and experiment.per_device_batch:
        parts.append(f"b{experiment.per_device_batch}")
    return f"custom/ch{experiment.chapter}/" + "-".join(parts)


def custom_title(experiment: Experiment) -> str:
    knobs = custom_id(experiment).split("/", 2)[2]
    return f"Custom chapter {experiment.chapter} experiment: {knobs.replace('-', ' ')}"


def _estimate_model(experiment: Experiment):
    """The estimator's model: the registry name, or the custom GPT's own shape."""
    if experiment.gpt is not None:
        return {"model_type": "gpt", **asdict(experiment.gpt)}
    return experiment.model


def _chapter(value) -> int:
    chapter = int(value)
    if chapter not in CHAPTERS:
        raise WorkshopError(f"there is no chapter {value}: choose one of {sorted(CHAPTERS)}")
    return chapter


def _encode(value):
    return OFF if value is None else value


def _decode(value):
    return None if value == OFF else value


def _show(value) -> str:
    return OFF if value is None else str(value)
