"""A chapter's tables from its results (one builder per chapter), as a profile must show them (stand-in models
named as such, columns nobody recorded dropped), and as `workshop collect` prints them (markdown, CSV, JSON)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pandas as pd

from workshop_lib.book.pages.cells import NOT_RECORDED, format_cell
from workshop_lib.book.tables.columns import Table
from workshop_lib.book.tables.fsdp import chapter_4_tables
from workshop_lib.book.tables.nemo import chapter_1_tables, chapter_2_tables
from workshop_lib.book.tables.nemo_lessons import lesson_tables
from workshop_lib.book.tables.zero import chapter_3_tables
from workshop_lib.core.errors import WorkshopError
from workshop_lib.experiments import chapter_spec
from workshop_lib.results import COMPLETED, chapter_results

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


_BUILDERS = {1: chapter_1_tables, 2: chapter_2_tables, 3: chapter_3_tables, 4: chapter_4_tables}


def chapter_tables(chapter: int, runs_dir: str | Path | None = None) -> list[Table]:
    """Every seed table of a chapter, filled from `runs_dir`."""
    _check_chapter(chapter)
    return tables_from_results(chapter, chapter_results(chapter, runs_dir))


def tables_from_results(chapter: int, results: pd.DataFrame) -> list[Table]:
    """Every seed table of a chapter, filled from results already read (`results.chapter_results`)."""
    _check_chapter(chapter)
    return _BUILDERS[chapter](results) + lesson_tables(chapter, results)


def _check_chapter(chapter: int) -> None:
    chapter_spec(chapter)  # a chapter the registry does not have is an error that lists those it has
    if chapter not in _BUILDERS:
        raise WorkshopError(f"chapter {chapter} has no table builder yet: add it to _BUILDERS of {__name__}")


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
    """A GitHub table without the optional `tabulate` dependency, its numbers written as the chapter page writes
    them (`format_cell`); CSV and JSON keep the raw values."""
    header = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(format_cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *body])
