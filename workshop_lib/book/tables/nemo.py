"""Chapters 1 and 2: seed 000/001's NeMo scaling tables, one per model (the LoRA/TP stand-in engines on the
tiny profile fill the same columns from metrics.jsonl)."""

from __future__ import annotations

import pandas as pd

from workshop_lib.book.pages.cells import completed, is_missing
from workshop_lib.book.tables.columns import (
    TENSOR_COLUMNS,
    Column,
    Table,
    field,
    group_records,
    present,
    ratio,
    row_table,
    total_time_hms,
    utilization,
    utilization_note,
)


def _gpu0_peak(record: dict):
    """GPU 0's nvidia-smi peak; without a GPU log (tiny profile, CPU), rank 0's peak from the engine."""
    value = field("gpu0_peak_mib")(record)
    return value if value is not None else field("rank0_peak_mib", digits=1)(record)


def _gpu0_peak_ratio(base: dict, record: dict) -> float | None:
    """peak_base / peak_N, both from the same source (nvidia-smi, or both from the engine)."""
    for key in ("gpu0_peak_mib", "rank0_peak_mib"):
        if present(base, key) and present(record, key):
            return ratio(base, record, key)
    return None


def scaling_baseline(records: list[dict]) -> dict | None:
    """The run the ratios divide by: the completed run on the fewest GPUs (the smallest layout that ran)."""
    done = [record for record in records if completed(record)]
    return min(done, key=lambda record: (record["gpus"], record["id"])) if done else None


def _mean_step_time(record: dict):
    """The mean step time where the run recorded it, else its last step's (older runs)."""
    value = field("mean_step_time_s", digits=3)(record)
    return value if value is not None else field("train_step_time_s", digits=3)(record)


def layout_text(tp: int, pp: int, ep: int, dp: int, sp: bool) -> str:
    """A Megatron layout as chapter 2 names it: the dense part TP x PP x DP, whose product is the GPU count, and
    EP carved out of DP, not multiplied in: "TP 2 x PP 4 x DP 2 (EP 2 within DP) + SP" on 16 GPUs."""
    parts = [f"TP {tp}"] + ([f"PP {pp}"] if pp > 1 else []) + ([f"DP {dp}"] if dp > 1 else [])
    return (" x ".join(parts) + (f" (EP {ep} within DP)" if ep > 1 else "") + (" + SP" if sp else ""))


def layout_name(record: dict) -> str:
    """The parallel layout of a NeMo run (`layout_text`): TP x PP x DP, EP within DP, + SP."""
    tp, pp = int(record.get("tensor_parallel") or 1), int(record.get("pipeline_parallel") or 1)
    ep = record.get("expert_parallel")
    ep = 1 if is_missing(ep) else int(ep)
    return layout_text(tp, pp, ep, record["gpus"] // (tp * pp), bool(record.get("sequence_parallel")))


NOT_APPLICABLE = "—"  # a ratio this row does not have (another GPU count), unlike "n/a" (not recorded)


def _same_gpus_as_base(base: dict, record: dict) -> bool:
    return bool(base) and record is not base and record["gpus"] == base["gpus"] and completed(record)


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
        ("Total job time (HH:MM:SS)", total_time_hms),
        # The mean over the logged steps (the first left out), not the last step: one step is noisy.
        ("Train step time (s)", _mean_step_time),
        ("Last reduced_train_loss", field("last_loss", digits=4)),
        ("GPU 0 Peak (MiB)", _gpu0_peak),
        ("GPU 0 Avg (MiB)", field("gpu0_avg_mib", digits=2)),
        ("GPU 0 Mode (MiB)", field("gpu0_mode_mib")),
        (f"Time scaling vs {unit}", lambda r: scaling(r, lambda: ratio(base, r, "total_time_s"))),
        (f"Peak memory scaling vs {unit}", lambda r: scaling(r, lambda: _gpu0_peak_ratio(base, r))),
        ("GPU 0 Utilization (%)", utilization),
        *TENSOR_COLUMNS,  # what LoRA and tensor parallelism leave on each rank, counted by the stand-in engines
    ]

    def scaling(record: dict, value):
        # Two runs on the same GPUs (two layouts, or one run packed and one not) are not a scaling step:
        # their comparison has columns of its own.
        if _same_gpus_as_base(base, record):
            return NOT_APPLICABLE
        return value() if base else None

    if layout:  # chapter 2: two layouts share a GPU count, so the rows need their names
        columns.insert(0, ("Layout", layout_name))
    if any(_same_gpus_as_base(base, record) for record in records):
        if not layout:  # chapter 1's rows are named by their GPUs alone: name the ones that share a count
            columns.insert(0, ("Run", lambda r: r["id"]))
        name = _run_name(base, layout)
        at = [column for column, _ in columns].index("GPU 0 Utilization (%)")
        columns[at:at] = [
            (f"Step time vs {name} (same GPUs)",
             lambda r: ratio(r, base, "mean_step_time_s") if r["gpus"] == base["gpus"] else NOT_APPLICABLE),
            (f"Peak memory vs {name} (same GPUs)",
             lambda r: ratio(r, base, "gpu0_peak_mib") if r["gpus"] == base["gpus"] else NOT_APPLICABLE)]
    return row_table(records, columns, fixed=("Run", "Layout", "GPUs", "Batch per GPU"))


