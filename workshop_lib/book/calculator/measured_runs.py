"""The calculator's data, written when the book is built: the runs measured on real GPUs and each chapter's presets.

Each measured row of book/reference/*.json becomes the form's values for what ran (so the page can name its
closest run and load it), the TrainingSetup as it ran (the page estimates it beside the measurement), and
what was measured, with the GPU and the engine that ran it. The chapters' presets are their experiments as
the form's values: NeMo layouts as `workshop validate`'s fit rule estimates them, the Hugging Face Trainer
and custom GPT runs as their recipes declare them.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

from workshop_lib.book.calculator.page import MODELS, inputs_from_setup
from workshop_lib.book.measurements.reference_files import REFERENCE_NAMES, read_reference
from workshop_lib.book.reference.nemo_views import NEMO_RECORD_TOKENS, packs_sequences
from workshop_lib.core.paths import REFERENCE_DIR
from workshop_lib.core.vocabulary import NEMO
from workshop_lib.estimate import KNOWN_CONFIGS, setup_from_experiment
from workshop_lib.estimate.fit import nemo_setup
from workshop_lib.experiments import CHAPTERS, chapter_experiments, get_experiment, large_gpu_experiments
from workshop_lib.jobs.states import COMPLETED

# Every chapter of the registry opens the calculator on its experiments (1-2: layouts; 3: ZeRO; 4: FSDP).
PRESET_CHAPTERS = tuple(CHAPTERS)


def _known_model(model) -> str | None:
    """The calculator's name for a run's model: a known name, or `gpt` when the custom GPT has its default shape."""
    if isinstance(model, str):
        return model if model in MODELS else None
    default = {key: value for key, value in KNOWN_CONFIGS["gpt"].items() if key != "model_type"}
    shape = {key: value for key, value in model.items() if key != "model_type"}
    return "gpt" if shape == default else None


def _setup_of_row(row: dict):
    """(model, TrainingSetup) of a measured row as it ran; NeMo layouts as the fit rule sees them."""
    from workshop_lib.book.measurements.memory_predictions import _model_for, setup_for_record

    if row.get("engine") == NEMO:
        experiment = get_experiment(row["id"])
        setup = nemo_setup(experiment, stand_in=row.get("run_engine") != NEMO)
        if row.get("run_seq_len"):
            setup = replace(setup, seq_len=int(row["run_seq_len"]))
        elif row.get("run_engine") == NEMO and not packs_sequences(experiment):
            # NeMo's micro-batch is one SQuAD record, padded only to its own length, not the recipe's 2,048:
            # the run as it ran, so the calculator never calls a 2,048-token layout "this configuration".
            # (A packed run fills the recipe's length: it keeps it.)
            setup = replace(setup, seq_len=NEMO_RECORD_TOKENS)
        return experiment.model, setup
    setup = setup_for_record(row)
    # A results table stores whole numbers as floats where a column has gaps (4.0): the setup holds integers.
    whole = {name: int(getattr(setup, name)) for name in _INTEGER_FIELDS
             if isinstance(getattr(setup, name), float) and getattr(setup, name).is_integer()}
    return _model_for(row), replace(setup, **whole)


_INTEGER_FIELDS = ("gpus", "nodes", "zero_stage", "batch", "seq_len", "lora_rank", "tensor_parallel",
                   "expert_parallel", "pipeline_parallel", "micro_batches", "reduce_bucket", "persistence_threshold")


def _ran_with(row: dict, provenance: list[dict]) -> str:
    if row.get("engine") == NEMO:
        if row.get("run_engine") == NEMO:
            return f"NeMo {row.get('nemo_version') or ''}".strip()
        return "the PyTorch stand-in for NeMo (Megatron's layout, not NeMo itself)"
    versions = provenance[-1] if provenance else {}
    if row.get("zero_stage") is not None:
        return f"HF Trainer + DeepSpeed {versions.get('deepspeed', '')}".strip()
    if row.get("engine") == "gpt":
        return f"the custom GPT, torch {versions.get('torch', '')}".strip()
    return f"HF Trainer, torch {versions.get('torch', '')}".strip()


def _engine_family(row: dict, setup) -> str:
    """What the estimator's error is grouped by: the engine that ran, and for the Trainer its method."""
    engine = row.get("run_engine") or row.get("engine") or ""
    if engine == "hf" and setup.fsdp:
        return "hf-fsdp"
    if engine == "hf" and setup.zero_stage is not None:
        return "hf-deepspeed"
    return engine


def _number(row: dict, key: str) -> float | None:
    value = row.get(key)
    return float(value) if isinstance(value, (int, float)) and value == value else None


def reference_runs(folder: Path = REFERENCE_DIR) -> list[dict]:
    """Every completed row of the reference files whose model the calculator offers."""
    runs = []
    for name in REFERENCE_NAMES:
        stored = read_reference(name, folder)
        if stored is None:
            continue
        for row in stored.results:
            if row.get("state") != COMPLETED:
                continue
            model, setup = _setup_of_row(row)
            calculator_model = _known_model(model) if model is not None else None
            if calculator_model is None:
                continue  # a custom GPT of another depth: the calculator offers the default shape only
            allocated = _number(row, "rank0_peak_mib") if row.get("allocated_kind") == "cuda_max_allocated" else None
            ran_with = _ran_with(row, stored.provenance)
            runs.append({
                "engine": _engine_family(row, setup),
                "id": row["id"], "label": f"{row['id']} ({ran_with}, {row.get('run_gpu') or 'GPU not recorded'})",
                "title": row.get("title", ""), "ran_with": ran_with, "gpu": row.get("run_gpu") or "",
                "source": f"book/reference/{stored.path.name}", "model": model, "setup": asdict(setup),
                "inputs": inputs_from_setup(calculator_model, setup),
                "measured": {"allocated_peak_mib": allocated, "nvidia_smi_peak_mib": _number(row, "gpu0_peak_mib"),
                             "model_states_mib": _number(row, "rank0_model_state_mib"),
                             "host_peak_mib": _number(row, "cpu_peak_mib")}})
    return runs


def experiment_inputs(experiment) -> dict | None:
    """The form's values for a chapter's experiment, or None when the calculator cannot show it."""
    if experiment.engine == NEMO:
        return inputs_from_setup(experiment.model, nemo_setup(experiment))
    model = "gpt" if experiment.gpt is not None else experiment.model
    if experiment.gpt is not None and _known_model({"model_type": "gpt", **asdict(experiment.gpt)}) is None:
        return None
    return inputs_from_setup(model, setup_from_experiment(experiment))


def chapter_presets() -> dict:
    """{chapter: {title, experiments: [{id, title, inputs}]}} for the chapters that open the calculator."""
    presets = {}
    for chapter in PRESET_CHAPTERS:
        experiments = chapter_experiments(chapter) + [e for e in large_gpu_experiments() if e.chapter == chapter]
        rows = [{"id": e.id, "title": e.title, "inputs": inputs}
                for e in experiments if (inputs := experiment_inputs(e)) is not None]
        presets[str(chapter)] = {"title": f"Chapter {chapter}: {CHAPTERS[chapter]}", "experiments": rows}
    return presets


def page_data(folder: Path = REFERENCE_DIR) -> dict:
    """Everything the page reads besides the Python modules: measured runs and chapter presets."""
    return {"references": reference_runs(folder), "chapters": chapter_presets()}
