"""Every table of the seeds, with the seeds' columns, filled from the runs of a chapter.

Derived columns are computed from the measured ones, never typed:

* time scaling (seeds 000/001) = T_base / T_N of the total job time; peak-memory scaling = peak_base / peak_N
  (how many times less GPU 0 holds; both as the seeds define them);
* strong scaling (fixed data set: seed 003's BLOOM and custom-GPT tables): Samples/s Scale Factor =
  S_N / S_1, Runtime Scale Factor = speedup = T_1 / T_N, and an added Parallel Efficiency (%) =
  T_1 / (N·T_N) × 100 (N counted relative to the first row's GPUs);
* weak scaling (equal work per GPU: seed 002's multi-GPU and multi-node tables, seed 003's depth table):
  efficiency = T_1 / T_N × 100 (100 % = no overhead). Seed 003 printed it upside down (T_N / T_1, which
  grows past 100 % as runs slow down); this module uses T_1 / T_N. Seed 002's tables had no derived
  rows: they gain "Train Runtime (s)", "Throughput Scaling" (S_N / S_1) and "Weak Scaling Efficiency"
  rows, against the one-GPU ZeRO-0 run (same recipe, 500 samples per GPU) and the 2-node run.

Column sets are the seeds' own (``SEED_COLUMNS`` lists them; ``ADDED_COLUMNS`` the derived extras).
Where the seeds had a column for the command that submits the job, it shows the `workshop submit`
command of the experiment. One deliberate difference: seed 002's stage-comparison tables have a blank
first header (here "Metric"). Seed 003's "GPU Utilization (%)" columns, and the same column added wherever a
table shows GPU memory, hold GPU 0's nvidia-smi utilization.gpu averaged over the samples taken while
training (memory at or above half its peak; see workshop_lib.memory).

On the tiny profile there is no GPU and no nvidia-smi log: the GPU 0 columns of the NeMo-style tables
(chapters 1-2, filled by the LoRA/TP stand-in engines from metrics.jsonl) then show rank 0's peak from
the engine (``cpu_max_rss``: the whole process) and the table note says so; the others stay "n/a".

A run that did not complete shows its state (MISSING, FAILED, TIMEOUT, …) in every measured cell; a
value a completed run did not record shows as "n/a". Nothing is ever shown as 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import pandas as pd

from workshop_lib.book.cells import NOT_RECORDED, completed, is_missing, measured_cell
from workshop_lib.core.errors import WorkshopError
from workshop_lib.core.durations import format_duration
from workshop_lib.book.predictions import PREDICTION_NOTE, prediction_frame
from workshop_lib.results import COMPLETED, chapter_results


@dataclass(frozen=True)
class Table:
    title: str
    frame: pd.DataFrame
    note: str = ""
    key: str = ""  # which part of the chapter it belongs to (e.g. "single-gpu"), for showing it in place


Column = tuple[str, Callable[[dict], object]]
GB = 2**20 / 1e9  # MiB → GB (10⁹ bytes), for the seeds' "(GB)" columns


def _get(key: str, scale: float = 1.0, digits: int | None = None) -> Callable[[dict], object]:
    def read(record: dict):
        value = record.get(key)
        if value is None or (isinstance(value, float) and pd.isna(value)):
            return None
        value = value * scale
        return round(value, digits) if digits is not None else value
    return read


def _int(key: str) -> Callable[[dict], object]:
    """An integer field that pandas may have widened to float (a column with gaps)."""
    def read(record: dict):
        value = record.get(key)
        return None if value is None or pd.isna(value) else int(value)
    return read


def _ratio(numerator: dict, denominator: dict, key: str, digits: int = 2) -> float | None:
    """numerator[key] / denominator[key] when both runs completed and recorded it."""
    top, bottom = numerator.get(key), denominator.get(key)
    if not (completed(numerator) and completed(denominator)) or top is None or not bottom or pd.isna(top) \
            or pd.isna(bottom):
        return None
    return round(top / bottom, digits)


def _rows(records: list[dict], columns: list[Column], fixed: tuple[str, ...] = ()) -> pd.DataFrame:
    """One row per record; columns named in `fixed` describe the experiment and are never masked."""
    rows = []
    for record in records:
        rows.append({name: (read(record) if name in fixed else measured_cell(record, read(record)))
                     for name, read in columns})
    return pd.DataFrame(rows, columns=[name for name, _ in columns])


def _transpose(records: list[dict], headers: list[str], metrics: list[Column],
               fixed: tuple[str, ...] = ()) -> pd.DataFrame:
    """The seeds' sideways tables: one row per metric, one column per run."""
    rows = []
    for name, read in metrics:
        row = {"Metric": name}
        for header, record in zip(headers, records):
            row[header] = read(record) if name in fixed else measured_cell(record, read(record))
        rows.append(row)
    return pd.DataFrame(rows, columns=["Metric", *headers])


def _group(results: pd.DataFrame, group: str) -> list[dict]:
    return results[results["group"] == group].to_dict("records")


def _hms(record: dict):
    seconds = record.get("total_time_s")
    return None if seconds is None or pd.isna(seconds) else format_duration(seconds)


def step_time_key(records: list[dict]) -> str:
    """The per-step time the scaling figures use: the median over the steady steps where every completed
    run recorded it (the GPU references), else the mean over the logged steps. Never the total runtime,
    which start-up, the first compiled steps and evaluations dominate in short runs."""
    done = [r for r in records if completed(r)]
    if done and all(_present(r, "median_step_time_s") for r in done):
        return "median_step_time_s"
    return "mean_step_time_s"


def _step_time_label(key: str) -> str:
    return "Median Step Time (s)" if key == "median_step_time_s" else "Mean Step Time (s)"


