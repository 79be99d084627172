"""The chapter notebooks' API (``from workshop_lib.book.chapter import facade as nb``): show scripts and findings,
submit and wait, show the results of a part of the chapter, say what the data says.

Each function does one visible thing in a notebook cell and returns what it showed, so tests can call it
outside a kernel. Nothing here imports torch (a chapter starts fast on a login node).

Results are shown real measurements first: ``show_results(selection, keys)`` shows a part of a chapter
(e.g. ``["single-gpu"]``) as the reference measured on real GPUs (``book/reference/chapter<N>.json``, with a
provenance caption), then the same tables from the participant's runs, titled by profile, with stand-in
models named as such and all-n/a columns dropped. On the workshop day ``show_class_results(selection)`` publishes
the participant's completed runs to the class folder and shows the tables filled by the whole class
(``book.chapter.class_runs``; one note and nothing else where the class has no folder). A chapter's parts, their tables and
figures are declared in ``workshop_lib.book.parts``; a key that is not one of them is an error.

The pieces live beside this module (html, selection, reference, your_runs, figures); this one holds what a
notebook calls and nothing else (``__all__``). It is the only book module that imports the widgets, inside
`_live_monitor`, so the widgets can import the book's helpers without a loop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import pandas as pd

from workshop_lib.book import parts
from workshop_lib.book.chapter.class_runs import show_class_results
from workshop_lib.book.chapter.selection import Selection, select
from workshop_lib.book.chapter.your_runs import (
    chapter_results_for,
    resolve_runs_dir,
    show_run_table,
    show_tables,
    shown_path,
    submitting_enabled,
)
from workshop_lib.book.claims import figures
from workshop_lib.book.claims.figures import show_figure
from workshop_lib.book.pages.html import as_html, display, escape, message, script_block, scrollable, text_block
from workshop_lib.book.reference.chapter_views import (
    reference_results,
    reference_shown,
    show_engine_scaling,
    show_recipe_benchmark,
    show_reference_tables,
)
from workshop_lib.checks.disk import check_disk, pending_needs
from workshop_lib.checks.experiment_rules import validate_experiment
from workshop_lib.checks.findings import Finding
from workshop_lib.checks.lint import lint_script
from workshop_lib.core.errors import WorkshopError
from workshop_lib.core.paths import repository_root
from workshop_lib.core.vocabulary import DEFAULT_RECIPE
from workshop_lib.experiments import CHAPTERS, Experiment, get_experiment, summary_row
from workshop_lib.results import COMPLETED
from workshop_lib.runs import (
    Run,
    cancel_runs,
    load_run,
    records_this_experiment,
    submit_experiments,
    wait_for_runs,
)
from workshop_lib.scripts import render_script
from workshop_lib.sites.profiles import Profile, load_profile


def chapter_header(chapter: int, profile: str, experiments, runs_dir, recipe: str = DEFAULT_RECIPE) -> Selection:
    """Resolve the parameters cell into a Selection and say where results go."""
    if chapter not in CHAPTERS:
        raise WorkshopError(f"there is no chapter {chapter}: choose one of {sorted(CHAPTERS)}")
    selection = select(chapter, profile, experiments, recipe)
    root = resolve_runs_dir(runs_dir)
    mode = "submits what has not completed yet" if submitting_enabled() else "only reads results"
    message(f"Chapter {chapter} ({CHAPTERS[chapter]}) on profile {selection.profile.name!r}: "
            f"{len(selection.runnable)} of {len(selection.chosen)} selected experiment(s) run here; "
            f"runs in {shown_path(root)}; this execution {mode}.")
    return selection


def experiments_overview(selection: Selection) -> pd.DataFrame:
    """A small table of what the chapter runs (id, nodes, GPUs, knobs) with whether it runs here."""
    left = {experiment.id for experiment, _ in selection.left_out}
    rows = []
    for experiment in selection.chosen:
        row = summary_row(experiment)
        rows.append({"id": row["id"], "nodes": row["nodes"], "GPUs": row["gpus"], "engine": row["engine"],
                     "knobs": row["knobs"], f"on {selection.profile.name}": "no" if row["id"] in left else "yes"})
    frame = pd.DataFrame(rows)
    runs_here = sum(row[f"on {selection.profile.name}"] == "yes" for row in rows)
    # Folded: the list is reference material, the chapter's narrative reads on without it.
    display(as_html(f"<details><summary>The chapter's {len(rows)} experiments ({runs_here} run on profile "
                    f"{escape(selection.profile.name)})</summary>"
                    + scrollable(frame.to_html(index=False, border=0, classes="workshop-experiments")) + "</details>"))
    return frame


def check_experiment(experiment: Experiment, profile: Profile) -> tuple[str, list[Finding]]:
    """The rendered script and every finding of the experiment rules plus the script linter."""
    findings = validate_experiment(experiment, profile)
    if any(finding.is_error for finding in findings):
        return "", findings
    script = render_script(experiment, profile)
    return script, findings + lint_script(script)


def show_scripts(selection: Selection, reference_profile: str | None = "ibex") -> list[str]:
    """One folded block per experiment: the script this profile submits and the checker's findings.

    Experiments the profile does not realise get the script of ``reference_profile`` instead, labelled so."""
    blocks = []
    for experiment in selection.runnable:
        script, findings = check_experiment(experiment, selection.profile)
        blocks.append(script_block(f"{experiment.id} — {experiment.title} (profile {selection.profile.name})",
                                   script or "(not rendered: the experiment breaks a rule below)", findings))
    for experiment, reason in selection.left_out:
        if reference_profile and reference_profile != selection.profile.name:
            reference = load_profile(reference_profile)
            script, findings = check_experiment(experiment, reference)
            blocks.append(script_block(f"{experiment.id} — {experiment.title} (not on {selection.profile.name}: "
                                       f"shown as profile {reference.name} renders it)", script, findings))
    page = "\n".join(blocks)
    display(as_html(page))
    if selection.left_out:
        message(f"Not run on profile {selection.profile.name!r}: "
                + "; ".join(reason for _, reason in selection.left_out) + ".")
    return blocks


def show_reference_script(experiment_id: str, profile: str = "ibex", open_: bool = False) -> str:
    """One experiment's script as another site renders it (e.g. the NeMo script Ibex runs), folded."""
    experiment = get_experiment(experiment_id)
    reference = load_profile(profile)
    script, findings = check_experiment(experiment, reference)
    block = script_block(f"{experiment.id} on profile {reference.name}", script, findings, open_=open_)
    display(as_html(block))
    return block


