"""Predicted beside measured memory per GPU: `workshop_lib.estimate` against what the runs recorded.

What is compared, and why:

* **Model states**: every engine counts, on each rank, the bytes of the unique tensor storages held by
  the model, its gradients and the optimizer (DeepSpeed's and FSDP's flat buffers included) when the
  second optimizer step begins (``workshop_lib.train.tensor_census``; ``model_state_bytes_per_rank``).
  That is what ``MemoryEstimate.model_states`` predicts: error = (predicted − measured) / measured, goal
  within 15 %. Runs recorded before the census existed (the GPU references) show n/a.
* **Peak**, on a GPU (``peak_memory_kind == "cuda_max_allocated"``): the engine's per-rank
  ``torch.cuda.max_memory_allocated()`` over the training steps, the quantity ``MemoryEstimate.total`` predicts
  (model states + activations + logits + temporaries). Goal: within 25 %.
* **Peak**, on a CPU (the tiny profile): the most tensor bytes alive at once during the second optimizer
  step (``step_peak_bytes_per_rank``, "Measured as" ``tensor_step_peak``), the CPU analogue of
  ``max_memory_allocated``, compared with the same ``total`` and the same 25 % goal. The process RSS
  (``cpu_max_rss``, 600–800 MiB of Python, torch and allocator caches around ~2 MiB of model states) is
  not compared; older CPU runs that recorded only RSS still show "n/a".

The setup given to the estimator is what ran: the model the profile substituted (the tiny model, or the
custom GPT's shape from the run's settings), the precision, micro batch and padded sample length from
metrics.jsonl, DeepSpeed's ``reduce_bucket_size`` / ``stage3_param_persistence_threshold`` where the
config set them, and DDP's gradient buckets for a one-process HF Trainer run on a CPU (Accelerate wraps
even a single CPU process in DDP, a single GPU it does not).

Where the estimate misses on a GPU it leaves out: the CUDA context, cuBLAS/NCCL workspaces and allocator
fragmentation (not in max_allocated at all, but in nvidia-smi), DeepSpeed's transient fp32 gradient
partition, and for FSDP through the HF Trainer, the root unit's parameters that stay gathered after the
forward pass (why ``local_params_per_rank`` reads 408 M of 559 M on 2 GPUs). ZeRO-1's model states are
the paper's (full gradients, kept through the backward pass until the accumulation boundary); DeepSpeed
reduces them into the rank's partition before the update, so the census taken there reads 4Ψ(1 − 1/N)
bytes fewer (fp32, 2 ranks: 16.7 % below the prediction, outside the goal). On the tiny profile the ZeRO
1-3 peaks are ~99 % DeepSpeed's reduce bucket (5e8 elements: 2 GB in fp32, whatever the model's size),
which the estimate includes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Iterable

import pandas as pd

from workshop_lib.book.pages.cells import is_missing, measured_cell
from workshop_lib.core.errors import WorkshopError
from workshop_lib.estimate import (
    KNOWN_CONFIGS,
    MemoryEstimate,
    TrainingSetup,
    estimate_memory,
    model_shape,
    setup_from_experiment,
)
from workshop_lib.jobs.states import COMPLETED

MIB = 2**20
GOAL_MODEL_STATES = 0.15
GOAL_PEAK = 0.25

STEP_PEAK = "tensor_step_peak"  # the CPU engines' measured kind: live tensor bytes during the 2nd step

PREDICTION_NOTE = (
    "Predicted: workshop_lib.estimate for the model, precision, batch and sequence length that actually ran "
    "(metrics.jsonl). Measured, on rank 0, as tensor bytes: the model states (parameters, gradients and "
    "optimizer states, engines' flat buffers included) when the second optimizer step begins, goal within 15 %; "
    "and the peak: torch.cuda.max_memory_allocated over the training steps on a GPU, on a CPU the most tensor bytes alive during the "
    "second step (tensor_step_peak), goal within 25 %. Error = (predicted - measured) / measured. "
    "Runs that recorded only the process RSS (cpu_max_rss, Python and torch included) get no error. "
    "ZeRO-1 is expected outside the model-state goal: DeepSpeed reduces its full gradients into the rank's "
    "partition before the update, which the paper's formula does not. On the tiny profile the ZeRO peaks are "
    "mostly DeepSpeed's reduce bucket (reduce_bucket_size, 5e8 elements by default), which the estimate includes.")


@dataclass(frozen=True)
class MemoryComparison:
    """One run: the estimate beside the measurements (MiB per GPU / per rank, the largest rank)."""

    label: str
    gpus: int
    model: str
    predicted_model_states_mib: float
    predicted_peak_mib: float
    measured_peak_mib: float  # the engine's peak_memory_mib (CUDA allocations, or the CPU process's RSS)
    measured_kind: str  # cuda_max_allocated | cpu_max_rss
    measured_model_states_mib: float | None = None  # tensor census at the second step (None: not recorded)
    measured_step_peak_mib: float | None = None  # live tensor bytes during the second step

    @property
    def comparable(self) -> bool:
        return self.measured_kind == "cuda_max_allocated" or self.measured_step_peak_mib is not None

    @property
    def compared_peak_mib(self) -> float | None:
        """The measured peak that means what the prediction means: CUDA allocations, else tensor bytes."""
        if self.measured_kind == "cuda_max_allocated":
            return self.measured_peak_mib
        return self.measured_step_peak_mib

    @property
    def peak_error(self) -> float | None:
        """(predicted − measured) / measured, only where both mean the same thing (tensor bytes)."""
        return _error(self.predicted_peak_mib, self.compared_peak_mib)

    @property
    def model_state_error(self) -> float | None:
        return _error(self.predicted_model_states_mib, self.measured_model_states_mib)


def _error(predicted: float | None, measured: float | None) -> float | None:
    if predicted is None or not measured:
        return None
    return (predicted - measured) / measured


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


def _as_run(setup: TrainingSetup, model, settings: dict, device: str | None, trainer: bool) -> TrainingSetup:
    """What the setup leaves to the engine, as it ran: DeepSpeed's buffer sizes from the config ("auto": the
    HF Trainer's hidden² bucket and 10·hidden persistence threshold), and the one-process DDP wrapper the
    HF Trainer puts around a model on a CPU."""
    changes = {}
    hidden = model_shape(model).hidden_size if model is not None else None
    for key, field_name, auto in (("reduce_bucket_size", "reduce_bucket", lambda h: h * h),
                                  ("stage3_param_persistence_threshold", "persistence_threshold", lambda h: 10 * h)):
        value = settings.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            changes[field_name] = int(value)
        elif value == "auto" and hidden:
            changes[field_name] = auto(hidden)
    if trainer and device == "cpu" and setup.resolved_engine == "ddp":
        changes["ddp_buckets"] = True
    if setup.fsdp == "HYBRID_SHARD" and setup.nodes < 2:  # one node is one shard group: FULL_SHARD's layout
        changes["fsdp"] = "FULL_SHARD"
    return replace(setup, **changes)


def predicted_bytes(estimate: MemoryEstimate, device: str | None) -> tuple[float, float]:
    """(model states, peak) as the run measured them. The model-state census counts the states wherever
    they live, so the offloaded host part always counts there; the peak counts it only on a CPU, where
    offloaded states share the one memory with everything else (on a GPU the peak is the GPU's)."""
    host = estimate.cpu_total
    return estimate.model_states + host, estimate.total + (host if device == "cpu" else 0.0)


def setup_for_record(record: dict) -> TrainingSetup:
    """The TrainingSetup of a results record (a row of `results.chapter_results`), realised as it ran."""
    fields = {key: (value if not is_missing(value) else None) for key, value in record.items()}
    setup = setup_from_experiment(SimpleNamespace(**fields))
    settings = record.get("run_settings") or {}
    changes = {}
    if not is_missing(record.get("run_precision")):
        changes["precision"] = record["run_precision"]
    if not is_missing(record.get("run_seq_len")):
        changes["seq_len"] = int(record["run_seq_len"])
    if not is_missing(record.get("run_batch")):
        changes["batch"] = int(record["run_batch"])
    if settings.get("offload_applied") is False:  # FSDP offload recorded but not applied (CPU)
        changes["offload"] = "none"
    device = record.get("run_device") if not is_missing(record.get("run_device")) else None
    return _as_run(replace(setup, **changes), _model_for(record), settings, device, record.get("engine") == "hf")


def predict_record(record: dict) -> MemoryEstimate | None:
    """The estimate for one results record, or None when the model is not one the estimator knows."""
    model = _model_for(record)
    if model is None:
        return None
    try:
        return estimate_memory(model, setup_for_record(record))
    except WorkshopError:  # a setup the estimator refuses (its message is in `workshop estimate`): no prediction
        return None


FRAME_COLUMNS = ["Run", "GPUs", "Model as run", "Predicted model states (MiB)", "Measured model states (MiB)",
                 "Model-state error (%)", "Predicted peak (MiB)", "Measured peak (MiB)", "Measured as",
                 "Peak error (%)", "Predicted Δ vs reference (MiB)", "Measured Δ vs reference (MiB)"]


def prediction_frame(results: pd.DataFrame, reference_id: str) -> pd.DataFrame:
    """Chapter 3/4 companion table: one row per HF/GPT experiment, estimate beside the measurements.

    The Δ columns are differences against ``reference_id`` (the chapter's one-GPU baseline), predicted
    and measured the same way.
    """
    records = results.to_dict("records")
    reference = next((r for r in records if r["id"] == reference_id), None)
    reference_estimate = predict_record(reference) if reference else None
    reference_peak, reference_kind = (_measured_peak(reference) if reference and reference.get("state") == COMPLETED
                                      else (None, None))
    rows = []
    for record in records:
        if record.get("engine") not in ("hf", "gpt"):
            continue
        estimate = predict_record(record)
        device = record.get("run_device") if not is_missing(record.get("run_device")) else None
        predicted_states, predicted_peak = predicted_bytes(estimate, device) if estimate else (None, None)
        measured, kind = _measured_peak(record)
        states = record.get("rank0_model_state_mib")
        states = float(states) if not is_missing(states) else None
        row = {"Run": record["id"], "GPUs": record["gpus"],
               "Model as run": record.get("run_model") if not is_missing(record.get("run_model")) else record["model"]}
        values = {
            "Predicted model states (MiB)": _mib(predicted_states) if estimate else None,
            "Measured model states (MiB)": round(states, 2) if states is not None else None,
            "Model-state error (%)": None,
            "Predicted peak (MiB)": _mib(predicted_peak) if estimate else None,
            "Measured peak (MiB)": round(measured, 2) if measured is not None else None,
            "Measured as": kind,
            "Peak error (%)": None,
            "Predicted Δ vs reference (MiB)": None,
            "Measured Δ vs reference (MiB)": None,
        }
        if estimate and states:
            values["Model-state error (%)"] = _percent(_error(predicted_states / MIB, states))
        if estimate and measured and kind in ("cuda_max_allocated", STEP_PEAK):
            values["Peak error (%)"] = _percent(_error(predicted_peak / MIB, measured))
        if estimate and reference_estimate:
            values["Predicted Δ vs reference (MiB)"] = _mib(estimate.total - reference_estimate.total)
        if measured is not None and reference_peak is not None and kind == reference_kind:
            values["Measured Δ vs reference (MiB)"] = round(measured - reference_peak, 2)
        row.update({name: measured_cell(record, value) for name, value in values.items()})
        rows.append(row)
    return pd.DataFrame(rows, columns=FRAME_COLUMNS)


def _measured_peak(record: dict) -> tuple[float | None, str | None]:
    """Rank 0's peak and what it measured: CUDA allocations, else the step's live tensor bytes, else RSS."""
    kind = record.get("allocated_kind") if not is_missing(record.get("allocated_kind")) else None
    step_peak = record.get("rank0_step_peak_mib")
    if kind != "cuda_max_allocated" and not is_missing(step_peak):
        return float(step_peak), STEP_PEAK
    return _rank0(record), kind


def _percent(error: float | None) -> float | None:
    return None if error is None else round(100 * error, 1)


def _rank0(record: dict | None) -> float | None:
    value = (record or {}).get("rank0_peak_mib")
    return float(value) if not is_missing(value) else None


def _mib(value: float) -> float:
    return round(value / MIB, 2)


# ---- reference GPU runs (benchmarks/results/cuda_smoke/*.metrics.jsonl) -----------------------------


SUMMARY_ENGINES = ("hf", "deepspeed", "fsdp", "gpt")  # the engines setup_from_summary understands


def setup_from_summary(summary: dict) -> TrainingSetup:
    """A TrainingSetup from a metrics.jsonl summary record (engine, settings, world size, precision)."""
    settings = summary.get("settings") or {}
    engine = summary.get("engine")
    zero = settings.get("zero_stage") if engine == "deepspeed" else None
    if engine == "deepspeed" and zero is None:
        zero = _zero_stage_from_name(settings.get("config"))
    fsdp = settings.get("strategy") if engine == "fsdp" else None
    if engine == "gpt" and settings.get("parallelism") == "fsdp":  # the custom GPT's own FSDP
        fsdp = settings.get("fsdp")
    offload = "none"
    if engine == "deepspeed":
        if settings.get("offload_param", "none") != "none":
            offload = "parameters"
        elif settings.get("offload_optimizer", "none") not in ("none", False, None):
            offload = "optimizer"
    elif fsdp and settings.get("offload_applied"):
        offload = "parameters"
    setup = TrainingSetup(gpus=int(summary["world_size"]), nodes=int(summary.get("nodes") or 1),
                          precision=summary.get("precision") or "fp32", zero_stage=zero, fsdp=fsdp, offload=offload,
                          batch=int(settings.get("per_device_batch") or 1),
                          seq_len=int(settings.get("max_length") or 512))
    return _as_run(setup, model_of_summary(summary), settings, summary.get("device"),
                   engine in ("hf", "deepspeed", "fsdp"))


def model_of_summary(summary: dict):
    """The model a summary ran: a known name, or the custom GPT's shape from its settings; None if unknown."""
    settings = summary.get("settings") or {}
    if summary.get("engine") == "gpt" or summary.get("model") == "gpt":
        keys = ("layers", "hidden", "heads", "ffn", "vocab", "seq_len")
        if not all(key in settings for key in keys):
            return None
        return {"model_type": "gpt", **{key: settings[key] for key in keys}}
    model = summary.get("model")
    return model if model in KNOWN_CONFIGS else None


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
    """Estimate vs the measurements (max over ranks) of one finished run's summary."""
    if summary.get("engine") not in SUMMARY_ENGINES:
        raise WorkshopError(f"{label}: engine {summary.get('engine')!r} is not compared (its LoRA / tensor-parallel "
                            f"settings are not read into a setup); compare runs of {', '.join(SUMMARY_ENGINES)}")
    model = model_of_summary(summary)
    if model is None:
        raise WorkshopError(f"{label}: model {summary.get('model')!r} is not known to the estimator; use one of "
                            f"{', '.join(KNOWN_CONFIGS)} (or the custom gpt with its shape in the settings)")
    estimate = estimate_memory(model, setup_from_summary(summary))
    states, peak = predicted_bytes(estimate, summary.get("device"))
    peaks = summary.get("peak_memory_mib_per_rank") or []
    if not peaks:
        raise WorkshopError(f"{label}: the summary records no peak memory")
    return MemoryComparison(label=label, gpus=int(summary["world_size"]), model=summary.get("model"),
                            predicted_model_states_mib=states / MIB,
                            predicted_peak_mib=peak / MIB, measured_peak_mib=float(max(peaks)),
                            measured_kind=summary.get("peak_memory_kind") or "",
                            measured_model_states_mib=_max_mib(summary.get("model_state_bytes_per_rank")),
                            measured_step_peak_mib=_max_mib(summary.get("step_peak_bytes_per_rank")))


def _max_mib(per_rank) -> float | None:
    """The largest rank's value in MiB, None unless every rank recorded one."""
    if not per_rank or any(value is None for value in per_rank):
        return None
    return max(per_rank) / MIB


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
               "Measured model states (MiB)": (None if c.measured_model_states_mib is None
                                               else round(c.measured_model_states_mib)),
               "Model-state error (%)": _percent(c.model_state_error),
               "Predicted peak (MiB)": round(c.predicted_peak_mib), "Measured peak (MiB)": round(c.measured_peak_mib),
               "Peak error (%)": _percent(c.peak_error),
               "Predicted Δ vs reference (MiB)": None, "Measured Δ vs reference (MiB)": None, "Δ error (%)": None}
        if base and c is not base:
            predicted = c.predicted_peak_mib - base.predicted_peak_mib
            measured = c.measured_peak_mib - base.measured_peak_mib
            row.update({"Predicted Δ vs reference (MiB)": round(predicted), "Measured Δ vs reference (MiB)": round(measured),
                        "Δ error (%)": round(100 * (predicted - measured) / measured, 1) if measured else None})
        rows.append(row)
    return pd.DataFrame(rows)


__all__ = ["GOAL_MODEL_STATES", "GOAL_PEAK", "PREDICTION_NOTE", "STEP_PEAK", "MemoryComparison", "compare_summary",
           "model_of_summary", "predict_record", "predicted_bytes", "prediction_frame", "read_summary",
           "reference_comparisons", "reference_frame", "setup_for_record", "setup_from_summary"]