def _run_setting(record: dict, key: str) -> int | None:
    """A whole-number engine setting the run recorded (``run_settings``), None where it has none."""
    settings = record.get("run_settings")
    value = settings.get(key) if isinstance(settings, dict) else None
    return None if is_missing(value) else int(value)


def capped_steps(record: dict) -> int | None:
    """The optimizer-step cap a run trained under (the profile's max_steps), None when it ran full epochs."""
    return _run_setting(record, "max_steps")


def samples_per_gpu(record: dict) -> int | None:
    """The samples each GPU trained on when the run's data grew with its GPUs (as recorded), else None."""
    return _run_setting(record, "samples_per_gpu")


def ran_fixed_steps(records: list[dict]) -> bool:
    """True when every completed run gave each GPU the same work whatever the GPU count: a fixed number of
    optimizer steps (a profile's max_steps cap) or the same samples per GPU, with the same batch per GPU.
    That is weak scaling, even where the seed's experiment (a fixed data set) meant strong scaling."""
    done = [r for r in records if completed(r)]
    return bool(done) and all(capped_steps(r) is not None or samples_per_gpu(r) is not None for r in done)


# nvidia-smi's utilization.gpu of GPU 0 while training; n/a where the monitor did not record it (no GPU).
_utilization = _get("gpu0_util_busy_avg_pct", digits=1)
UTILIZATION_NOTE = (" GPU Utilization: nvidia-smi's utilization.gpu on GPU 0 (the share of time a kernel ran), "
                    "averaged over the samples taken while training (memory at or above half its peak).")


def _utilization_note(records: list[dict]) -> str:
    """The note's sentence on utilisation, where a completed run recorded it."""
    return UTILIZATION_NOTE if any(completed(r) and _present(r, "gpu0_util_busy_avg_pct") for r in records) else ""


# --- chapters 1 and 2: NeMo scaling tables -------------------------------------------------------


def _gpu0_peak(record: dict):
    """GPU 0's nvidia-smi peak; without a GPU log (tiny profile, CPU), rank 0's peak from the engine."""
    value = _get("gpu0_peak_mib")(record)
    return value if value is not None else _get("rank0_peak_mib", digits=1)(record)


def _gpu0_peak_ratio(base: dict, record: dict) -> float | None:
    """peak_base / peak_N, both from the same source (nvidia-smi, or both from the engine)."""
    for key in ("gpu0_peak_mib", "rank0_peak_mib"):
        if _present(base, key) and _present(record, key):
            return _ratio(base, record, key)
    return None


def _present(record: dict, key: str) -> bool:
    value = record.get(key)
    return value is not None and not (isinstance(value, float) and pd.isna(value))


# Tensor bytes one rank holds, counted by the engine itself (workshop_lib.train.tensor_census): the model
# states when the optimizer step begins, and the most tensor bytes alive during one step. They show ZeRO,
# FSDP and tensor parallelism shrinking memory on any profile, a CPU one included, where no GPU is measured.
TENSOR_COLUMNS: list[Column] = [
    ("Model States per Rank (MiB)", _get("rank0_model_state_mib", digits=1)),
    ("Step Peak Tensors per Rank (MiB)", _get("rank0_step_peak_mib", digits=1)),
]


def scaling_baseline(records: list[dict]) -> dict | None:
    """The run the ratios divide by: the completed run on the fewest GPUs (the smallest layout that ran)."""
    done = [record for record in records if completed(record)]
    return min(done, key=lambda record: (record["gpus"], record["id"])) if done else None


def _mean_step_time(record: dict):
    """The mean step time where the run recorded it, else its last step's (older runs)."""
    value = _get("mean_step_time_s", digits=3)(record)
    return value if value is not None else _get("train_step_time_s", digits=3)(record)


def layout_name(record: dict) -> str:
    """The parallel layout of a NeMo run as chapter 2 names it: TP x PP x EP (+ SP), and the DP that is left."""
    tp, pp = int(record.get("tensor_parallel") or 1), int(record.get("pipeline_parallel") or 1)
    ep = record.get("expert_parallel")
    ep = 1 if ep is None or pd.isna(ep) else int(ep)
    parts = [f"TP {tp}"] + ([f"PP {pp}"] if pp > 1 else []) + ([f"EP {ep}"] if ep > 1 else [])
    dp = record["gpus"] // (tp * pp)
    return " x ".join(parts + ([f"DP {dp}"] if dp > 1 else [])) + (" + SP" if record.get("sequence_parallel") else "")