def show_time_plan(selection: Selection, site: str = "ibex") -> pd.DataFrame:
    """Before submitting: the GPUs the chapter's jobs ask for, how they queue under Ibex's per-user GPU cap,
    and about how long each runs on an A100 (``workshop_lib.book.plans.time_plan``, from the reference runs). Always
    the Ibex plan, whatever profile runs here: it is what the chapter costs on the cluster."""
    from workshop_lib.book.plans import time_plan

    # What a participant submits: not the instructor's runs, nor (in a class) those other participants make.
    planned = selection.planned or selection.chosen
    sentence, table, factors = time_plan.chapter_plan(planned, site)
    others = [experiment.id for experiment in selection.chosen if experiment not in planned]
    if others:
        sentence += (f" Not counted: {', '.join(others)}, which {'is' if len(others) == 1 else 'are'} not yours to "
                     "submit (the instructor's runs, made before the day, or in a class another participant's); "
                     "their results are read, not run.")
    display(as_html(f'<p class="workshop-time-plan">{escape(sentence)}</p>'
                    f"<details><summary>Each job on Ibex: GPUs, steps, A100 estimate, queue</summary>"
                    + scrollable(table.to_html(index=False, border=0, classes="workshop-time-plan-table"))
                    + f"<p>{escape(factors)}</p></details>"))
    return table


def run_experiments(selection: Selection, runs_dir: Path | str | None = None,
                    wait_timeout_s: float | None = 1800, progress: bool = True) -> list[Run]:
    """Submit what has not completed yet, wait with a progress line, and show how each run ended.

    Completed runs of the same experiment (same content hash, same profile) are reused, never resubmitted.
    With $WORKSHOP_SUBMIT=0 nothing is submitted: the runs on disk are only listed."""
    root = resolve_runs_dir(runs_dir)
    if not selection.runnable:
        message(f"No experiment of this selection runs on profile {selection.profile.name!r}; nothing to submit.",
                "warning")
        return []
    if not submitting_enabled():
        runs = [load_run(experiment, root) for experiment in selection.runnable]
        for run in runs:
            run.note = "read only ($WORKSHOP_SUBMIT=0)"
        show_run_table(runs, read_only=True)
        return runs
    # Disk is a fit check too: refuse before the queue what the runs folder's quota cannot hold.
    message(check_disk(pending_needs(selection.runnable, selection.profile,
                                     lambda experiment: _completed_here(experiment, selection.profile, root)), root))
    runs = submit_experiments(selection.runnable, selection.profile, root=root)
    fresh = sum(run.submitted_now for run in runs)
    message(f"{fresh} job(s) submitted, {len(runs) - fresh} reused or already queued; run folders under "
            f"{shown_path(root)}.")
    monitor = _live_monitor(runs, root)
    wait_for_runs(runs, timeout=wait_timeout_s, progress=progress, on_poll=monitor.show_states if monitor else None)
    show_run_table(runs)
    return runs