def _run_name(record: dict, layout: bool) -> str:
    return layout_name(record) if layout else record["id"]


_CPU_PEAK_NOTE = (" Runs without an nvidia-smi log (the tiny profile on CPUs) show rank 0's peak resident set "
                  "size from metrics.jsonl in the GPU 0 Peak column: a whole process, Python and torch included.")


def _nemo_note(records: list[dict], text: str) -> str:
    uses_engine_peak = any(completed(r) and not present(r, "gpu0_peak_mib") and present(r, "rank0_peak_mib")
                           for r in records)
    return text + (_CPU_PEAK_NOTE if uses_engine_peak else "") + utilization_note(records)


def _baseline_note(records: list[dict], layout: bool = False) -> str:
    """Which run the ratios divide by, or why the ratio columns are empty."""
    base = scaling_baseline(records)
    step = " Train step time: the mean of the logged steps, the first left out."
    if base is None:
        return "No run of this table has completed yet, so the ratio columns stay empty." + step
    text = (f"Ratios are against the smallest layout that completed: {base['id']} ({base['gpus']} GPU"
            f"{'s' if base['gpus'] > 1 else ''}). Time scaling = time(baseline) / time(N GPUs), from the total job "
            "time; memory scaling = GPU 0 peak(baseline) / GPU 0 peak(N GPUs).")
    same = [r for r in records if _same_gpus_as_base(base, r)]
    if same:
        base_name = _run_name(base, layout)
        what = "a choice of layout" if layout else "another way to run the same GPUs"
        text += (f" {', '.join(_run_name(r, layout) for r in same)} ran on as many GPUs as {base_name}: that is "
                 f"{what}, not a step of scaling, so its scaling cells stay empty and the 'same GPUs' columns give "
                 f"its mean step time and GPU 0 peak as multiples of {base_name}'s (below 1: faster, or less "
                 "memory).")
    return text + step


def _timed(record: dict) -> bool:
    """A total job time to divide by: the footer counts whole seconds, so a job shorter than one reads 0."""
    return present(record, "total_time_s") and record["total_time_s"] > 0


def _above_ideal_note(records: list[dict]) -> str:
    """Where the time scaling beats the GPU ratio, which more GPUs cannot do: say what it is."""
    base = scaling_baseline(records)
    if base is None or not _timed(base):
        return ""
    above = [r for r in records if completed(r) and r is not base and r["gpus"] != base["gpus"] and _timed(r)
             and base["total_time_s"] / r["total_time_s"] > r["gpus"] / base["gpus"]]
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
        records = group_records(results, group)
        note = _nemo_note(records, _baseline_note(records, layout) + _above_ideal_note(records))
        tables.append(Table(title, nemo_scaling_table(records, layout=layout), note, group))
    return tables


def chapter_1_tables(results: pd.DataFrame) -> list[Table]:
    return _nemo_tables(results, {"llama": "Llama 3.1 8B + LoRA, data parallel",
                                  "mixtral": "Mixtral 8x7B + LoRA, data parallel"})


def chapter_2_tables(results: pd.DataFrame) -> list[Table]:
    return _nemo_tables(results, {"llama": "Llama 3.1 8B, tensor parallel",
                                  "mixtral": "Mixtral 8x7B, tensor x expert parallel"}, layout=True)