def nemo_scaling_table(records: list[dict], baseline_gpus: int | None = None, layout: bool = False) -> pd.DataFrame:
    """Seed 000/001's scaling table; ratios are against the completed run on `baseline_gpus` GPUs, by default
    the smallest layout that completed (`scaling_baseline`).

    Time scaling = T_base / T_N (total job time), peak-memory scaling = peak_base / peak_N (GPU 0), as the
    seeds define them. The tiny stand-in engines (no NeMo log) fill the same columns from metrics.jsonl:
    last step time and loss, and rank 0's engine peak where no nvidia-smi log exists.
    """
    if baseline_gpus is None:
        base = scaling_baseline(records) or {}
        # Before anything completed the columns still name the smallest layout; their cells stay empty.
        baseline_gpus = base["gpus"] if base else min((record["gpus"] for record in records), default=1)
    else:
        base = next((record for record in records if record["gpus"] == baseline_gpus and completed(record)), {})
    unit = f"{baseline_gpus} GPU"

    def batch_per_gpu(record: dict):
        # Data-parallel ranks share the global batch; tensor/pipeline groups work on the same samples.
        data_parallel = record["gpus"] // (record["tensor_parallel"] * record["pipeline_parallel"])
        return record["global_batch"] // max(data_parallel, 1) if record.get("global_batch") else None

    columns: list[Column] = [
        ("GPUs", lambda r: r["gpus"]),
        ("Batch per GPU", batch_per_gpu),
        ("Total job time (HH:MM:SS)", _hms),
        # The mean over the logged steps (the first left out), not the last step: one step is noisy.
        ("Train step time (s)", _mean_step_time),
        ("Last reduced_train_loss", _get("last_loss", digits=4)),
        ("GPU 0 Peak (MiB)", _gpu0_peak),
        ("GPU 0 Avg (MiB)", _get("gpu0_avg_mib", digits=2)),
        ("GPU 0 Mode (MiB)", _get("gpu0_mode_mib")),
        (f"Time scaling vs {unit}", lambda r: _ratio(base, r, "total_time_s") if base else None),
        (f"Peak memory scaling vs {unit}", lambda r: _gpu0_peak_ratio(base, r) if base else None),
        ("GPU 0 Utilization (%)", _utilization),
        *TENSOR_COLUMNS,  # what LoRA and tensor parallelism leave on each rank, counted by the stand-in engines
    ]
    if layout:  # chapter 2: two layouts share a GPU count, so the rows need their names
        columns.insert(0, ("Layout", layout_name))
    return _rows(records, columns, fixed=("Layout", "GPUs", "Batch per GPU"))


_CPU_PEAK_NOTE = (" Runs without an nvidia-smi log (the tiny profile on CPUs) show rank 0's peak resident set "
                  "size from metrics.jsonl in the GPU 0 Peak column: a whole process, Python and torch included.")


def _nemo_note(records: list[dict], text: str) -> str:
    uses_engine_peak = any(completed(r) and not _present(r, "gpu0_peak_mib") and _present(r, "rank0_peak_mib")
                           for r in records)
    return text + (_CPU_PEAK_NOTE if uses_engine_peak else "") + _utilization_note(records)


def _baseline_note(records: list[dict]) -> str:
    """Which run the ratios divide by, or why the ratio columns are empty."""
    base = scaling_baseline(records)
    step = " Train step time: the mean of the logged steps, the first left out."
    if base is None:
        return "No run of this table has completed yet, so the ratio columns stay empty." + step
    return (f"Ratios are against the smallest layout that completed: {base['id']} ({base['gpus']} GPU"
            f"{'s' if base['gpus'] > 1 else ''}). Time scaling = time(baseline) / time(N GPUs), from the total job "
            "time; memory scaling = GPU 0 peak(baseline) / GPU 0 peak(N GPUs)." + step)


def _above_ideal_note(records: list[dict]) -> str:
    """Where the time scaling beats the GPU ratio, which more GPUs cannot do: say what it is."""
    base = scaling_baseline(records)
    if base is None:
        return ""
    above = [r for r in records if completed(r) and r is not base and _present(r, "total_time_s")
             and _present(base, "total_time_s") and base["total_time_s"] / r["total_time_s"] > r["gpus"] / base["gpus"]]
    if not above:
        return ""
    named = ", ".join(f"{r['id']} ({base['total_time_s'] / r['total_time_s']:.2f} on {r['gpus'] / base['gpus']:g}x the "
                      f"GPUs)" for r in above)
    return (f" Time scaling above the GPU ratio: {named}. More GPUs cannot do that; the baseline job paid a one-off "
            "cost the others did not (the first job on a fresh machine loads and caches Python, PyTorch and the "
            "data), so this ratio measures warm-up, not scaling: compare the step times, which leave each run's "
            "first step out.")


def _nemo_tables(results: pd.DataFrame, titles: dict[str, str], layout: bool = False) -> list[Table]:
    tables = []
    for group, title in titles.items():
        records = _group(results, group)
        note = _nemo_note(records, _baseline_note(records) + _above_ideal_note(records))
        tables.append(Table(title, nemo_scaling_table(records, layout=layout), note, group))
    return tables


def chapter_1_tables(results: pd.DataFrame) -> list[Table]:
    return _nemo_tables(results, {"llama": "Llama 3.1 8B + LoRA, data parallel",
                                  "mixtral": "Mixtral 8x7B + LoRA, data parallel"})


def chapter_2_tables(results: pd.DataFrame) -> list[Table]:
    return _nemo_tables(results, {"llama": "Llama 3.1 8B, tensor parallel",
                                  "mixtral": "Mixtral 8x7B, tensor x expert parallel"}, layout=True)


# --- chapter 3: DeepSpeed ----------------------------------------------------------------------


def _epoch_loss(epoch: int) -> Callable[[dict], object]:
    def read(record: dict):
        value = (record.get("eval_loss_by_epoch") or {}).get(epoch)
        return None if value is None else round(value, 4)
    return read


def _submit(record: dict) -> str:
    """The command that submits this experiment (the seeds' "Submit Job" cells held an sbatch line)."""
    return f"workshop submit {record['id']}"


def _steps_row(record: dict) -> tuple[str, str, Callable[[dict], object]]:
    """(metric, where from, reader) for the steps row: "Steps per Epoch" for a run of full epochs; a run
    capped by max_steps gets its cap, labelled as such (the Trainer then reports the cap, not an epoch)."""
    cap = capped_steps(record)
    if cap is not None:
        return "Optimizer Steps (max_steps cap, not an epoch)", "the profile's max_steps", lambda r: cap
    return "Steps per Epoch", "trainer_state.json: max_steps / num_train_epochs, rounded up", _get("steps_per_epoch")


