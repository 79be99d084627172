"""Every table of the seeds, with the seeds' columns, filled from the runs of a chapter.

Derived columns (time scaling, memory scaling, scale factors, efficiency) are computed from the
measured ones. A run that did not complete shows its state (MISSING, FAILED, TIMEOUT, …) in every
measured cell; a value a completed run did not record shows as "n/a". Nothing is ever shown as 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd

from .errors import WorkshopError
from .parse.footer import format_duration
from .results import COMPLETED, chapter_results

NOT_RECORDED = "n/a"


@dataclass(frozen=True)
class Table:
    title: str
    frame: pd.DataFrame
    note: str = ""


Column = tuple[str, Callable[[dict], object]]


def _done(record: dict) -> bool:
    return record.get("state") == COMPLETED


def _measured(record: dict, value):
    """The value, or the run's state when it did not complete, or n/a when it was not recorded."""
    if not _done(record):
        return record.get("state")
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return NOT_RECORDED
    return value


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
    if not (_done(numerator) and _done(denominator)) or top is None or not bottom or pd.isna(top) or pd.isna(bottom):
        return None
    return round(top / bottom, digits)


def _rows(records: list[dict], columns: list[Column], fixed: tuple[str, ...] = ()) -> pd.DataFrame:
    """One row per record; columns named in `fixed` describe the experiment and are never masked."""
    rows = []
    for record in records:
        rows.append({name: (read(record) if name in fixed else _measured(record, read(record)))
                     for name, read in columns})
    return pd.DataFrame(rows, columns=[name for name, _ in columns])


def _transpose(records: list[dict], headers: list[str], metrics: list[Column]) -> pd.DataFrame:
    """The seeds' sideways tables: one row per metric, one column per run."""
    rows = []
    for name, read in metrics:
        row = {"Metric": name}
        for header, record in zip(headers, records):
            row[header] = _measured(record, read(record))
        rows.append(row)
    return pd.DataFrame(rows, columns=["Metric", *headers])


def _group(results: pd.DataFrame, group: str) -> list[dict]:
    return results[results["group"] == group].to_dict("records")


def _hms(record: dict):
    seconds = record.get("total_time_s")
    return None if seconds is None or pd.isna(seconds) else format_duration(seconds)


# --- chapters 1 and 2: NeMo scaling tables -------------------------------------------------------


def nemo_scaling_table(records: list[dict], baseline_gpus: int) -> pd.DataFrame:
    """Seed 000/001's scaling table; ratios are against the run on `baseline_gpus` GPUs."""
    base = next((record for record in records if record["gpus"] == baseline_gpus), {})
    unit = f"{baseline_gpus} GPU"

    def batch_per_gpu(record: dict):
        # Data-parallel ranks share the global batch; tensor/pipeline groups work on the same samples.
        data_parallel = record["gpus"] // (record["tensor_parallel"] * record["pipeline_parallel"])
        return record["global_batch"] // max(data_parallel, 1) if record.get("global_batch") else None

    columns: list[Column] = [
        ("GPUs", lambda r: r["gpus"]),
        ("Batch per GPU", batch_per_gpu),
        ("Total job time (HH:MM:SS)", _hms),
        ("Train step time (s)", _get("train_step_time_s")),
        ("Last reduced_train_loss", _get("last_loss")),
        ("GPU 0 Peak (MiB)", _get("gpu0_peak_mib")),
        ("GPU 0 Avg (MiB)", _get("gpu0_avg_mib", digits=2)),
        ("GPU 0 Mode (MiB)", _get("gpu0_mode_mib")),
        (f"Time scaling vs {unit}", lambda r: _ratio(base, r, "total_time_s") if base else None),
        (f"Peak memory scaling vs {unit}", lambda r: _ratio(base, r, "gpu0_peak_mib") if base else None),
    ]
    return _rows(records, columns, fixed=("GPUs", "Batch per GPU"))


