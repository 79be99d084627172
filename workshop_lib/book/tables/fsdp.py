"""Chapter 4 (FSDP): seed 003's tables: the baseline, the sharding strategies, BLOOM-560m and the custom GPT on
one node and across nodes, and the custom GPT's weak scaling by depth. What ran decides whether a scaling table
reads as strong scaling (full epochs over a fixed data set) or weak scaling (a fixed number of steps)."""

from __future__ import annotations

from typing import Callable

import pandas as pd

from workshop_lib.book.pages.cells import completed
from workshop_lib.book.tables.columns import (
    GB,
    GB_NOTE,
    TENSOR_COLUMNS,
    Column,
    Table,
    capped_steps,
    cuda_allocated_gb,
    field,
    group_records,
    int_field,
    ran_fixed_steps,
    ratio,
    row_table,
    run_setting,
    samples_per_gpu,
    step_time_key,
    step_time_label,
    utilization,
    utilization_note,
    weak_efficiency,
)
from workshop_lib.book.tables.summary import baseline_summary, memory_prediction_table


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
        speedup = ratio(base, record, "train_runtime_s", digits=6)
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
    return [(step_time_label(key), field(key, digits=3)), ("Weak Scaling Efficiency (%)", weak_efficiency(base, key))]


def scaling_note(records: list[dict]) -> str:
    """The note under a chapter 4 scaling table, saying which kind of scaling its rows measured."""
    return _scaling_kind(records) + utilization_note(records) + GB_NOTE


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
    return row_table(records, [
        ("Setup", setup),
        ("Total GPUs", lambda r: r["gpus"]),
        ("Samples/s", field("train_samples_per_s", digits=3)),
        ("Samples/s Scale Factor", lambda r: ratio(r, base, "train_samples_per_s")),
        ("Runtime (s)", field("train_runtime_s", digits=2)),
        ("Runtime Scale Factor", lambda r: ratio(base, r, "train_runtime_s")),
        ("Loss", field("train_loss", digits=4)),
        ("GPU Memory Allocated (GB)", cuda_allocated_gb),
        ("GPU Utilization (%)", utilization),
        *_scaling_columns(records, base, [("Parallel Efficiency (%)", _parallel_efficiency(base))]),
        *TENSOR_COLUMNS,
    ], fixed=("Setup", "Total GPUs"))