def baseline_summary(record: dict, fsdp: bool = False) -> pd.DataFrame:
    """Seed 002's baseline summary (Category, Metric, Extraction Instruction, Your Value), or with
    ``fsdp`` seed 003's (Metric, Log Location & Extraction, Your Value): one metric per row."""
    if fsdp:
        rows: list[tuple[str, str, str, Callable[[dict], object]]] = [
            ("", "Train Loss (Final)", "Trainer's train_loss", _get("train_loss", digits=4)),
            ("", "Eval Loss (Epoch 1)", "eval_loss at epoch 1", _epoch_loss(1)),
            ("", "Eval Loss (Epoch 2)", "eval_loss at epoch 2", _epoch_loss(2)),
            ("", "Eval Loss (Epoch 3)", "eval_loss at epoch 3", _epoch_loss(3)),
            ("", "Training Speed (samples/sec)", "train_samples_per_second", _get("train_samples_per_s", digits=3)),
            ("", "Evaluation Speed (samples/sec)", "eval_samples_per_second", _get("eval_samples_per_s", digits=3)),
            ("", *_steps_row(record)),
            ("", "Memory Allocated (MB)", "torch.cuda.max_memory_allocated, max over ranks (metrics.jsonl)",
             lambda r: None if _cuda_allocated(r) is None else round(_cuda_allocated(r) * 2**20 / 1e6, 1)),
            ("", "Exact Match (%)", "generated answers vs SQuAD's (eval_em)", _get("eval_em", scale=100, digits=1)),
            ("", "F1 (%)", "token overlap with SQuAD's answers (eval_f1)", _get("eval_f1", scale=100, digits=1)),
            ("", "GPU Utilization (%)", "nvidia-smi utilization.gpu, GPU 0, mean while training", _utilization),
        ]
        return pd.DataFrame([{"Metric": metric, "Log Location & Extraction": source,
                              "Your Value": measured_cell(record, read(record))} for _, metric, source, read in rows],
                            columns=["Metric", "Log Location & Extraction", "Your Value"])
    rows = [
        ("Training Metrics", "Final Train Loss", "Trainer's train_loss", _get("train_loss", digits=4)),
        ("Training Metrics", "Eval Loss (Epoch 1)", "eval_loss at epoch 1", _epoch_loss(1)),
        ("Training Metrics", "Eval Loss (Epoch 2)", "eval_loss at epoch 2", _epoch_loss(2)),
        ("Training Metrics", "Eval Loss (Final)", "last eval_loss", _get("eval_loss", digits=4)),
        ("Training Metrics", "Train Samples/sec", "train_samples_per_second", _get("train_samples_per_s", digits=3)),
        ("Training Metrics", "Eval Samples/sec", "eval_samples_per_second (first evaluation)",
         _get("eval_samples_per_s", digits=3)),
        ("Training Metrics", *_steps_row(record)),
        ("Answer Quality", "Exact Match (%)", "generated answers vs SQuAD's (metrics.jsonl eval_em)",
         _get("eval_em", scale=100, digits=1)),
        ("Answer Quality", "F1 (%)", "token overlap with SQuAD's answers (metrics.jsonl eval_f1)",
         _get("eval_f1", scale=100, digits=1)),
        ("GPU Memory", "Peak Usage (MiB)", "nvidia-smi, GPU 0", _get("gpu0_peak_mib")),
        ("GPU Memory", "Average Usage (MiB)", "nvidia-smi, GPU 0", _get("gpu0_avg_mib", digits=2)),
        ("GPU Memory", "Mode Usage (MiB)", "nvidia-smi, GPU 0", _get("gpu0_mode_mib")),
        ("GPU Utilization", "Mean While Training (%)", "nvidia-smi utilization.gpu, GPU 0, samples with memory "
         "at or above half its peak", _utilization),
        ("GPU Utilization", "Peak (%)", "nvidia-smi utilization.gpu, GPU 0", _get("gpu0_util_peak_pct")),
        ("CPU Memory", "Peak Usage (MB)", "psrecord", _get("cpu_peak_mib", digits=2)),
        ("CPU Memory", "Average Usage (MB)", "psrecord", _get("cpu_avg_mib", digits=2)),
        ("CPU Memory", "Mode Usage (MB)", "psrecord", _get("cpu_mode_mib")),
    ]
    return pd.DataFrame([{"Category": category, "Metric": metric, "Extraction Instruction": source,
                          "Your Value": measured_cell(record, read(record))}
                         for category, metric, source, read in rows],
                        columns=["Category", "Metric", "Extraction Instruction", "Your Value"])


def _title(record: dict) -> str:
    return record.get("title") or record.get("id")


def _weak_efficiency(reference: dict | None, key: str) -> Callable[[dict], object]:
    """Weak scaling: T_ref / T_N × 100 of the per-step time (equal work per GPU; 100 % = no overhead)."""
    def read(record: dict):
        ratio = _ratio(reference, record, key, digits=4) if reference else None
        return None if ratio is None else round(100 * ratio, 1)
    return read


def _weak_scaling_rows(reference: dict | None, unit: str, records: list[dict]) -> list[Column]:
    """Derived rows of seed 002's weak-scaling tables: efficiency from the per-step time against the reference."""
    key = step_time_key(records + ([reference] if reference else []))
    return [
        ("Train Runtime (s)", _get("train_runtime_s", digits=2)),
        (_step_time_label(key), _get(key, digits=3)),
        (f"Throughput Scaling vs {unit}",
         lambda r: _ratio(r, reference, "train_samples_per_s") if reference else None),
        (f"Weak Scaling Efficiency vs {unit} (%)", _weak_efficiency(reference, key)),
    ]


