"""A chapter's runs read into one table (one row per experiment), and the notes that go with it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import pandas as pd

from workshop_lib.core.run_directory import RunDirectory
from workshop_lib.experiments import Experiment, chapter_experiments, nemo_lesson_experiments
from workshop_lib.jobs.states import MISSING
from workshop_lib.results.read import RunResult, read_run


def run_record(experiment: Experiment, runs_dir: str | Path | None = None) -> dict:
    """One flat row: the experiment's fields (gpt shape as gpt_*), `gpus`, then every RunResult field."""
    return record_of(experiment, read_run(RunDirectory.of(experiment.id, runs_dir).path, experiment.id))


def record_of(experiment: Experiment, result: RunResult) -> dict:
    """The flat row of `run_record` for a result already read (one's own run, or a run the class pooled)."""
    row = {key: value for key, value in experiment.to_dict().items() if key != "gpt"}
    shape = experiment.gpt
    for key, value in (asdict(shape) if shape else {}).items():
        row[f"gpt_{key}"] = value
    row["gpus"] = experiment.gpus
    row.update({key: value for key, value in asdict(result).items() if key not in ("experiment_id", "unreadable")})
    row["unreadable_notes"] = [lines.note() for lines in result.unreadable]  # text: rows go to JSON as they are
    return row


def run_note(experiment_id: str, notes: Sequence[str]) -> str:
    """One run's line: `<experiment id>: N lines of <file> could not be read: …`, a note per file."""
    return f"{experiment_id}: {' '.join(notes)}"


def unreadable_notes(results: pd.DataFrame) -> list[str]:
    """A `run_note` for each run of the results whose files had unreadable lines."""
    if "unreadable_notes" not in results:
        return []  # results read elsewhere (book/reference) before lines were reported
    return [run_note(row["id"], notes) for row in results.to_dict("records")
            if isinstance(notes := row["unreadable_notes"], list) and notes]


def chapter_results(chapter: int, runs_dir: str | Path | None = None) -> pd.DataFrame:
    """One row per experiment of the chapter, in the order of its matrix, missing runs included; then the
    chapter's NeMo lessons beyond the matrix (the packed twin, reduced depth) that were run."""
    rows = [run_record(experiment, runs_dir) for experiment in chapter_experiments(chapter)]
    lessons = [run_record(experiment, runs_dir) for experiment in nemo_lesson_experiments() if experiment.chapter == chapter]
    return pd.DataFrame(rows + [row for row in lessons if row["state"] != MISSING])
