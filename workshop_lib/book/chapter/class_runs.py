"""The class's runs on a chapter page: every participant's published results in the chapter's tables.

On the workshop day each participant runs part of a chapter; `show_class_results` publishes their completed
runs to the class folder (`workshop_lib.sites.class_folder` says where it is) and shows the chapter's tables
filled from everyone's. Where several participants ran one experiment, its row is the run with the median total
job time (one slow node or one made-up number does not set the row); a table of who ran what says whose row is
shown. A file of the pool that fails a check is named in one line and left out (`results.class_pool`). Where
the class has no folder (a participant alone, the book build) the cell says so in one note and does nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import pandas as pd

from workshop_lib.book.chapter.selection import Selection, select
from workshop_lib.book.chapter.your_runs import (
    for_profile,
    profile_title,
    resolve_runs_dir,
    results_frame,
    submitting_enabled,
)
from workshop_lib.book.pages.html import as_html, display, message, scrollable, table_html
from workshop_lib.book.tables import Table, tables_from_results
from workshop_lib.core.vocabulary import DEFAULT_RECIPE
from workshop_lib.experiments import Experiment, chapter_experiments
from workshop_lib.results import record_of
from workshop_lib.results.class_pool import Pool, PooledRun, PoolError, publish, published_rows, read_pool
from workshop_lib.results.read import MISSING, RunResult
from workshop_lib.sites.class_folder import CLASS_DIR_VARIABLE, class_folder_of
from workshop_lib.sites.profiles import ProfileError

SHOWN_PROBLEMS = 20  # lines about skipped files; the rest are counted


@dataclass(frozen=True)
class ClassResults:
    """A chapter's class table input: one record per experiment, and who ran what."""

    results: pd.DataFrame  # as `your_runs.chapter_results_for` gives them, one row per experiment
    who: pd.DataFrame  # experiment, runs pooled, participants, row shown from
    pool: Pool


def whole_chapter(selection: Selection) -> Selection:
    """The chapter's every experiment the selection's profile runs, on its recipe: the class fills all of it,
    whatever part this participant chose (each named, so runs a class leaves to the instructor count too)."""
    recipe = next((e.recipe for e in selection.chosen if e.recipe != DEFAULT_RECIPE), DEFAULT_RECIPE)
    every = [experiment.id for experiment in chapter_experiments(selection.chapter)]
    return select(selection.chapter, selection.profile, every, recipe)


def representative(runs: Sequence[PooledRun]) -> PooledRun:
    """The run whose total job time is the (lower) median of the runs that recorded one, else the first by user."""
    timed = sorted((run for run in runs if run.result.total_time_s is not None),
                   key=lambda run: (run.result.total_time_s, run.user))
    if timed:
        return timed[(len(timed) - 1) // 2]
    return min(runs, key=lambda run: run.user)


def class_results(pool: Pool, experiments: Sequence[Experiment]) -> ClassResults:
    """One record per experiment from the pool (MISSING where nobody published it), and who ran what."""
    records, who = [], []
    for experiment in experiments:
        runs = [run for run in pool.runs if run.experiment.id == experiment.id]
        chosen = representative(runs) if runs else None
        result = chosen.result if chosen else RunResult(experiment_id=experiment.id, state=MISSING)
        records.append(record_of(experiment, result))
        who.append({"experiment": experiment.id, "runs pooled": len(runs),
                    "participants": ", ".join(sorted({run.user for run in runs})),
                    "row shown from": chosen.user if chosen else ""})
    return ClassResults(results_frame(records, experiments), pd.DataFrame(who), pool)


def publish_own(selection: Selection, folder: Path, runs_dir: Path | str | None = None) -> tuple[Path | None, int]:
    """Publish this participant's completed runs of the whole chapter on this profile: (file, rows). With none
    completed nothing is written (None, 0), so an earlier publication stays as it was."""
    chapter = whole_chapter(selection)
    rows = published_rows(chapter.runnable, selection.profile, resolve_runs_dir(runs_dir))
    if not rows:
        return None, 0
    return publish(folder, selection.chapter, selection.profile.name, rows), len(rows)


def show_class_results(selection: Selection, runs_dir: Path | str | None = None, keys: Sequence[str] | None = None,
                       publish_mine: bool = True) -> list[Table]:
    """Publish your completed runs (unless $WORKSHOP_SUBMIT=0 or ``publish_mine=False``) and show the chapter's
    tables filled by the whole class (those of part ``keys``, or all); one note and nothing else where the class
    has no folder."""
    try:
        found = class_folder_of(selection.profile)
    except ProfileError as error:
        message(f"The class's runs cannot be shown: {error}", "warning")
        return []
    if found is None:
        message(f"The class's runs: no class folder is set here, so there is nothing to pool. On the workshop day "
                f"the instructor's staged folder holds one (or export {CLASS_DIR_VARIABLE}=FOLDER); this cell then "
                "publishes your completed runs and shows the tables filled by everyone.", "note")
        return []
    folder = found.path
    # A class folder that is missing or unsafe, or a folder squatted under your name, is the class's problem to
    # fix, not a reason to stop the chapter: the message says who fixes it and how, and the chapter goes on.
    if publish_mine and submitting_enabled():
        try:
            path, count = publish_own(selection, folder, runs_dir)
            if path is not None:
                message(f"Published {count} completed run(s) of yours to the class folder "
                        f"({path.parent.name}/{path.name}).")
        except PoolError as error:
            message(f"Your runs were not published: {error}", "warning")
    chapter = whole_chapter(selection)
    try:
        pool = read_pool(folder, selection.chapter, selection.profile.name, chapter.runnable)
    except PoolError as error:
        message(f"The class's runs cannot be shown: {error}", "warning")
        return []
    _show_problems(pool)
    pooled = class_results(pool, chapter.runnable)
    if not pool.runs:
        message(f"The class's runs ({profile_title(selection.profile)}): nobody has published a completed run of "
                f"chapter {selection.chapter} to {folder} yet.", "note")
        return []
    profile = selection.profile
    participants = len({run.user for run in pool.runs})
    caption = (f"The class's runs — {participants} participant(s), {profile_title(profile)}. Where several ran an "
               "experiment, its row is the run with the median total job time.")
    tables = [for_profile(table, profile) for table in tables_from_results(selection.chapter, pooled.results)
              if not table.frame.empty and len(table.frame.columns) > 1 and (keys is None or table.key in keys)]
    for table in tables:
        titled = replace(table, title=f"{table.title} — the class's runs ({profile.name})")
        display(as_html(table_html(titled, kind="class", caption=caption, profile=profile.name)))
    display(as_html("<details><summary>Who ran what</summary>"
                    + scrollable(pooled.who.to_html(index=False, border=0, classes="workshop-class-who"))
                    + "</details>"))
    return tables


def _show_problems(pool: Pool) -> None:
    """One warning line per skipped file (the first SHOWN_PROBLEMS), so its owner can fix it."""
    for line in pool.problems[:SHOWN_PROBLEMS]:
        message(f"Class folder: {line}", "warning")
    if len(pool.problems) > SHOWN_PROBLEMS:
        message(f"Class folder: and {len(pool.problems) - SHOWN_PROBLEMS} more files skipped "
                "(`workshop class pool` lists them all).", "warning")


__all__ = ["ClassResults", "class_results", "publish_own", "representative", "show_class_results", "whole_chapter"]