def _cuda_allocated(record: dict):
    """The engine's torch.cuda.max_memory_allocated (max over ranks); None off a GPU (there it is the RSS)."""
    on_gpu = record.get("allocated_kind") == "cuda_max_allocated"
    return _get("allocated_peak_mib", digits=1)(record) if on_gpu else None


def _cuda_allocated_gb(record: dict):
    """The same in GB (10⁹ bytes), for the seeds' "(GB)" columns."""
    value = _cuda_allocated(record)
    return None if value is None else round(value * GB, 3)


ALLOCATED_COLUMN: Column = ("Peak Allocated per GPU (MiB)", _cuda_allocated)


def chapter_3_tables(results: pd.DataFrame) -> list[Table]:
    tables = []
    baseline = _group(results, "baseline")
    if baseline:
        tables.append(Table("Baseline: HF Trainer without DeepSpeed", baseline_summary(baseline[0]), key="baseline"))
    single = _group(results, "single-gpu")
    tables.append(Table("ZeRO stages on one GPU (with and without CPU offload)", _rows(single, [
        ("DeepSpeed Config", _title),
        ("Submit Training Job", _submit),
        ("Peak GPU Memory Used (MiB)", _get("gpu0_peak_mib")),
        ("Average GPU Memory Used (MiB)", _get("gpu0_avg_mib", digits=2)),
        ("GPU Utilization (%)", _utilization),
        ALLOCATED_COLUMN, *TENSOR_COLUMNS,
        ("Peak CPU Memory Used (MiB)", _get("cpu_peak_mib", digits=2)),
        ("Average CPU Memory Used (MiB)", _get("cpu_avg_mib", digits=2)),
        ("Train Samples/Second", _get("train_samples_per_s", digits=3)),
    ], fixed=("DeepSpeed Config", "Submit Training Job")),
        "Peak GPU memory: nvidia-smi on GPU 0 (CUDA context and allocator cache included); peak allocated: "
        "the tensors PyTorch's allocator handed out (torch.cuda.max_memory_allocated)." + _utilization_note(single),
        key="single-gpu"))
    gpu_metrics: list[Column] = [
        ("Submit Job", _submit),
        ("Train Samples/sec", _get("train_samples_per_s", digits=3)),
        ("Train Loss", _get("train_loss", digits=4)),
        ("Peak GPU Memory (MiB)", _get("gpu0_peak_mib")),
        ("Average GPU Memory (MiB)", _get("gpu0_avg_mib", digits=2)),
        ("Mode for GPU Memory (MiB)", _get("gpu0_mode_mib")),
        ("GPU Utilization (%)", _utilization),
        ALLOCATED_COLUMN, *TENSOR_COLUMNS,
    ]
    cpu_metrics: list[Column] = [
        ("Peak CPU Memory (MiB)", _get("cpu_peak_mib", digits=2)),
        ("Average CPU Memory (MiB)", _get("cpu_avg_mib", digits=2)),
        ("Mode for CPU Memory (MiB)", _get("cpu_mode_mib")),
    ]
    multi = _group(results, "multi-gpu")
    # Equal work per GPU: the one-GPU ZeRO-0 run has the same recipe (stage 0, 500 samples on its GPU).
    one_gpu = next((r for r in single if r.get("zero_stage") == 0 and not r.get("offload")), None)
    tables.append(Table("Multi-GPU weak scaling (500 samples per GPU)",
                        _transpose(multi, [f"{r['gpus']} GPUs" for r in multi],
                                   gpu_metrics + _weak_scaling_rows(one_gpu, "1 GPU", multi), fixed=("Submit Job",)),
                        "Weak scaling: every GPU trains on as many samples as the one-GPU ZeRO-0 run, so "
                        "efficiency = step time(1 GPU) / step time(N GPUs) x 100 (100 % = no overhead) and "
                        "throughput scaling = samples/s(N GPUs) / samples/s(1 GPU) (ideal: N)." + _utilization_note(multi),
                        key="multi-gpu"))
    two = _group(results, "two-gpus")
    for offload in (False, True):
        runs = [r for r in two if bool(r["offload"]) == offload]
        tables.append(Table(f"2-GPU ZeRO stage comparison, {'with' if offload else 'without'} CPU offload",
                            _transpose(runs, [f"Stage {int(r['zero_stage'])}" for r in runs],
                                       gpu_metrics + cpu_metrics, fixed=("Submit Job",)),
                            _utilization_note(runs).strip(), key="two-gpus"))
    nodes = _group(results, "multi-node")
    node_metrics: list[Column] = [
        ("Submit Job", _submit),
        ("Train Samples/sec", _get("train_samples_per_s", digits=3)),
        ("Train Loss", _get("train_loss", digits=4)),
        ("Peak GPU Memory (GiB)", _get("gpu0_peak_mib", scale=1 / 1024, digits=2)),
        ("Average GPU Memory (GiB)", _get("gpu0_avg_mib", scale=1 / 1024, digits=2)),
        ("Mode for GPU Memory (MiB)", _get("gpu0_mode_mib")),
        ("GPU Utilization (%)", _utilization),
        *TENSOR_COLUMNS,
    ]
    tables.append(Table("Multi-node weak scaling (250 samples per GPU)",
                        _transpose(nodes, [f"{r['nodes']} nodes" for r in nodes],
                                   node_metrics + _weak_scaling_rows(nodes[0] if nodes else None, "2 nodes", nodes),
                                   fixed=("Submit Job",)),
                        "Efficiency = step time(2 nodes) / step time(N nodes) x 100: 250 samples per GPU everywhere."
                        + _utilization_note(nodes), key="multi-node"))
    tables.append(memory_prediction_table(results, reference_id="zero/baseline"))
    return tables


