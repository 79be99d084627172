"""How a cell of a seed table is read from a run's record, shared by every chapter's tables: the Table value,
field readers, ratios and efficiencies, the per-step time to use, the note on GPU utilisation, and the seeds'
column sets (``SEED_COLUMNS``; ``ADDED_COLUMNS`` the derived extras, both checked by tests/test_tables_columns.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pandas as pd

from workshop_lib.book.measurements.series import same_series
from workshop_lib.book.pages.cells import completed, is_missing, measured_cell
from workshop_lib.core.durations import format_duration


@dataclass(frozen=True)
class Table:
    title: str
    frame: pd.DataFrame
    note: str = ""
    key: str = ""  # which part of the chapter it belongs to (e.g. "single-gpu"), for showing it in place


Column = tuple[str, Callable[[dict], object]]


GB = 2**20 / 1e9  # MiB → GB (10⁹ bytes), for the seeds' "(GB)" columns
GB_NOTE = (" Memory in GB is 10⁹ bytes, as in the original material's columns; the sentences under the tables "
           f"use GiB (2³⁰ bytes, {2**30 / 1e9:.3f} GB).")


def field(key: str, scale: float = 1.0, digits: int | None = None) -> Callable[[dict], object]:
    def read(record: dict):
        value = record.get(key)
        if is_missing(value):
            return None
        value = value * scale
        return round(value, digits) if digits is not None else value
    return read


def int_field(key: str) -> Callable[[dict], object]:
    """An integer field that pandas may have widened to float (a column with gaps)."""
    def read(record: dict):
        value = record.get(key)
        return None if is_missing(value) else int(value)
    return read


def ratio(numerator: dict, denominator: dict, key: str, digits: int = 2) -> float | None:
    """numerator[key] / denominator[key] when both runs completed and recorded it; raises MixedSeriesError
    where the two are of different engines or cards (`book.measurements.series`)."""
    top, bottom = numerator.get(key), denominator.get(key)
    if not (completed(numerator) and completed(denominator)) or is_missing(top) or is_missing(bottom) or not bottom:
        return None
    same_series(numerator, denominator)
    return round(top / bottom, digits)


def row_table(records: list[dict], columns: list[Column], fixed: tuple[str, ...] = ()) -> pd.DataFrame:
    """One row per record; columns named in `fixed` describe the experiment and are never masked."""
    rows = []
    for record in records:
        rows.append({name: (read(record) if name in fixed else measured_cell(record, read(record)))
                     for name, read in columns})
    return pd.DataFrame(rows, columns=[name for name, _ in columns])


def metric_table(records: list[dict], headers: list[str], metrics: list[Column],
                 fixed: tuple[str, ...] = ()) -> pd.DataFrame:
    """The seeds' sideways tables: one row per metric, one column per run."""
    rows = []
    for name, read in metrics:
        row = {"Metric": name}
        for header, record in zip(headers, records):
            row[header] = read(record) if name in fixed else measured_cell(record, read(record))
        rows.append(row)
    return pd.DataFrame(rows, columns=["Metric", *headers])


def group_records(results: pd.DataFrame, group: str) -> list[dict]:
    return results[results["group"] == group].to_dict("records")


def total_time_hms(record: dict):
    seconds = record.get("total_time_s")
    return None if is_missing(seconds) else format_duration(seconds)


def step_time_key(records: list[dict]) -> str:
    """The per-step time the scaling figures use: the median over the steady steps where every completed
    run recorded it (the GPU references), else the mean over the logged steps. Never the total runtime,
    which start-up, the first compiled steps and evaluations dominate in short runs."""
    done = [r for r in records if completed(r)]
    if done and all(present(r, "median_step_time_s") for r in done):
        return "median_step_time_s"
    return "mean_step_time_s"


def step_time_label(key: str) -> str:
    return "Median Step Time (s)" if key == "median_step_time_s" else "Mean Step Time (s)"


def run_setting(record: dict, key: str) -> int | None:
    """A whole-number engine setting the run recorded (``run_settings``), None where it has none."""
    settings = record.get("run_settings")
    value = settings.get(key) if isinstance(settings, dict) else None
    return None if is_missing(value) else int(value)


def capped_steps(record: dict) -> int | None:
    """The optimizer-step cap a run trained under (the profile's max_steps), None when it ran full epochs."""
    return run_setting(record, "max_steps")


def samples_per_gpu(record: dict) -> int | None:
    """The samples each GPU trained on when the run's data grew with its GPUs (as recorded), else None."""
    return run_setting(record, "samples_per_gpu")


def ran_fixed_steps(records: list[dict]) -> bool:
    """True when every completed run gave each GPU the same work whatever the GPU count: a fixed number of
    optimizer steps (a profile's max_steps cap) or the same samples per GPU, with the same batch per GPU.
    That is weak scaling, even where the seed's experiment (a fixed data set) meant strong scaling."""
    done = [r for r in records if completed(r)]
    return bool(done) and all(capped_steps(r) is not None or samples_per_gpu(r) is not None for r in done)


# nvidia-smi's utilization.gpu of GPU 0 while training; n/a where the monitor did not record it (no GPU).
utilization = field("gpu0_util_busy_avg_pct", digits=1)