def gpt_scaling_table(records: list[dict]) -> pd.DataFrame:
    """Seed 003's custom-model table: the trainer's figures ("Default") next to the per-step ones, then the
    derived columns of what ran (`_scaling_columns`) and the tensor bytes per rank."""
    base = records[0] if records else {}
    return row_table(records, [
        ("Setup", _setup),
        ("Total GPUs", lambda r: r["gpus"]),
        ("Samples/s (Default)", field("train_samples_per_s", digits=3)),
        ("Samples/s (Callback)", field("step_samples_per_s", digits=3)),
        ("GPU Memory (GB, Default)", field("gpu0_peak_mib", scale=GB, digits=3)),
        ("GPU Memory (GB, Callback)", cuda_allocated_gb),
        ("GPU Utilization (%)", utilization),
        ("Loss", field("train_loss", digits=4)),
        ("Runtime (s)", field("train_runtime_s", digits=2)),
        *_scaling_columns(records, base, [("Speedup", lambda r: ratio(base, r, "train_runtime_s")),
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
    return row_table(records, [
        ("GPUs", lambda r: r["gpus"]),
        ("Num Layers", int_field("gpt_layers")),
        ("Per-GPU Batch", int_field("per_device_batch")),
        ("Total Params", int_field("total_params")),
        ("Samples/s (Callback)", field("step_samples_per_s", digits=3)),
        ("GPU Memory (GB, Callback)", cuda_allocated_gb),
        ("GPU Utilization (%)", utilization),
        ("Loss", field("train_loss", digits=4)),
        ("Runtime (s)", field("train_runtime_s", digits=2)),
        ("Efficiency (%)", weak_efficiency(base, key)),
        (step_time_label(key), field(key, digits=3)),
        *TENSOR_COLUMNS,
    ], fixed=("GPUs", "Num Layers", "Per-GPU Batch"))


def _shard_group(record: dict):
    """Over how many ranks FSDP really sharded (what the engine recorded), else n/a."""
    return run_setting(record, "fsdp_shard_group")


def fsdp_strategy_table(records: list[dict]) -> pd.DataFrame:
    """The strategy comparison on 2 nodes x 2 GPUs: speed, GPU memory and host memory side by side."""
    return row_table(records, [
        ("Strategy", lambda r: r.get("fsdp")),
        ("CPU Offload", lambda r: "yes" if r.get("offload") else "no"),
        ("Nodes x GPUs", lambda r: f"{int(r['nodes'])} x {int(r['gpus_per_node'])}"),
        ("Shard Group (ranks)", _shard_group),
        ("Samples/s", field("train_samples_per_s", digits=3)),
        ("Train Step (s)", field("train_step_time_s", digits=3)),
        ("Runtime (s)", field("train_runtime_s", digits=2)),
        ("GPU Memory Allocated (GB)", cuda_allocated_gb),
        ("GPU Utilization (%)", utilization),
        *TENSOR_COLUMNS,
        ("Peak CPU Memory (GB)", field("cpu_peak_mib", scale=GB, digits=2)),
        ("Loss", field("train_loss", digits=4)),
    ], fixed=("Strategy", "CPU Offload", "Nodes x GPUs"))


def chapter_4_tables(results: pd.DataFrame) -> list[Table]:
    tables = []
    baseline = group_records(results, "baseline")
    if baseline:
        tables.append(Table("Baseline: HF Trainer without FSDP", baseline_summary(baseline[0], fsdp=True),
                            key="baseline"))
    strategies = group_records(results, "strategies")
    if strategies:
        tables.append(Table("FSDP sharding strategies, 2 nodes x 2 GPUs", fsdp_strategy_table(strategies),
                            "Same model, data and steps for every row. Shard Group: the ranks each parameter "
                            "is split over, as the engine recorded it (HYBRID_SHARD: the GPUs of one node)."
                            + utilization_note(strategies), key="strategies"))
    single = group_records(results, "single-gpu")
    one_node = single + group_records(results, "multi-gpu")
    nodes = group_records(results, "multi-node")
    across = single + nodes if nodes else []  # the one-GPU row alone is no comparison across nodes
    tables.append(Table("BLOOM-560m, FSDP on one node", fsdp_scaling_table(one_node), scaling_note(one_node),
                        key="multi-gpu"))
    tables.append(Table("BLOOM-560m, FSDP across nodes", fsdp_scaling_table(across, setup=_node_setup),
                        scaling_note(across), key="multi-node"))
    gpt = group_records(results, "gpt")
    gpt_node = [r for r in gpt if r["nodes"] == 1]
    gpt_nodes = [r for r in gpt if r["nodes"] > 1]
    gpt_across = [r for r in gpt if r["gpus"] == 1] + gpt_nodes if gpt_nodes else []
    tables.append(Table("Custom GPT, FSDP on one node", gpt_scaling_table(gpt_node), scaling_note(gpt_node),
                        key="gpt"))
    tables.append(Table("Custom GPT, FSDP across nodes", gpt_scaling_table(gpt_across), scaling_note(gpt_across),
                        key="gpt-multi-node"))
    depth = group_records(results, "weak-scaling")
    tables.append(Table("Custom GPT weak scaling by depth", weak_scaling_table(depth),
                        f"Efficiency (%) = step time(2 GPUs) / step time(N GPUs) x 100, from the "
                        f"{step_time_label(step_time_key(depth)).lower().removesuffix(' (s)')}."
                        + utilization_note(depth) + GB_NOTE, key="weak-scaling"))
    tables.append(memory_prediction_table(results, reference_id="fsdp/baseline"))
    return tables