# --- chapter 4: FSDP ---------------------------------------------------------------------------


def _setup(record: dict) -> str:
    if record["nodes"] > 1:
        return f"{record['nodes']} Node"
    return "Single Node, Single GPU" if record["gpus"] == 1 else f"Single Node, {record['gpus']} GPUs"


def _node_setup(record: dict) -> str:
    """Seed 003's multi-node tables call the one-GPU reference row "Single Node"."""
    return "Single Node" if record["nodes"] == 1 else f"{record['nodes']} Node"


def _parallel_efficiency(base: dict) -> Callable[[dict], object]:
    """Strong scaling: T_1 / (N · T_N) × 100, with N the GPUs relative to the first row."""
    def read(record: dict):
        speedup = _ratio(base, record, "train_runtime_s", digits=6)
        if speedup is None:
            return None
        return round(100 * speedup * base["gpus"] / record["gpus"], 1)
    return read


def _scaling_columns(records: list[dict], base: dict, strong_extra: list[Column]) -> list[Column]:
    """What ran decides the derived columns. Full epochs over a fixed data set (the seed's runs on Ibex):
    strong scaling, the seed's speedup and a parallel efficiency. A fixed number of steps with the same
    batch per GPU (a profile's max_steps cap): weak scaling, efficiency from the per-step time."""
    if not ran_fixed_steps(records):
        return strong_extra
    key = step_time_key(records)
    return [(_step_time_label(key), _get(key, digits=3)), ("Weak Scaling Efficiency (%)", _weak_efficiency(base, key))]


def scaling_note(records: list[dict]) -> str:
    """The note under a chapter 4 scaling table, saying which kind of scaling its rows measured."""
    return _scaling_kind(records) + _utilization_note(records)


def _scaling_kind(records: list[dict]) -> str:
    if ran_fixed_steps(records):
        done = [r for r in records if completed(r)]
        steps = sorted({capped_steps(r) for r in done if capped_steps(r) is not None})
        per_gpu = sorted({samples_per_gpu(r) for r in done if samples_per_gpu(r) is not None})
        how = (f"{', '.join(map(str, steps))} optimizer steps (the profile's max_steps)" if steps else
               f"{', '.join(map(str, per_gpu))} samples per GPU")
        return (f"Same work per GPU ({how}, the same batch per GPU) at every GPU count: this is weak scaling. Weak "
                "Scaling Efficiency = step time(first row) / step time(N) x 100; the scale factors compare whole "
                "runs, start-up included.")
    return ("Fixed data set, full epochs (strong scaling): Runtime Scale Factor = runtime(first row) / runtime(N) is "
            "the speedup; Parallel Efficiency = speedup / (N / GPUs of the first row) x 100.")


def fsdp_scaling_table(records: list[dict], setup: Callable[[dict], str] = _setup) -> pd.DataFrame:
    """Seed 003's BLOOM multi-GPU / multi-node table; factors are against the first row: Samples/s Scale
    Factor = S_N / S_1, Runtime Scale Factor = T_1 / T_N, then the derived columns of what ran
    (`_scaling_columns`) and the tensor bytes per rank."""
    base = records[0] if records else {}
    return _rows(records, [
        ("Setup", setup),
        ("Total GPUs", lambda r: r["gpus"]),
        ("Samples/s", _get("train_samples_per_s", digits=3)),
        ("Samples/s Scale Factor", lambda r: _ratio(r, base, "train_samples_per_s")),
        ("Runtime (s)", _get("train_runtime_s", digits=2)),
        ("Runtime Scale Factor", lambda r: _ratio(base, r, "train_runtime_s")),
        ("Loss", _get("train_loss", digits=4)),
        ("GPU Memory Allocated (GB)", _cuda_allocated_gb),
        ("GPU Utilization (%)", _utilization),
        *_scaling_columns(records, base, [("Parallel Efficiency (%)", _parallel_efficiency(base))]),
        *TENSOR_COLUMNS,
    ], fixed=("Setup", "Total GPUs"))


def gpt_scaling_table(records: list[dict]) -> pd.DataFrame:
    """Seed 003's custom-model table: the trainer's figures ("Default") next to the per-step ones, then the
    derived columns of what ran (`_scaling_columns`) and the tensor bytes per rank."""
    base = records[0] if records else {}
    return _rows(records, [
        ("Setup", _setup),
        ("Total GPUs", lambda r: r["gpus"]),
        ("Samples/s (Default)", _get("train_samples_per_s", digits=3)),
        ("Samples/s (Callback)", _get("step_samples_per_s", digits=3)),
        ("GPU Memory (GB, Default)", _get("gpu0_peak_mib", scale=GB, digits=3)),
        ("GPU Memory (GB, Callback)", _cuda_allocated_gb),
        ("GPU Utilization (%)", _utilization),
        ("Loss", _get("train_loss", digits=4)),
        ("Runtime (s)", _get("train_runtime_s", digits=2)),
        *_scaling_columns(records, base, [("Speedup", lambda r: _ratio(base, r, "train_runtime_s")),
                                          ("Parallel Efficiency (%)", _parallel_efficiency(base))]),
        *TENSOR_COLUMNS,
    ], fixed=("Setup", "Total GPUs"))