def _live_monitor(runs: Sequence[Run], root: Path):
    """In JupyterLab (a live widget frontend): the job monitor, fed by the waiter's polls, so it asks the
    scheduler nothing itself. None elsewhere (papermill, the book): the run table below says it all."""
    from workshop_lib.widgets.frontend import live_widgets

    if not live_widgets():
        return None
    from workshop_lib.widgets.monitor import JobMonitor

    monitor = JobMonitor(runs=[run for run in runs if run.record is not None], runs_dir=root, interactive=True)
    display(monitor.widget)  # filled by the waiter's first poll, a moment later
    return monitor


def cancel_experiments(selection: Selection, runs_dir: Path | str | None = None) -> list[str]:
    """Cancel the selection's queued and running jobs (a whole chapter: ``nb.cancel_experiments(selection)``;
    from a shell: ``workshop cancel --chapter N``). Re-running the chapter later submits them again."""
    lines = cancel_runs(selection.runnable, resolve_runs_dir(runs_dir))
    message("<br>".join(escape(line) for line in lines) or "Nothing selected.")
    return lines


def _completed_here(experiment: Experiment, profile: Profile, root) -> bool:
    """The experiment has a completed run of the same content and profile (it will be reused)."""
    record = load_run(experiment, root).record
    return bool(record and record.final_state == COMPLETED and records_this_experiment(record, experiment, profile))


def show_results(selection: Selection, keys: Sequence[str], runs_dir: Path | str | None = None,
                 plots: bool = True, missing: str | None = None) -> None:
    """One part of a chapter's results (``keys``: its parts, `book.parts`; an unknown key is an error naming
    them): the reference on real GPUs first (tables, then plots), then the same tables and plots from your
    runs, titled by the profile that ran them. A figure-only part shows its figures alone."""
    chosen = parts.lookup(selection.chapter, keys)
    tables = parts.table_keys(chosen)
    reference = []
    if tables:
        reference = show_reference_tables(selection.chapter, tables, **({"missing": missing} if missing else {}))
    if plots and (reference or not tables):
        loaded = reference_shown(selection.chapter)  # the series the tables show: plots divide rows too
        if loaded is not None:
            figures.show_figures(figures.chapter_figures(chosen, loaded[1], "reference, real GPUs"))
    results = chapter_results_for(selection, runs_dir)  # parsed once: the tables and the plots show the same
    if tables:
        mine = show_tables(selection, runs_dir, tables, results)
    else:  # a figure-only part: your runs' figures once any of them completed
        mine = not results.empty and (results["state"] == COMPLETED).any()
    if plots and mine:
        figures.show_figures(figures.chapter_figures(chosen, results, f"your runs, {selection.profile.name}",
                                                     selection.profile))


def say(text: str) -> str:
    """A paragraph of Markdown generated from data (`book.claims.sentences`), shown as text on the page."""
    if not text:
        return ""
    try:
        from IPython import get_ipython
        from IPython.display import Markdown
    except ImportError:
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        display(Markdown(text))
    else:
        print(text)
    return text


def show_file(path: str, title: str | None = None, open_: bool = True) -> str:
    """A file of the repository (a DeepSpeed JSON, a template) shown as it is, under its path in the repo."""
    source = repository_root() / path
    if not source.is_file():
        raise WorkshopError(f"{path} does not exist in the workshop folder {repository_root()}: name a file by its "
                            "path in the repository, e.g. slurm/ds_configs/zero2_offload.json")
    block = text_block(title or path, source.read_text(), open_)
    display(as_html(block))
    return block


def show_log_lines(experiment_id: str, pattern: str, runs_dir: Path | str | None = None, limit: int = 3) -> list[str]:
    """The last lines of an experiment's job log that contain ``pattern`` (what a reader looks for by hand)."""
    folder = resolve_runs_dir(runs_dir) / experiment_id
    logs = sorted(folder.glob("slurm-*.out"))
    if not logs:
        message(f"No log of {experiment_id} in {shown_path(folder)} yet: run the chapter's jobs first (the submission cell), "
                "then this cell shows the lines you looked for.")
        return []
    lines = [line for line in logs[-1].read_text(errors="replace").splitlines() if pattern in line][-limit:]
    display(as_html(text_block(f"{logs[-1].name} of {experiment_id}: lines with {pattern!r}",
                                "\n".join(lines) or f"(no line contains {pattern!r})", True)))
    return lines


__all__ = ["Selection", "cancel_experiments", "chapter_header", "experiments_overview", "reference_results",
           "run_experiments", "say", "select", "show_class_results", "show_engine_scaling", "show_figure", "show_file",
           "show_log_lines", "show_recipe_benchmark", "show_reference_script", "show_results", "show_scripts",
           "show_time_plan"]
