"""NeMo's own lessons beside the seeds' tables (experiments.nemo_lesson_experiments): sequence packing on one GPU
(chapter 1) and Mixtral's parallel factors at reduced depth (chapter 2). A table appears only where its runs
exist (NeMo itself ran them; no stand-in can), and compares rows of one engine on one card only."""

from __future__ import annotations

import pandas as pd

from workshop_lib.book.pages.cells import completed, is_missing
from workshop_lib.book.tables.columns import Column, Table, field, group_records, row_table, utilization
from workshop_lib.book.tables.nemo import layout_name

PACKING_GROUP, UNPACKED_ID = "llama-packing", "lora/llama/1-gpu"
REDUCED_GROUP = "mixtral-reduced"


def _one_series(records: list[dict]) -> bool:
    """Every completed record ran on the same engine and the same card (where they say which)."""
    done = [record for record in records if completed(record)]
    for key in ("run_engine", "run_gpu"):
        if len({record.get(key) for record in done if not is_missing(record.get(key))}) > 1:
            return False
    return True


def _records(results: pd.DataFrame, group: str) -> list[dict]:
    return [] if results.empty or "group" not in results else group_records(results, group)


def _tokens_per_s(record: dict):
    value = record.get("tokens_per_s")
    return None if is_missing(value) else round(float(value))


def packing_rows(results: pd.DataFrame) -> list[dict]:
    """The packed 1-GPU run and the unpacked run of the same engine and card, unpacked first: [] unless both are
    there (a reference file also holds the unpacked experiment's stand-in rows, which never pair with NeMo's)."""
    packed = _records(results, PACKING_GROUP)[:1]
    if not packed:
        return []
    twins = [record for record in results.to_dict("records") if record.get("id") == UNPACKED_ID
             and all(record.get(key) == packed[0].get(key) for key in ("run_engine", "run_gpu"))]
    return twins[:1] + packed if twins else []


def packing_speedup(records: list[dict]) -> float | None:
    """Packed tokens/s ÷ unpacked tokens/s, when both runs completed on one engine and card."""
    if len(records) != 2 or not all(completed(r) for r in records) or not _one_series(records):
        return None
    unpacked, packed = (_tokens_per_s(r) for r in records)
    return packed / unpacked if unpacked and packed else None


def packing_table(results: pd.DataFrame) -> Table | None:
    records = packing_rows(results)
    if not records:
        return None
    columns: list[Column] = [
        ("Run", lambda r: "packed to 2,048 tokens" if r.get("packed_sequence") else "one record per micro-batch"),
        ("Real tokens per step", field("tokens_per_step")),
        ("Mean step time (s)", field("mean_step_time_s", digits=3)),
        ("Tokens/s", _tokens_per_s),
        ("Last reduced_train_loss", field("last_loss", digits=4)),
        ("GPU 0 Peak (MiB)", field("gpu0_peak_mib")),
        ("GPU 0 Utilization (%)", utilization),
    ]
    speedup = packing_speedup(records)
    note = ("Real tokens: a record's tokens before padding (one record per micro-batch), or a pack's records "
            "together (packed). Both rows: the same recipe, 8 sequences per optimizer step, on one GPU of one "
            "machine in one sitting.")
    if speedup is not None:
        note += f" Packing trains on {speedup:.1f}x the tokens per second."
    elif not _one_series(records):
        note += " The two runs were not made on the same engine and card: no ratio is formed."
    return Table("Llama 3.1 8B + LoRA on 1 GPU: sequence packing", row_table(records, columns, fixed=("Run",)),
                 note, PACKING_GROUP)


def reduced_mixtral_table(results: pd.DataFrame) -> Table | None:
    records = _records(results, REDUCED_GROUP)
    if not records:
        return None
    columns: list[Column] = [
        ("Layout", layout_name),
        ("GPUs", lambda r: r["gpus"]),
        ("Layers", lambda r: r.get("num_layers")),
        ("Mean step time (s)", field("mean_step_time_s", digits=3)),
        ("Last reduced_train_loss", field("last_loss", digits=4)),
        ("GPU 0 Peak (MiB)", field("gpu0_peak_mib")),
        ("Peak of any GPU (MiB)", field("gpu_peak_max_mib")),
        ("GPU 0 Utilization (%)", utilization),
    ]
    note = ("Mixtral 8x7B's full width (hidden 4,096, 8 experts of 14,336, 32 heads) with 4 of its 32 layers, so "
            "that the chapter's parallel factors run on 4 GPUs: every tensor-parallel all-reduce, expert all-to-all "
            "and pipeline transfer has its real size, but there are 8x fewer of them per step than in the model. "
            "These are not the chapter's 16-GPU layouts and their times are not theirs.")
    if not _one_series(records):
        note += " The rows come from different engines or cards: compare them with care."
    return Table("Mixtral 8x7B width at reduced depth (4 of 32 layers), full fine-tune, 4 GPUs",
                 row_table(records, columns, fixed=("Layout", "GPUs", "Layers")), note, REDUCED_GROUP)


def lesson_tables(chapter: int, results: pd.DataFrame) -> list[Table]:
    """The lesson tables of a chapter that have runs to show (none for chapters 3-4)."""
    builders = {1: (packing_table,), 2: (reduced_mixtral_table,)}.get(chapter, ())
    return [table for table in (build(results) for build in builders) if table is not None]