def weak_scaling_table(records: list[dict]) -> pd.DataFrame:
    """Seed 003's weak scaling table. Efficiency = baseline step time / step time × 100 (100 % = no
    overhead; the seed wrote the ratio of runtimes upside down, which grows past 100 % as runs slow down,
    and a short run's total runtime is mostly start-up). Layers grow with the GPUs while the per-GPU batch
    halves."""
    base = records[0] if records else {}
    key = step_time_key(records)
    return _rows(records, [
        ("GPUs", lambda r: r["gpus"]),
        ("Num Layers", _int("gpt_layers")),
        ("Per-GPU Batch", _int("per_device_batch")),
        ("Total Params", _int("total_params")),
        ("Samples/s (Callback)", _get("step_samples_per_s", digits=3)),
        ("GPU Memory (GB, Callback)", _cuda_allocated_gb),
        ("GPU Utilization (%)", _utilization),
        ("Loss", _get("train_loss", digits=4)),
        ("Runtime (s)", _get("train_runtime_s", digits=2)),
        ("Efficiency (%)", _weak_efficiency(base, key)),
        (_step_time_label(key), _get(key, digits=3)),
        *TENSOR_COLUMNS,
    ], fixed=("GPUs", "Num Layers", "Per-GPU Batch"))


def _shard_group(record: dict):
    """Over how many ranks FSDP really sharded (what the engine recorded), else n/a."""
    return _run_setting(record, "fsdp_shard_group")


def fsdp_strategy_table(records: list[dict]) -> pd.DataFrame:
    """The strategy comparison on 2 nodes x 2 GPUs: speed, GPU memory and host memory side by side."""
    return _rows(records, [
        ("Strategy", lambda r: r.get("fsdp")),
        ("CPU Offload", lambda r: "yes" if r.get("offload") else "no"),
        ("Nodes x GPUs", lambda r: f"{int(r['nodes'])} x {int(r['gpus_per_node'])}"),
        ("Shard Group (ranks)", _shard_group),
        ("Samples/s", _get("train_samples_per_s", digits=3)),
        ("Train Step (s)", _get("train_step_time_s", digits=3)),
        ("Runtime (s)", _get("train_runtime_s", digits=2)),
        ("GPU Memory Allocated (GB)", _cuda_allocated_gb),
        ("GPU Utilization (%)", _utilization),
        *TENSOR_COLUMNS,
        ("Peak CPU Memory (GB)", _get("cpu_peak_mib", scale=GB, digits=2)),
        ("Loss", _get("train_loss", digits=4)),
    ], fixed=("Strategy", "CPU Offload", "Nodes x GPUs"))


def chapter_4_tables(results: pd.DataFrame) -> list[Table]:
    tables = []
    baseline = _group(results, "baseline")
    if baseline:
        tables.append(Table("Baseline: HF Trainer without FSDP", baseline_summary(baseline[0], fsdp=True),
                            key="baseline"))
    strategies = _group(results, "strategies")
    if strategies:
        tables.append(Table("FSDP sharding strategies, 2 nodes x 2 GPUs", fsdp_strategy_table(strategies),
                            "Same model, data and steps for every row. Shard Group: the ranks each parameter "
                            "is split over, as the engine recorded it (HYBRID_SHARD: the GPUs of one node)."
                            + _utilization_note(strategies), key="strategies"))
    single = _group(results, "single-gpu")
    one_node = single + _group(results, "multi-gpu")
    nodes = _group(results, "multi-node")
    across = single + nodes if nodes else []  # the one-GPU row alone is no comparison across nodes
    tables.append(Table("BLOOM-560m, FSDP on one node", fsdp_scaling_table(one_node), scaling_note(one_node),
                        key="multi-gpu"))
    tables.append(Table("BLOOM-560m, FSDP across nodes", fsdp_scaling_table(across, setup=_node_setup),
                        scaling_note(across), key="multi-node"))
    gpt = _group(results, "gpt")
    gpt_node = [r for r in gpt if r["nodes"] == 1]
    gpt_nodes = [r for r in gpt if r["nodes"] > 1]
    gpt_across = [r for r in gpt if r["gpus"] == 1] + gpt_nodes if gpt_nodes else []
    tables.append(Table("Custom GPT, FSDP on one node", gpt_scaling_table(gpt_node), scaling_note(gpt_node),
                        key="gpt"))
    tables.append(Table("Custom GPT, FSDP across nodes", gpt_scaling_table(gpt_across), scaling_note(gpt_across),
                        key="gpt-multi-node"))
    depth = _group(results, "weak-scaling")
    tables.append(Table("Custom GPT weak scaling by depth", weak_scaling_table(depth),
                        f"Efficiency (%) = step time(2 GPUs) / step time(N GPUs) x 100, from the "
                        f"{_step_time_label(step_time_key(depth)).lower().removesuffix(' (s)')}."
                        + _utilization_note(depth), key="weak-scaling"))
    tables.append(memory_prediction_table(results, reference_id="fsdp/baseline"))
    return tables


# --- predicted vs measured memory (chapters 3 and 4) -----------------------------------------------


def memory_prediction_table(results: pd.DataFrame, reference_id: str) -> Table:
    """The companion table of `workshop_lib.book.predictions`: estimate beside the measured peak per GPU."""
    return Table("Predicted vs measured memory per GPU", prediction_frame(results, reference_id), PREDICTION_NOTE,
                 key="prediction")


# --- presenting a table for the profile that produced it ------------------------------------------

# How the text and the tables name each model of the experiments (the training registry's names as keys).
MODEL_NAMES = {"bloom-560m": "BLOOM-560m", "llama-3.1-8b": "Llama 3.1 8B", "mixtral-8x7b": "Mixtral 8x7B"}
_DESCRIBING = {"Metric", "Category", "Extraction Instruction", "Log Location & Extraction"}


