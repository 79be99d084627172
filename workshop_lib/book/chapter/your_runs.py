"""The participant's own runs on a chapter page: where they live, whether this execution may submit, the run
table (states, unreadable lines, why a run did not complete) and the chapter's tables filled from them,
titled by the profile that ran them.

Where results live: ``resolve_runs_dir`` gives one absolute folder whichever way a chapter is run
(JupyterLab, papermill from the repository root, or Jupyter Book executing it from ``notebooks/``), so a
re-run or a book build finds the runs of the first execution and submits nothing that already completed.
Set ``WORKSHOP_SUBMIT=0`` to make a chapter read results only (the book build does): it then never talks
to a scheduler. The widgets import these helpers; this module never imports the widgets.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import pandas as pd

from workshop_lib.book.chapter.selection import Selection
from workshop_lib.book.pages.html import as_html, display, explanation_block, message, scrollable, table_html
from workshop_lib.book.reference.chapter_views import reference_results
from workshop_lib.book.tables import Table, drop_unrecorded, for_stand_ins, tables_from_results
from workshop_lib.core.paths import RUNS_VARIABLE, repository_root, runs_root
from workshop_lib.core.vocabulary import DEFAULT_RECIPE
from workshop_lib.experiments import Experiment
from workshop_lib.jobs.states import DAMAGED, NOT_SUBMITTED
from workshop_lib.results import COMPLETED, chapter_results, read_run, run_note, run_record
from workshop_lib.runs import Run, explain_runs, query_runs, read_only_info
from workshop_lib.sites.profiles import Profile

SUBMIT_VARIABLE = "WORKSHOP_SUBMIT"


resolve_runs_dir = runs_root


def submitting_enabled() -> bool:
    """False when $WORKSHOP_SUBMIT is 0/false/no: the chapter only reads results that exist."""
    return os.environ.get(SUBMIT_VARIABLE, "1").strip().lower() not in ("0", "false", "no", "off")


def shown_path(path: Path) -> str:
    """A folder as a page shows it: relative to the workshop's folder when inside it (``runs/``), so a built
    book never prints the folders of the machine that built it; a folder elsewhere is named by the
    variable that chose it, else shown whole (a participant's own notebook)."""
    path = Path(path).resolve()
    try:
        return f"{path.relative_to(repository_root().resolve())}/"
    except ValueError:
        if os.environ.get(RUNS_VARIABLE) and Path(os.environ[RUNS_VARIABLE]).resolve() == path:
            return f"${RUNS_VARIABLE}"
        return str(path)


def show_run_table(runs: Sequence[Run], read_only: bool = False) -> pd.DataFrame:
    """The runs' states; under it, for each run whose files had unreadable lines, which and why, and for
    each run that ended without completing, why (state, exit code, time against the limit, the log lines
    that matter, a hint). Read-only: asks no scheduler."""
    if read_only:
        infos = [read_only_info(run) for run in runs]  # the record, else the log's footer: no scheduler
    else:
        infos = query_runs(runs)
    rows = [{"experiment": run.experiment.id, "job": run.record.job_id if run.record else "", "state": info.state,
             "note": run.note} for run, info in zip(runs, infos)]
    frame = pd.DataFrame(rows)
    display(as_html(scrollable(frame.to_html(index=False, border=0, classes="workshop-runs"))))
    for run in runs:  # a damaged line costs a value or a sample; say which, once per run
        unreadable = read_run(run.directory, run.experiment.id).unreadable
        if unreadable:
            message(run_note(run.experiment.id, [lines.note() for lines in unreadable]), "warning")
    if read_only:
        unfinished = sum(info.state != COMPLETED for info in infos)
        if unfinished:
            message(f"{unfinished} run(s) have no completed result on disk; execute the chapter with "
                    f"{SUBMIT_VARIABLE}=1 (the default) to run them.", "warning")
        return frame
    failed = [(run, info) for run, info in zip(runs, infos)
              if run.record is not None and info.finished and info.state != COMPLETED]
    for (run, _), explanation in zip(failed, explain_runs(failed)):
        display(as_html(explanation_block(run.experiment.id, explanation.text())))
    for run in runs:
        if run.damage:
            message(run.damage, "error")
    active = [info for info in infos if not info.finished and info.state not in (NOT_SUBMITTED, DAMAGED)]
    if failed:
        message(f"{len(failed)} run(s) ended without completing: why is shown above. Fix the cause and re-run this "
                "cell: those runs are submitted again, completed ones are reused.", "error")
    if active:
        message(f"{len(active)} run(s) are still queued or running (or the scheduler did not answer): their table "
                "cells show the state instead of numbers. Re-run this cell later; nothing is submitted twice.",
                "warning")
    return frame


def chapter_results_for(selection: Selection, runs_dir: Path | str | None = None) -> pd.DataFrame:
    """The chapter's results restricted to the selection's runnable experiments.

    Rows keep the matrix's ids (a tuned run's ``-tuned`` is dropped), so the seeds' tables fill the same
    way whichever recipe ran; the ``recipe`` column says which one did."""
    root = resolve_runs_dir(runs_dir)
    if not selection.runnable:
        return chapter_results(selection.chapter, root).iloc[0:0]
    return results_frame([run_record(experiment, root) for experiment in selection.runnable], selection.runnable)


def results_frame(records: Sequence[dict], experiments: Sequence[Experiment]) -> pd.DataFrame:
    """Rows of `experiments` (one each, in order) as the tables read them: ids without a recipe's suffix."""
    results = pd.DataFrame(list(records))
    suffixes = {experiment.id: f"-{experiment.recipe}" for experiment in experiments
                if experiment.recipe != DEFAULT_RECIPE}
    results["id"] = [i.removesuffix(suffixes.get(i, "")) for i in results["id"]]
    return results


def selection_tables(selection: Selection, runs_dir: Path | str | None = None,
                     results: pd.DataFrame | None = None) -> list[Table]:
    """The seeds' tables of the chapter, one row (or column) per runnable experiment of the selection;
    from ``results`` when the caller already read them (`chapter_results_for`), else from the run folders."""
    results = chapter_results_for(selection, runs_dir) if results is None else results
    built = tables_from_results(selection.chapter, results)
    return [table for table in built if not table.frame.empty and len(table.frame.columns) > 1]


def show_tables(selection: Selection, runs_dir: Path | str | None = None, keys: Sequence[str] | None = None,
                results: pd.DataFrame | None = None) -> list[Table]:
    """The seed tables of the chapter filled from your runs (those of part ``keys``, or all), titled by the
    profile that ran them; a clear note when nothing completed. ``results``: as in `selection_tables`."""
    results = chapter_results_for(selection, runs_dir) if results is None else results
    profile = selection.profile
    if results.empty or not (results["state"] == COMPLETED).any():
        above = (" The reference above is what these runs measured on real GPUs."
                 if reference_results(selection.chapter) is not None else "")
        message(f"Your runs ({profile_title(profile)}): No completed run of chapter {selection.chapter} in "
                f"{shown_path(resolve_runs_dir(runs_dir))} yet, so there is nothing of yours to show here.{above} Execute the "
                f"submission cell (or `workshop submit --chapter {selection.chapter} --profile {profile.name}`) and "
                "run this cell again.", "note")
        return []
    tables = [for_profile(table, profile) for table in selection_tables(selection, runs_dir, results)
              if keys is None or table.key in keys]
    for table in tables:
        titled = replace(table, title=f"{table.title} — your runs ({profile.name})")
        display(as_html(table_html(titled, kind="participant", caption=f"Your runs — {profile_title(profile)}",
                                   profile=profile.name)))
    return tables


def for_profile(table: Table, profile: Profile) -> Table:
    """As a reader must see a table of this profile: stand-in models named as such, no all-n/a columns."""
    return drop_unrecorded(for_stand_ins(table, profile))


def profile_title(profile: Profile) -> str:
    """How a table of this profile is titled: "tiny CPU stand-in", "ibex (KAUST Ibex A100 nodes, …)"."""
    if profile.name == "tiny":
        return "tiny CPU stand-in: tiny random models, synthetic data, a few steps on CPU processes"
    return f"profile {profile.name}: {profile.description}"