def chapter_1_tables(results: pd.DataFrame) -> list[Table]:
    note = ("Time scaling = time(baseline) / time(N GPUs), from the total job time; "
            "memory scaling = GPU 0 peak(baseline) / GPU 0 peak(N GPUs).")
    return [Table("Llama 3.1 8B + LoRA, data parallel", nemo_scaling_table(_group(results, "llama"), 1), note),
            Table("Mixtral 8x7B + LoRA, data parallel", nemo_scaling_table(_group(results, "mixtral"), 2), note)]


def chapter_2_tables(results: pd.DataFrame) -> list[Table]:
    note = "Ratios are against the smallest run that fits: 2 GPUs for Llama, 4 for Mixtral."
    return [Table("Llama 3.1 8B, tensor parallel", nemo_scaling_table(_group(results, "llama"), 2), note),
            Table("Mixtral 8x7B, tensor x expert parallel", nemo_scaling_table(_group(results, "mixtral"), 4), note)]


# --- chapter 3: DeepSpeed ----------------------------------------------------------------------


def _epoch_loss(epoch: int) -> Callable[[dict], object]:
    return lambda r: (r.get("eval_loss_by_epoch") or {}).get(epoch)


def baseline_summary(record: dict, fsdp: bool = False) -> pd.DataFrame:
    """Seed 002's (and 003's) baseline summary: one metric per row."""
    rows: list[tuple[str, str, str, Callable[[dict], object]]] = [
        ("Training Metrics", "Final Train Loss", "Trainer's train_loss", _get("train_loss")),
        ("Training Metrics", "Eval Loss (Epoch 1)", "eval_loss at epoch 1", _epoch_loss(1)),
        ("Training Metrics", "Eval Loss (Epoch 2)", "eval_loss at epoch 2", _epoch_loss(2)),
        ("Training Metrics", "Eval Loss (Final)", "last eval_loss", _get("eval_loss")),
        ("Training Metrics", "Train Samples/sec", "train_samples_per_second", _get("train_samples_per_s", digits=3)),
        ("Training Metrics", "Eval Samples/sec", "eval_samples_per_second (first evaluation)",
         _get("eval_samples_per_s", digits=3)),
        ("Training Metrics", "Steps per Epoch", "trainer_state.json", _get("steps_per_epoch")),
        ("GPU Memory", "Peak Usage (MiB)", "nvidia-smi, GPU 0", _get("gpu0_peak_mib")),
        ("GPU Memory", "Average Usage (MiB)", "nvidia-smi, GPU 0", _get("gpu0_avg_mib", digits=2)),
        ("GPU Memory", "Mode Usage (MiB)", "nvidia-smi, GPU 0", _get("gpu0_mode_mib")),
        ("CPU Memory", "Peak Usage (MB)", "psrecord", _get("cpu_peak_mib", digits=2)),
        ("CPU Memory", "Average Usage (MB)", "psrecord", _get("cpu_avg_mib", digits=2)),
        ("CPU Memory", "Mode Usage (MB)", "psrecord", _get("cpu_mode_mib")),
    ]
    if fsdp:  # seed 003's list: three epochs of eval loss, then memory allocated and utilisation
        rows = rows[:3] + [("Training Metrics", "Eval Loss (Epoch 3)", "eval_loss at epoch 3", _epoch_loss(3))] + [
            ("Training Metrics", "Training Speed (samples/sec)", "train_samples_per_second",
             _get("train_samples_per_s", digits=3)),
            ("Training Metrics", "Evaluation Speed (samples/sec)", "eval_samples_per_second",
             _get("eval_samples_per_s", digits=3)),
            ("Training Metrics", "Steps per Epoch", "trainer_state.json", _get("steps_per_epoch")),
            ("Memory", "Memory Allocated (MB)", "engine's peak per rank", _get("allocated_peak_mib", digits=1)),
            ("Memory", "GPU Utilization (%)", "not recorded by the monitors", lambda r: None),
        ]
    return pd.DataFrame([{"Category": category, "Metric": metric, "Source": source,
                          "Value": _measured(record, read(record))} for category, metric, source, read in rows])


def _title(record: dict) -> str:
    return record.get("title") or record.get("id")