def stand_in_names(profile) -> dict[str, str]:
    """Real model name → how a table of this profile must call it: the profile's stand-in says so
    (``tiny-bloom (stand-in for BLOOM-560m)``); a profile that runs the real model keeps the name."""
    names = {}
    for model, shown in MODEL_NAMES.items():
        realised = profile.model_name(model)
        if realised != model:
            names[shown] = f"{realised} (stand-in for {shown})"
    return names


def rename_models(text, names: dict[str, str]):
    """``text`` with each real model name replaced by its stand-in (see `stand_in_names`)."""
    if not isinstance(text, str):
        return text
    for real, stand_in in names.items():
        # Once per mention, and never inside a mention that already names its stand-in.
        text = re.sub(rf"(?<!stand-in for ){re.escape(real)}", stand_in, text)
    return text


def for_stand_ins(table: Table, profile) -> Table:
    """The table with every real model name replaced by the profile's stand-in, in title, note and cells."""
    names = stand_in_names(profile)
    if not names:
        return table
    frame = table.frame.map(lambda value: rename_models(value, names))
    frame.columns = [rename_models(column, names) for column in frame.columns]
    return replace(table, title=rename_models(table.title, names), note=rename_models(table.note, names), frame=frame)


_STATE = re.compile(r"^[A-Z][A-Z_ ]+$")  # what a cell of a run that did not complete shows (FAILED, MISSING…)


def _unrecorded(cells) -> bool:
    """True when no completed run recorded a value here: n/a cells, and run states for the rest."""
    cells = list(cells)
    return NOT_RECORDED in cells and all(c == NOT_RECORDED or (isinstance(c, str) and _STATE.match(c)) for c in cells)


def drop_unrecorded(table: Table) -> Table:
    """Without the columns (and, in the seeds' sideways tables, the metric rows) that no completed run could
    fill (no nvidia-smi on a CPU, no census in older runs): they read n/a on every row and hide the rest."""
    frame = table.frame
    measured = [c for c in frame.columns if c not in _DESCRIBING]
    if "Metric" in frame.columns and measured:
        frame = frame[[not _unrecorded(row) for row in frame[measured].itertuples(index=False)]]
    empty = [c for c in frame.columns if c not in _DESCRIBING and _unrecorded(frame[c])]
    note = table.note
    if empty:  # never drop a column silently: the note names what went and why
        note = (note + " " if note else "") + (f"Not shown, because no completed run recorded a value: "
                                               f"{', '.join(map(str, empty))}.")
    return replace(table, frame=frame.drop(columns=empty).reset_index(drop=True), note=note)


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
                 "zero-single-gpu": ["GPU Utilization (%)", ALLOCATED_COLUMN[0], *_TENSORS],
                 "fsdp-scaling": ["GPU Utilization (%)", *_STRONG_OR_WEAK, *_TENSORS],
                 "gpt-scaling": ["Speedup", *_STRONG_OR_WEAK, *_TENSORS],
                 "weak-scaling": [*_STEP_TIMES, *_TENSORS]}


_BUILDERS = {1: chapter_1_tables, 2: chapter_2_tables, 3: chapter_3_tables, 4: chapter_4_tables}


def chapter_tables(chapter: int, runs_dir: str | Path | None = None) -> list[Table]:
    """Every seed table of a chapter, filled from `runs_dir`."""
    _check_chapter(chapter)
    return tables_from_results(chapter, chapter_results(chapter, runs_dir))


def tables_from_results(chapter: int, results: pd.DataFrame) -> list[Table]:
    """Every seed table of a chapter, filled from results already read (`results.chapter_results`)."""
    _check_chapter(chapter)
    return _BUILDERS[chapter](results)


def _check_chapter(chapter: int) -> None:
    if chapter not in _BUILDERS:
        raise WorkshopError(f"there is no chapter {chapter}: choose 1, 2, 3 or 4")


def long_form(results: pd.DataFrame, metrics: tuple[str, ...] = (
        "total_time_s", "train_step_time_s", "train_samples_per_s", "train_runtime_s", "train_loss", "last_loss",
        "gpu0_peak_mib", "gpu0_avg_mib", "gpu0_busy_avg_mib", "allocated_peak_mib", "cpu_peak_mib")) -> pd.DataFrame:
    """Tidy long form for plotting: one row per (experiment, metric) of completed runs with a value."""
    keep = [column for column in ("id", "group", "gpus", "nodes", "zero_stage", "fsdp", "offload") if column in results]
    done = results[results["state"] == COMPLETED]
    frame = done.melt(id_vars=keep, value_vars=[m for m in metrics if m in done], var_name="metric")
    return frame.dropna(subset=["value"]).reset_index(drop=True)


def render_tables(tables: list[Table], output_format: str = "md") -> str:
    """Tables as markdown, CSV or JSON text."""
    if output_format == "json":
        import json
        return json.dumps([{"title": t.title, "note": t.note, "rows": t.frame.astype(object).where(
            t.frame.notna(), None).to_dict("records")} for t in tables], indent=2, default=str)
    parts = []
    for table in tables:
        if output_format == "csv":
            parts.append(f"# {table.title}\n{table.frame.to_csv(index=False)}")
        else:
            text = _markdown(table.frame)
            parts.append(f"### {table.title}\n\n{text}" + (f"\n\n{table.note}" if table.note else ""))
    return "\n\n".join(parts)


def _markdown(frame: pd.DataFrame) -> str:
    """A GitHub table without the optional `tabulate` dependency."""
    def cell(value) -> str:
        if value is None or (isinstance(value, float) and pd.isna(value)):
            return ""
        if isinstance(value, float) and value.is_integer() and abs(value) >= 1:
            return str(int(value))  # MiB readings are whole numbers; 6251.0 reads as noise
        return str(value)
    header = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *body])