UTILIZATION_NOTE = (" GPU Utilization: nvidia-smi's utilization.gpu on GPU 0 (the share of time a kernel ran), "
                    "averaged over the samples taken while training (memory at or above half its peak).")


def utilization_note(records: list[dict]) -> str:
    """The note's sentence on utilisation, where a completed run recorded it."""
    return UTILIZATION_NOTE if any(completed(r) and present(r, "gpu0_util_busy_avg_pct") for r in records) else ""


def present(record: dict, key: str) -> bool:
    value = record.get(key)
    return not is_missing(value)


# Tensor bytes one rank holds, counted by the engine itself (workshop_lib.train.tensor_census): the model
# states when the optimizer step begins, and the most tensor bytes alive during one step. They show ZeRO,
# FSDP and tensor parallelism shrinking memory on any profile, a CPU one included, where no GPU is measured.
TENSOR_COLUMNS: list[Column] = [
    ("Model States per Rank (MiB)", field("rank0_model_state_mib", digits=1)),
    ("Step Peak Tensors per Rank (MiB)", field("rank0_step_peak_mib", digits=1)),
]


def weak_efficiency(reference: dict | None, key: str) -> Callable[[dict], object]:
    """Weak scaling: T_ref / T_N × 100 of the per-step time (equal work per GPU; 100 % = no overhead)."""
    def read(record: dict):
        fraction = ratio(reference, record, key, digits=4) if reference else None
        return None if fraction is None else round(100 * fraction, 1)
    return read


def cuda_allocated(record: dict):
    """The engine's torch.cuda.max_memory_allocated over the training steps (max over ranks; older rows: rank 0's
    step 2, or the whole run before the census existed, allocated_scope says which); None off a GPU (the RSS)."""
    on_gpu = record.get("allocated_kind") == "cuda_max_allocated"
    return field("allocated_peak_mib", digits=1)(record) if on_gpu else None


def cuda_allocated_gb(record: dict):
    """The same in GB (10⁹ bytes), for the seeds' "(GB)" columns."""
    value = cuda_allocated(record)
    return None if value is None else round(value * GB, 3)


ALLOCATED_COLUMN: Column = ("Peak Allocated per GPU (MiB)", cuda_allocated)


# Column sets of the seeds' tables (what `tests/test_tables_columns.py` checks) and the derived extras.
SEED_COLUMNS = {
    "nemo": ["GPUs", "Batch per GPU", "Total job time (HH:MM:SS)", "Train step time (s)", "Last reduced_train_loss",
             "GPU 0 Peak (MiB)", "GPU 0 Avg (MiB)", "GPU 0 Mode (MiB)", "Time scaling vs {n} GPU",
             "Peak memory scaling vs {n} GPU"],
    "zero-baseline": ["Category", "Metric", "Extraction Instruction", "Your Value"],
    "zero-single-gpu": ["DeepSpeed Config", "Submit Training Job", "Peak GPU Memory Used (MiB)",
                        "Average GPU Memory Used (MiB)", "Peak CPU Memory Used (MiB)", "Average CPU Memory Used (MiB)",
                        "Train Samples/Second"],
    "fsdp-baseline": ["Metric", "Log Location & Extraction", "Your Value"],
    "fsdp-scaling": ["Setup", "Total GPUs", "Samples/s", "Samples/s Scale Factor", "Runtime (s)",
                     "Runtime Scale Factor", "Loss", "GPU Memory Allocated (GB)"],
    "gpt-scaling": ["Setup", "Total GPUs", "Samples/s (Default)", "Samples/s (Callback)", "GPU Memory (GB, Default)",
                    "GPU Memory (GB, Callback)", "GPU Utilization (%)", "Loss", "Runtime (s)"],
    "weak-scaling": ["GPUs", "Num Layers", "Per-GPU Batch", "Total Params", "Samples/s (Callback)",
                     "GPU Memory (GB, Callback)", "GPU Utilization (%)", "Loss", "Runtime (s)", "Efficiency (%)"],
}


_TENSORS = [name for name, _ in TENSOR_COLUMNS]


_STEP_TIMES = ["Median Step Time (s)", "Mean Step Time (s)"]


_STRONG_OR_WEAK = ["Parallel Efficiency (%)", *_STEP_TIMES, "Weak Scaling Efficiency (%)"]


ADDED_COLUMNS = {"nemo": ["GPU 0 Utilization (%)", *_TENSORS],
                 # where a run shares the baseline's GPU count (chapter 2's layouts, chapter 1's packed run): a
                 # comparison of two ways to use those GPUs, not scaling; chapter 1 then names its rows ("Run")
                 "nemo-same-gpus": ["Run", "Step time vs {run} (same GPUs)", "Peak memory vs {run} (same GPUs)"],
                 "zero-single-gpu": ["GPU Utilization (%)", ALLOCATED_COLUMN[0], *_TENSORS],
                 "fsdp-scaling": ["GPU Utilization (%)", *_STRONG_OR_WEAK, *_TENSORS],
                 "gpt-scaling": ["Speedup", *_STRONG_OR_WEAK, *_TENSORS],
                 "weak-scaling": [*_STEP_TIMES, *_TENSORS]}
