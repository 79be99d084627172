"""Predicted beside measured memory per GPU: `workshop_lib.estimate` against what the runs recorded.

What is compared, and why:

* **GPU runs** (``peak_memory_kind == "cuda_max_allocated"``): the engine's per-rank
  ``torch.cuda.max_memory_allocated()`` is what ``MemoryEstimate.total`` predicts (model states +
  activations + logits + temporaries), so the two are compared directly: error = (predicted − measured)
  / measured. Goal: within 25 %. The runs do not record the model states on their own (an allocation
  reading between steps), so the model-state part is checked through *differences between
  configurations* of the same model and batch (``Δ vs reference``): DDP − plain is the gradient buckets,
  FSDP − DDP is mostly the sharded states. Goal: within 15 %.
* **CPU runs of the tiny profile** (``cpu_max_rss``): the peak resident set size of a whole process —
  Python, torch, transformers/DeepSpeed code and allocator caches (600–800 MiB) — around a model whose
  states are ~2 MiB. No error is computed ("n/a"): the prediction (tensor bytes) and the measurement
  (process RSS) are different quantities, and the differences between configurations (a few MiB
  predicted) are below the run-to-run noise of RSS (tens of MiB). The table still shows both, so a
  reader sees the scale; a meaningful comparison needs the engines to record model-state bytes
  directly (see the note).

Where the estimate misses on a GPU it leaves out: the CUDA context, cuBLAS/NCCL workspaces and allocator
fragmentation (not in max_allocated at all, but in nvidia-smi), DeepSpeed's transient fp32 gradient
partition, and for FSDP through the HF Trainer, the root unit's parameters that stay gathered after the
forward pass (why ``local_params_per_rank`` reads 408 M of 559 M on 2 GPUs).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Iterable

import pandas as pd

from .errors import WorkshopError
from .estimate import KNOWN_CONFIGS, MemoryEstimate, TrainingSetup, estimate_memory, setup_from_experiment

MIB = 2**20
GOAL_MODEL_STATES = 0.15
GOAL_PEAK = 0.25

PREDICTION_NOTE = (
    "Predicted: workshop_lib.estimate for the model, precision, batch and sequence length that actually ran "
    "(metrics.jsonl). Measured: the engine's peak of rank 0. On a GPU that is torch.cuda.max_memory_allocated, "
    "the same quantity as the predicted peak, so the error is (predicted - measured) / measured (goal 25 %). "
    "On the tiny profile it is the peak RSS of the whole CPU process (Python and torch included), so no error "
    "is given: compare the differences against the reference run instead, and expect them to drown in "
    "RSS noise for models of a few MiB.")


@dataclass(frozen=True)
class MemoryComparison:
    """One run: the estimate beside the measured peak (MiB per GPU / per rank)."""

    label: str
    gpus: int
    model: str
    predicted_model_states_mib: float
    predicted_peak_mib: float
    measured_peak_mib: float
    measured_kind: str  # cuda_max_allocated | cpu_max_rss

    @property
    def comparable(self) -> bool:
        return self.measured_kind == "cuda_max_allocated"

    @property
    def peak_error(self) -> float | None:
        """(predicted − measured) / measured, only where both mean the same thing (GPU allocations)."""
        if not self.comparable or not self.measured_peak_mib:
            return None
        return (self.predicted_peak_mib - self.measured_peak_mib) / self.measured_peak_mib


# ---- what ran → an estimate ------------------------------------------------------------------------


def _model_for(record: dict):
    """The model that ran: the custom GPT's shape from its settings, else the summary's model name."""
    settings = record.get("run_settings") or {}
    if record.get("engine") == "gpt" or record.get("model") == "gpt":
        keys = ("layers", "hidden", "heads", "ffn", "vocab", "seq_len")
        if all(key in settings for key in keys):
            return {"model_type": "gpt", **{key: settings[key] for key in keys}}
        shape = {key: record.get(f"gpt_{key}") for key in keys}
        return {"model_type": "gpt", **shape} if all(v is not None for v in shape.values()) else None
    name = record.get("run_model") or record.get("model")
    return name if name in KNOWN_CONFIGS else None


def _present(value) -> bool:
    return value is not None and not (isinstance(value, float) and pd.isna(value))


def setup_for_record(record: dict) -> TrainingSetup:
    """The TrainingSetup of a results record (a row of `results.chapter_results`), realised as it ran."""
    fields = {key: (value if _present(value) else None) for key, value in record.items()}
    setup = setup_from_experiment(SimpleNamespace(**fields))
    settings = record.get("run_settings") or {}
    changes = {}
    if _present(record.get("run_precision")):
        changes["precision"] = record["run_precision"]
    if _present(record.get("run_seq_len")):
        changes["seq_len"] = int(record["run_seq_len"])
    if _present(record.get("run_batch")):
        changes["batch"] = int(record["run_batch"])
    if settings.get("offload_applied") is False:  # FSDP offload recorded but not applied (CPU)
        changes["offload"] = "none"
    return replace(setup, **changes)


def predict_record(record: dict) -> MemoryEstimate | None:
    """The estimate for one results record, or None when the model is not one the estimator knows."""
    model = _model_for(record)
    if model is None:
        return None
    try:
        return estimate_memory(model, setup_for_record(record))
    except WorkshopError:  # a setup the estimator refuses (its message is in `workshop estimate`): no prediction
        return None


def prediction_frame(results: pd.DataFrame, reference_id: str) -> pd.DataFrame:
    """Chapter 3/4 companion table: one row per HF/GPT experiment, estimate beside the measured peak.

    The Δ columns are differences against ``reference_id`` (the chapter's one-GPU baseline), predicted
    and measured the same way; they are what a CPU run can be compared on.
    """
    from .tables import _measured  # the tables' rule: a state where a run did not complete, n/a where unrecorded

    records = results.to_dict("records")
    reference = next((r for r in records if r["id"] == reference_id), None)
    reference_estimate = predict_record(reference) if reference else None
    reference_peak = _rank0(reference) if reference and reference.get("state") == "COMPLETED" else None
    rows = []
    for record in records:
        if record.get("engine") not in ("hf", "gpt"):
            continue
        estimate = predict_record(record)
        measured, kind = _rank0(record), record.get("allocated_kind")
        row = {"Run": record["id"], "GPUs": record["gpus"],
               "Model as run": record.get("run_model") if _present(record.get("run_model")) else record["model"]}
        values = {
            "Predicted model states (MiB)": _mib(estimate.model_states) if estimate else None,
            "Predicted peak (MiB)": _mib(estimate.total) if estimate else None,
            "Measured peak (MiB)": round(measured, 1) if measured is not None else None,
            "Measured as": kind if _present(kind) else None,
            "Peak error (%)": None,
            "Predicted Δ vs reference (MiB)": None,
            "Measured Δ vs reference (MiB)": None,
        }
        if estimate and measured and kind == "cuda_max_allocated":
            values["Peak error (%)"] = round(100 * (estimate.total / MIB - measured) / measured, 1)
        if estimate and reference_estimate:
            values["Predicted Δ vs reference (MiB)"] = _mib(estimate.total - reference_estimate.total)
        if measured is not None and reference_peak is not None:
            values["Measured Δ vs reference (MiB)"] = round(measured - reference_peak, 1)
        row.update({name: _measured(record, value) for name, value in values.items()})
        rows.append(row)
    return pd.DataFrame(rows, columns=["Run", "GPUs", "Model as run", "Predicted model states (MiB)",
                                       "Predicted peak (MiB)", "Measured peak (MiB)", "Measured as",
                                       "Peak error (%)", "Predicted Δ vs reference (MiB)",
                                       "Measured Δ vs reference (MiB)"])


def _rank0(record: dict | None) -> float | None:
    value = (record or {}).get("rank0_peak_mib")
    return float(value) if _present(value) else None


def _mib(value: float) -> float:
    return round(value / MIB, 2)


# ---- reference GPU runs (benchmarks/results/cuda_smoke/*.metrics.jsonl) -----------------------------


def setup_from_summary(summary: dict) -> TrainingSetup:
    """A TrainingSetup from a metrics.jsonl summary record (engine, settings, world size, precision)."""
    settings = summary.get("settings") or {}
    engine = summary.get("engine")
    zero = settings.get("zero_stage") if engine == "deepspeed" else None
    if engine == "deepspeed" and zero is None:
        zero = _zero_stage_from_name(settings.get("config"))
    fsdp = settings.get("strategy") if engine == "fsdp" else None
    offload = "none"
    if engine == "deepspeed":
        if settings.get("offload_param", "none") != "none":
            offload = "parameters"
        elif settings.get("offload_optimizer", "none") not in ("none", False, None):
            offload = "optimizer"
    elif engine == "fsdp" and settings.get("offload_applied"):
        offload = "parameters"
    return TrainingSetup(gpus=int(summary["world_size"]), nodes=int(summary.get("nodes") or 1),
                         precision=summary.get("precision") or "fp32", zero_stage=zero, fsdp=fsdp, offload=offload,
                         batch=int(settings.get("per_device_batch") or 1), seq_len=int(settings.get("max_length") or 512))


def _zero_stage_from_name(name) -> int | None:
    digits = [c for c in str(name or "") if c.isdigit()]
    return int(digits[0]) if digits else None


def read_summary(path: str | Path) -> dict:
    """The summary record of a metrics.jsonl file."""
    path = Path(path)
    if not path.is_file():
        raise WorkshopError(f"no metrics file at {path}; pass a run's train/metrics.jsonl or a *.metrics.jsonl "
                            "of benchmarks/results/")
    summaries = [json.loads(line) for line in path.read_text().splitlines() if '"summary"' in line]
    summaries = [record for record in summaries if record.get("kind") == "summary"]
    if not summaries:
        raise WorkshopError(f"{path} has no summary record: the run did not finish; rerun it or pick another file")
    return summaries[-1]


def compare_summary(summary: dict, label: str) -> MemoryComparison:
    """Estimate vs the measured peak (max over ranks) of one finished run's summary."""
    model = summary.get("model")
    if model not in KNOWN_CONFIGS:
        raise WorkshopError(f"{label}: model {model!r} is not known to the estimator; use one of "
                            f"{', '.join(KNOWN_CONFIGS)}")
    estimate = estimate_memory(model, setup_from_summary(summary))
    peaks = summary.get("peak_memory_mib_per_rank") or []
    if not peaks:
        raise WorkshopError(f"{label}: the summary records no peak memory")
    return MemoryComparison(label=label, gpus=int(summary["world_size"]), model=model,
                            predicted_model_states_mib=estimate.model_states / MIB,
                            predicted_peak_mib=estimate.total / MIB, measured_peak_mib=float(max(peaks)),
                            measured_kind=summary.get("peak_memory_kind") or "")


def reference_comparisons(paths: Iterable[str | Path]) -> list[MemoryComparison]:
    """One comparison per metrics file, labelled by the file name without `.metrics.jsonl`."""
    return [compare_summary(read_summary(path), Path(path).name.replace(".metrics.jsonl", "")) for path in paths]


def reference_frame(comparisons: list[MemoryComparison], reference: str = "plain") -> pd.DataFrame:
    """The predicted-vs-measured table of reference runs, with differences against `reference`."""
    by_label = {c.label: c for c in comparisons}
    base = by_label.get(reference)
    rows = []
    for c in comparisons:
        row = {"Run": c.label, "GPUs": c.gpus, "Predicted model states (MiB)": round(c.predicted_model_states_mib),
               "Predicted peak (MiB)": round(c.predicted_peak_mib), "Measured peak (MiB)": round(c.measured_peak_mib),
               "Peak error (%)": None if c.peak_error is None else round(100 * c.peak_error, 1),
               "Predicted Δ vs reference (MiB)": None, "Measured Δ vs reference (MiB)": None, "Δ error (%)": None}
        if base and c is not base:
            predicted = c.predicted_peak_mib - base.predicted_peak_mib
            measured = c.measured_peak_mib - base.measured_peak_mib
            row.update({"Predicted Δ vs reference (MiB)": round(predicted), "Measured Δ vs reference (MiB)": round(measured),
                        "Δ error (%)": round(100 * (predicted - measured) / measured, 1) if measured else None})
        rows.append(row)
    return pd.DataFrame(rows)


__all__ = ["GOAL_MODEL_STATES", "GOAL_PEAK", "PREDICTION_NOTE", "MemoryComparison", "compare_summary",
           "predict_record", "prediction_frame", "read_summary", "reference_comparisons", "reference_frame",
           "setup_for_record", "setup_from_summary"]