def chapter_3_tables(results: pd.DataFrame) -> list[Table]:
    tables = []
    baseline = _group(results, "baseline")
    if baseline:
        tables.append(Table("Baseline: HF Trainer without DeepSpeed", baseline_summary(baseline[0])))
    single = _group(results, "single-gpu")
    tables.append(Table("ZeRO stages on one GPU (with and without CPU offload)", _rows(single, [
        ("DeepSpeed Config", _title),
        ("Peak GPU Memory Used (MiB)", _get("gpu0_peak_mib")),
        ("Average GPU Memory Used (MiB)", _get("gpu0_avg_mib", digits=2)),
        ("Peak CPU Memory Used (MiB)", _get("cpu_peak_mib", digits=2)),
        ("Average CPU Memory Used (MiB)", _get("cpu_avg_mib", digits=2)),
        ("Train Samples/Second", _get("train_samples_per_s", digits=3)),
    ], fixed=("DeepSpeed Config",))))
    gpu_metrics: list[Column] = [
        ("Train Samples/sec", _get("train_samples_per_s", digits=3)),
        ("Train Loss", _get("train_loss")),
        ("Peak GPU Memory (MiB)", _get("gpu0_peak_mib")),
        ("Average GPU Memory (MiB)", _get("gpu0_avg_mib", digits=2)),
        ("Mode for GPU Memory (MiB)", _get("gpu0_mode_mib")),
    ]
    cpu_metrics: list[Column] = [
        ("Peak CPU Memory (MiB)", _get("cpu_peak_mib", digits=2)),
        ("Average CPU Memory (MiB)", _get("cpu_avg_mib", digits=2)),
        ("Mode for CPU Memory (MiB)", _get("cpu_mode_mib")),
    ]
    multi = _group(results, "multi-gpu")
    tables.append(Table("Multi-GPU weak scaling (500 samples per GPU)",
                        _transpose(multi, [f"{r['gpus']} GPUs" for r in multi], gpu_metrics)))
    two = _group(results, "two-gpus")
    for offload in (False, True):
        runs = [r for r in two if bool(r["offload"]) == offload]
        tables.append(Table(f"2-GPU ZeRO stage comparison, {'with' if offload else 'without'} CPU offload",
                            _transpose(runs, [f"Stage {int(r['zero_stage'])}" for r in runs], gpu_metrics + cpu_metrics)))
    nodes = _group(results, "multi-node")
    node_metrics: list[Column] = [
        ("Train Samples/sec", _get("train_samples_per_s", digits=3)),
        ("Train Loss", _get("train_loss")),
        ("Peak GPU Memory (GiB)", _get("gpu0_peak_mib", scale=1 / 1024, digits=2)),
        ("Average GPU Memory (GiB)", _get("gpu0_avg_mib", scale=1 / 1024, digits=2)),
        ("Mode for GPU Memory (MiB)", _get("gpu0_mode_mib")),
    ]
    tables.append(Table("Multi-node weak scaling (250 samples per GPU)",
                        _transpose(nodes, [f"{r['nodes']} nodes" for r in nodes], node_metrics)))
    return tables


# --- chapter 4: FSDP ---------------------------------------------------------------------------


def _setup(record: dict) -> str:
    if record["nodes"] > 1:
        return f"{record['nodes']} Node"
    return "Single Node, Single GPU" if record["gpus"] == 1 else f"Single Node, {record['gpus']} GPUs"


def fsdp_scaling_table(records: list[dict]) -> pd.DataFrame:
    """Seed 003's BLOOM multi-GPU / multi-node table; factors are against the first row."""
    base = records[0] if records else {}
    return _rows(records, [
        ("Setup", _setup),
        ("Total GPUs", lambda r: r["gpus"]),
        ("Samples/s", _get("train_samples_per_s", digits=3)),
        ("Samples/s Scale Factor", lambda r: _ratio(r, base, "train_samples_per_s")),
        ("Runtime (s)", _get("train_runtime_s", digits=2)),
        ("Runtime Scale Factor", lambda r: _ratio(base, r, "train_runtime_s")),
        ("Loss", _get("train_loss")),
        ("GPU Memory Allocated (GB)", _get("allocated_peak_mib", scale=1 / 1024, digits=3)),
    ], fixed=("Setup", "Total GPUs"))


