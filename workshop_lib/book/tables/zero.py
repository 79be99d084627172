"""Chapter 3 (DeepSpeed ZeRO): seed 002's tables: the baseline, ZeRO stages on one GPU, multi-GPU and multi-node
weak scaling, and the 2-GPU stage comparisons with and without CPU offload."""

from __future__ import annotations

import pandas as pd

from workshop_lib.book.tables.columns import (
    ALLOCATED_COLUMN,
    TENSOR_COLUMNS,
    Column,
    Table,
    field,
    group_records,
    metric_table,
    ratio,
    row_table,
    step_time_key,
    step_time_label,
    utilization,
    utilization_note,
    weak_efficiency,
)
from workshop_lib.book.tables.summary import baseline_summary, memory_prediction_table


def _submit(record: dict) -> str:
    """The command that submits this experiment (the seeds' "Submit Job" cells held an sbatch line)."""
    return f"workshop submit {record['id']}"


def _title(record: dict) -> str:
    return record.get("title") or record.get("id")


def _weak_scaling_rows(reference: dict | None, unit: str, records: list[dict]) -> list[Column]:
    """Derived rows of seed 002's weak-scaling tables: efficiency from the per-step time against the reference."""
    key = step_time_key(records + ([reference] if reference else []))
    return [
        ("Train Runtime (s)", field("train_runtime_s", digits=2)),
        (step_time_label(key), field(key, digits=3)),
        (f"Throughput Scaling vs {unit}",
         lambda r: ratio(r, reference, "train_samples_per_s") if reference else None),
        (f"Weak Scaling Efficiency vs {unit} (%)", weak_efficiency(reference, key)),
    ]


def chapter_3_tables(results: pd.DataFrame) -> list[Table]:
    tables = []
    baseline = group_records(results, "baseline")
    if baseline:
        tables.append(Table("Baseline: HF Trainer without DeepSpeed", baseline_summary(baseline[0]), key="baseline"))
    single = group_records(results, "single-gpu")
    tables.append(Table("ZeRO stages on one GPU (with and without CPU offload)", row_table(single, [
        ("DeepSpeed Config", _title),
        ("Submit Training Job", _submit),
        ("Peak GPU Memory Used (MiB)", field("gpu0_peak_mib")),
        ("Average GPU Memory Used (MiB)", field("gpu0_avg_mib", digits=2)),
        ("GPU Utilization (%)", utilization),
        ALLOCATED_COLUMN, *TENSOR_COLUMNS,
        ("Peak CPU Memory Used (MiB)", field("cpu_peak_mib", digits=2)),
        ("Average CPU Memory Used (MiB)", field("cpu_avg_mib", digits=2)),
        ("Train Samples/Second", field("train_samples_per_s", digits=3)),
    ], fixed=("DeepSpeed Config", "Submit Training Job")),
        "Peak GPU memory: nvidia-smi on GPU 0 (CUDA context and allocator cache included); peak allocated: "
        "the tensors PyTorch's allocator handed out during the training steps (torch.cuda.max_memory_allocated, "
        "reset at each step; evaluation and answer generation left out)." + utilization_note(single),
        key="single-gpu"))
    gpu_metrics: list[Column] = [
        ("Submit Job", _submit),
        ("Train Samples/sec", field("train_samples_per_s", digits=3)),
        ("Train Loss", field("train_loss", digits=4)),
        ("Peak GPU Memory (MiB)", field("gpu0_peak_mib")),
        ("Average GPU Memory (MiB)", field("gpu0_avg_mib", digits=2)),
        ("Mode for GPU Memory (MiB)", field("gpu0_mode_mib")),
        ("GPU Utilization (%)", utilization),
        ALLOCATED_COLUMN, *TENSOR_COLUMNS,
    ]
    cpu_metrics: list[Column] = [
        ("Peak CPU Memory (MiB)", field("cpu_peak_mib", digits=2)),
        ("Average CPU Memory (MiB)", field("cpu_avg_mib", digits=2)),
        ("Mode for CPU Memory (MiB)", field("cpu_mode_mib")),
    ]
    multi = group_records(results, "multi-gpu")
    # Equal work per GPU: the one-GPU ZeRO-0 run has the same recipe (stage 0, 500 samples on its GPU).
    one_gpu = next((r for r in single if r.get("zero_stage") == 0 and not r.get("offload")), None)
    tables.append(Table("Multi-GPU weak scaling (500 samples per GPU)",
                        metric_table(multi, [f"{r['gpus']} GPUs" for r in multi],
                                     gpu_metrics + _weak_scaling_rows(one_gpu, "1 GPU", multi), fixed=("Submit Job",)),
                        "Weak scaling: every GPU trains on as many samples as the one-GPU ZeRO-0 run, so "
                        "efficiency = step time(1 GPU) / step time(N GPUs) x 100 (100 % = no overhead) and "
                        "throughput scaling = samples/s(N GPUs) / samples/s(1 GPU) (ideal: N)."
                        + utilization_note(multi),
                        key="multi-gpu"))
    two = group_records(results, "two-gpus")
    for offload in (False, True):
        runs = [r for r in two if bool(r["offload"]) == offload]
        tables.append(Table(f"2-GPU ZeRO stage comparison, {'with' if offload else 'without'} CPU offload",
                            metric_table(runs, [f"Stage {int(r['zero_stage'])}" for r in runs],
                                         gpu_metrics + cpu_metrics, fixed=("Submit Job",)),
                            utilization_note(runs).strip(), key="two-gpus"))
    nodes = group_records(results, "multi-node")
    node_metrics: list[Column] = [
        ("Submit Job", _submit),
        ("Train Samples/sec", field("train_samples_per_s", digits=3)),
        ("Train Loss", field("train_loss", digits=4)),
        ("Peak GPU Memory (GiB)", field("gpu0_peak_mib", scale=1 / 1024, digits=2)),
        ("Average GPU Memory (GiB)", field("gpu0_avg_mib", scale=1 / 1024, digits=2)),
        ("Mode for GPU Memory (MiB)", field("gpu0_mode_mib")),
        ("GPU Utilization (%)", utilization),
        *TENSOR_COLUMNS,
    ]
    tables.append(Table("Multi-node weak scaling (250 samples per GPU)",
                        metric_table(nodes, [f"{r['nodes']} nodes" for r in nodes],
                                     node_metrics + _weak_scaling_rows(nodes[0] if nodes else None, "2 nodes", nodes),
                                     fixed=("Submit Job",)),
                        "Efficiency = step time(2 nodes) / step time(N nodes) x 100: 250 samples per GPU everywhere."
                        + utilization_note(nodes), key="multi-node"))
    tables.append(memory_prediction_table(results, reference_id="zero/baseline"))
    return tables