def gpt_scaling_table(records: list[dict]) -> pd.DataFrame:
    """Seed 003's custom-model table: the trainer's figures ("Default") next to the per-step ones."""
    return _rows(records, [
        ("Setup", _setup),
        ("Total GPUs", lambda r: r["gpus"]),
        ("Samples/s (Default)", _get("train_samples_per_s", digits=3)),
        ("Samples/s (Callback)", _get("step_samples_per_s", digits=3)),
        ("GPU Memory (GB, Default)", _get("gpu0_peak_mib", scale=1 / 1024, digits=3)),
        ("GPU Memory (GB, Callback)", _get("allocated_peak_mib", scale=1 / 1024, digits=3)),
        ("GPU Utilization (%)", lambda r: None),
        ("Loss", _get("train_loss")),
        ("Runtime (s)", _get("train_runtime_s", digits=2)),
    ], fixed=("Setup", "Total GPUs"))


def weak_scaling_table(records: list[dict]) -> pd.DataFrame:
    """Seed 003's weak scaling table. Efficiency = baseline runtime / runtime × 100 (100 % = no overhead;
    the seed wrote the ratio upside down, which would grow past 100 % as runs slow down)."""
    base = records[0] if records else {}

    def efficiency(record: dict):
        ratio = _ratio(base, record, "train_runtime_s", digits=4)
        return None if ratio is None else round(100 * ratio, 1)

    return _rows(records, [
        ("GPUs", lambda r: r["gpus"]),
        ("Num Layers", _int("gpt_layers")),
        ("Per-GPU Batch", _int("per_device_batch")),
        ("Total Params", _int("total_params")),
        ("Samples/s (Callback)", _get("step_samples_per_s", digits=3)),
        ("GPU Memory (GB, Callback)", _get("allocated_peak_mib", scale=1 / 1024, digits=3)),
        ("GPU Utilization (%)", lambda r: None),
        ("Loss", _get("train_loss")),
        ("Runtime (s)", _get("train_runtime_s", digits=2)),
        ("Efficiency (%)", efficiency),
    ], fixed=("GPUs", "Num Layers", "Per-GPU Batch"))


def chapter_4_tables(results: pd.DataFrame) -> list[Table]:
    tables = []
    baseline = _group(results, "baseline")
    if baseline:
        tables.append(Table("Baseline: HF Trainer without FSDP", baseline_summary(baseline[0], fsdp=True)))
    single = _group(results, "single-gpu")
    tables.append(Table("BLOOM-560m, FSDP on one node", fsdp_scaling_table(single + _group(results, "multi-gpu"))))
    tables.append(Table("BLOOM-560m, FSDP across nodes", fsdp_scaling_table(single + _group(results, "multi-node"))))
    gpt = _group(results, "gpt")
    tables.append(Table("Custom GPT, FSDP on one node", gpt_scaling_table([r for r in gpt if r["nodes"] == 1])))
    one_gpu = [r for r in gpt if r["gpus"] == 1]
    tables.append(Table("Custom GPT, FSDP across nodes", gpt_scaling_table(one_gpu + [r for r in gpt if r["nodes"] > 1])))
    tables.append(Table("Custom GPT weak scaling by depth", weak_scaling_table(_group(results, "weak-scaling")),
                        "Efficiency (%) = runtime(2 GPUs) / runtime(N GPUs) x 100."))
    return tables


_BUILDERS = {1: chapter_1_tables, 2: chapter_2_tables, 3: chapter_3_tables, 4: chapter_4_tables}


def chapter_tables(chapter: int, runs_dir: str | Path = "runs") -> list[Table]:
    """Every seed table of a chapter, filled from `runs_dir`."""
    if chapter not in _BUILDERS:
        raise WorkshopError(f"there is no chapter {chapter}: choose 1, 2, 3 or 4")
    return _BUILDERS[chapter](chapter_results(chapter, runs_dir))


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
