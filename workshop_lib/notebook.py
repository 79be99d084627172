"""The glue the chapter notebooks share: show scripts and findings, submit and wait, show tables and plots.

Each function does one visible thing in a notebook cell and returns what it showed, so tests can call it
outside a kernel. Nothing here imports torch (a chapter starts fast on a login node).

Where results live: ``resolve_runs_dir`` gives one absolute folder whichever way a chapter is run
(JupyterLab, papermill from the repository root, or Jupyter Book executing it from ``notebooks/``), so a
re-run or a book build finds the runs of the first execution and submits nothing that already completed.
Set ``WORKSHOP_SUBMIT=0`` to make a chapter read results only (the book build does): it then never talks
to a scheduler.

Results are shown real measurements first: ``show_results(selection, keys)`` shows a part of a chapter
(e.g. ``["single-gpu"]``) as the reference measured on real GPUs (``book/reference/chapter<N>.json``, with a
provenance caption), then the same tables from the participant's runs, titled by profile, with stand-in
models named as such and all-n/a columns dropped. Any chapter gets this by calling it with its tables'
keys (``Table.key`` in ``workshop_lib.book.tables``) once its reference file exists.
"""

from __future__ import annotations

import html
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import pandas as pd

from workshop_lib.book import tables as tables_module
from workshop_lib.core.errors import WorkshopError
from workshop_lib.experiments import (
    CHAPTERS, DEFAULT_RECIPE, HF, RECIPES, Experiment, chapter_experiments, get_experiment, with_recipe,
)
from workshop_lib.disk_check import check_disk, pending_needs
from workshop_lib.profiles import Profile, load_profile
from workshop_lib.results import COMPLETED, chapter_results, read_run, run_note, run_record
from workshop_lib.core.paths import ROOT_VARIABLE, RUNS_VARIABLE, repository_root, runs_root  # noqa: F401  (part of this API)
from workshop_lib.runs import (
    Run, cancel_runs, explain_runs, load_run, query_runs, read_only_info, records_this_experiment, submit_experiments,
    wait_for_runs,
)
from workshop_lib.scripts import render_script
from workshop_lib.slurm_output import JobInfo
from workshop_lib.book.tables import Table
from workshop_lib.validate import Finding, lint_script, validate_experiment

SUBMIT_VARIABLE = "WORKSHOP_SUBMIT"


# ---- where things are (one place: workshop_lib/core/paths.py) ------------------------------------------
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


# ---- which experiments --------------------------------------------------------------------------
@dataclass(frozen=True)
class Selection:
    """The experiments a chapter execution covers, split by whether the profile realises them."""

    chapter: int
    profile: Profile
    chosen: tuple[Experiment, ...]  # what the parameters cell asked for, in matrix order
    runnable: tuple[Experiment, ...]  # the part the profile realises
    left_out: tuple[tuple[Experiment, str], ...]  # (experiment, why) for the rest


def select(chapter: int, profile: Profile | str = "tiny", experiments: Sequence[str] | str | None = None,
           recipe: str = DEFAULT_RECIPE) -> Selection:
    """The chapter's experiments named in ``experiments`` (ids, or None for all), checked against the profile.

    ``recipe="tuned"`` runs the Hugging Face Trainer experiments with the workshop's tuned recipe; they
    get their own ids (``…-tuned``) and run folders, so seed results are never overwritten."""
    if recipe not in RECIPES:
        raise WorkshopError(f"recipe={recipe!r}: choose one of {', '.join(RECIPES)} (seed: as the original "
                            "material, for comparable numbers; tuned: the workshop's faster recipe)")
    profile = load_profile(profile)
    matrix = chapter_experiments(chapter)
    if experiments is None:
        chosen = matrix
    else:
        wanted = [experiments] if isinstance(experiments, str) else list(experiments)
        foreign = [get_experiment(i).id for i in wanted if get_experiment(i).chapter != chapter]
        if foreign:
            raise WorkshopError(f"{', '.join(foreign)} belong(s) to another chapter than {chapter}: "
                                f"list ids of chapter {chapter} (`workshop experiments --chapter {chapter}`)")
        chosen = [experiment for experiment in matrix if experiment.id in set(wanted)]
    chosen = [with_recipe(experiment, recipe) if experiment.engine == HF else experiment for experiment in chosen]
    runnable, left_out = [], []
    for experiment in chosen:
        reason = profile.unsupported_reason(experiment)
        if reason:
            left_out.append((experiment, reason))
        else:
            runnable.append(experiment)
    return Selection(chapter, profile, tuple(chosen), tuple(runnable), tuple(left_out))


# ---- display helpers ------------------------------------------------------------------------------
def _display(obj) -> None:
    """IPython's display inside a kernel; a plain print of the text elsewhere (tests, scripts)."""
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        display(obj)
    else:
        print(getattr(obj, "data", obj))


def _html(text: str):
    from IPython.display import HTML

    return HTML(text)


def _escape(text: str) -> str:
    return html.escape(str(text), quote=False)


def scrollable(table_html: str) -> str:
    """A wide table scrolls inside the page's text column instead of being cut off at its edge."""
    return f'<div class="workshop-scroll" style="overflow-x:auto;max-width:100%">{table_html}</div>'


def message(text: str, kind: str = "note") -> str:
    """A short boxed note (kind: note, warning, error) as HTML; returns the HTML."""
    colours = {"note": ("#e8f1fb", "#2b6cb0"), "warning": ("#fff7e0", "#b7791f"), "error": ("#fdecea", "#c53030")}
    background, border = colours.get(kind, colours["note"])
    block = (f'<div class="workshop-{kind}" style="background:{background};border-left:4px solid {border};'
             f'padding:0.5em 0.8em;margin:0.5em 0">{_escape(text)}</div>')
    _display(_html(block))
    return block


def script_block(title: str, script: str, findings: Sequence[Finding] = (), open_: bool = False) -> str:
    """A folded <details> block with a job script and, under it, what the checker found."""
    summary = f"<summary><code>{_escape(title)}</code>{_findings_badge(findings)}</summary>"
    body = f'<pre style="font-size:0.8em;overflow-x:auto">{_escape(script)}</pre>'
    return f"<details{' open' if open_ else ''}>{summary}{body}{findings_html(findings)}</details>"


def _findings_badge(findings: Sequence[Finding]) -> str:
    errors = sum(finding.is_error for finding in findings)
    warnings = len(findings) - errors
    if not findings:
        return " &nbsp;✔ checks passed"
    return f" &nbsp;⚠ {errors} error(s), {warnings} warning(s)"


def findings_html(findings: Sequence[Finding], source: str = "") -> str:
    """The checker's findings as an HTML list (or one line saying there are none)."""
    if not findings:
        return "<p><em>Checker: no finding (experiment rules and script linter).</em></p>"
    items = "".join(f"<li><b>{finding.severity}</b> [{_escape(finding.rule)}] {_escape(finding.message)} "
                    f"<i>Fix:</i> {_escape(finding.fix)}" + (f" (line {finding.line})" if finding.line else "")
                    + "</li>" for finding in findings)
    return f"<ul>{items}</ul>"


# ---- scripts and validation ---------------------------------------------------------------------
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
    _display(_html(page))
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
    _display(_html(block))
    return block


# ---- text and files on the page ------------------------------------------------------------------
def say(text: str) -> str:
    """A paragraph of Markdown generated from data (e.g. `workshop_lib.book.claims`), shown as text on the page."""
    if not text:
        return ""
    try:
        from IPython import get_ipython
        from IPython.display import Markdown
    except ImportError:
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        _display(Markdown(text))
    else:
        print(text)
    return text


def show_file(path: str, title: str | None = None, open_: bool = True) -> str:
    """A file of the repository (a DeepSpeed JSON, a template) shown as it is, under its path in the repo."""
    source = repository_root() / path
    if not source.is_file():
        raise WorkshopError(f"{path} does not exist in the workshop folder {repository_root()}: name a file by its "
                            "path in the repository, e.g. slurm/ds_configs/zero2_offload.json")
    block = _text_block(title or path, source.read_text(), open_)
    _display(_html(block))
    return block


def _text_block(title: str, text: str, open_: bool) -> str:
    """A folded block of plain text (a file, log lines): a script block without the checker's verdict."""
    return (f"<details{' open' if open_ else ''}><summary><code>{_escape(title)}</code></summary>"
            f'<pre style="font-size:0.8em;overflow-x:auto">{_escape(text)}</pre></details>')


def show_log_lines(experiment_id: str, pattern: str, runs_dir: Path | str | None = None, limit: int = 3) -> list[str]:
    """The last lines of an experiment's job log that contain ``pattern`` (what a reader looks for by hand)."""
    folder = resolve_runs_dir(runs_dir) / experiment_id
    logs = sorted(folder.glob("slurm-*.out"))
    if not logs:
        message(f"No log of {experiment_id} in {shown_path(folder)} yet: run the chapter's jobs first (the submission cell), "
                "then this cell shows the lines you looked for.")
        return []
    lines = [line for line in logs[-1].read_text(errors="replace").splitlines() if pattern in line][-limit:]
    _display(_html(_text_block(f"{logs[-1].name} of {experiment_id}: lines with {pattern!r}",
                               "\n".join(lines) or f"(no line contains {pattern!r})", True)))
    return lines


# ---- how long, before submitting --------------------------------------------------------------------
def show_time_plan(selection: Selection, site: str = "ibex") -> pd.DataFrame:
    """Before submitting: the GPUs the chapter's jobs ask for, how they queue under Ibex's per-user GPU cap,
    and about how long each runs on an A100 (``workshop_lib.book.time_plan``, from the reference runs). Always
    the Ibex plan, whatever profile runs here: it is what the chapter costs on the cluster."""
    from workshop_lib.book import time_plan

    sentence, table, factors = time_plan.chapter_plan(selection.chosen, site)
    _display(_html(f'<p class="workshop-time-plan">{_escape(sentence)}</p>'
                   f"<details><summary>Each job on Ibex: GPUs, steps, A100 estimate, queue</summary>"
                   + scrollable(table.to_html(index=False, border=0, classes="workshop-time-plan-table"))
                   + f"<p>{_escape(factors)}</p></details>"))
    return table


# ---- submit and wait ------------------------------------------------------------------------------
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
        _show_run_table(runs, read_only=True)
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
    _show_run_table(runs)
    return runs


def _live_monitor(runs: Sequence[Run], root: Path):
    """In JupyterLab (a live widget frontend): the job monitor, fed by the waiter's polls, so it asks the
    scheduler nothing itself. None elsewhere (papermill, the book): the run table below says it all."""
    from workshop_lib.widgets.frontend import live_widgets

    if not live_widgets():
        return None
    from workshop_lib.widgets.monitor import JobMonitor

    monitor = JobMonitor(runs=[run for run in runs if run.record is not None], runs_dir=root, interactive=True)
    _display(monitor.widget)  # filled by the waiter's first poll, a moment later
    return monitor


def cancel_experiments(selection: Selection, runs_dir: Path | str | None = None) -> list[str]:
    """Cancel the selection's queued and running jobs (a whole chapter: ``nb.cancel_experiments(selection)``;
    from a shell: ``workshop cancel --chapter N``). Re-running the chapter later submits them again."""
    lines = cancel_runs(selection.runnable, resolve_runs_dir(runs_dir))
    message("<br>".join(_escape(line) for line in lines) or "Nothing selected.")
    return lines


def _completed_here(experiment: Experiment, profile: Profile, root) -> bool:
    """The experiment has a completed run of the same content and profile (it will be reused)."""
    record = load_run(experiment, root).record
    return bool(record and record.final_state == COMPLETED and records_this_experiment(record, experiment, profile))


def _show_run_table(runs: Sequence[Run], read_only: bool = False) -> pd.DataFrame:
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
    _display(_html(scrollable(frame.to_html(index=False, border=0, classes="workshop-runs"))))
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
        _display(_html(explanation_block(run.experiment.id, explanation.text())))
    for run in runs:
        if run.damage:
            message(run.damage, "error")
    active = [info for info in infos if not info.finished and info.state not in ("NOT SUBMITTED", "DAMAGED")]
    if failed:
        message(f"{len(failed)} run(s) ended without completing: why is shown above. Fix the cause and re-run this "
                "cell: those runs are submitted again, completed ones are reused.", "error")
    if active:
        message(f"{len(active)} run(s) are still queued or running (or the scheduler did not answer): their table "
                "cells show the state instead of numbers. Re-run this cell later; nothing is submitted twice.",
                "warning")
    return frame


def explanation_block(experiment_id: str, explanation: str) -> str:
    """An open block with why a run did not complete (no checker badge: it is not a script)."""
    return (f"<details open><summary><code>{_escape(experiment_id)}</code>: why it did not complete</summary>"
            f'<pre style="font-size:0.8em;overflow-x:auto">{_escape(explanation)}</pre></details>')


# ---- tables and plots ------------------------------------------------------------------------------
def chapter_results_for(selection: Selection, runs_dir: Path | str | None = None) -> pd.DataFrame:
    """The chapter's results restricted to the selection's runnable experiments.

    Rows keep the matrix's ids (a tuned run's ``-tuned`` is dropped), so the seeds' tables fill the same
    way whichever recipe ran; the ``recipe`` column says which one did."""
    root = resolve_runs_dir(runs_dir)
    if not selection.runnable:
        return chapter_results(selection.chapter, root).iloc[0:0]
    results = pd.DataFrame([run_record(experiment, root) for experiment in selection.runnable])
    suffixes = {experiment.id: f"-{experiment.recipe}" for experiment in selection.runnable
                if experiment.recipe != DEFAULT_RECIPE}
    results["id"] = [i.removesuffix(suffixes.get(i, "")) for i in results["id"]]
    return results


def selection_tables(selection: Selection, runs_dir: Path | str | None = None,
                     results: pd.DataFrame | None = None) -> list[Table]:
    """The seeds' tables of the chapter, one row (or column) per runnable experiment of the selection;
    from ``results`` when the caller already read them (`chapter_results_for`), else from the run folders."""
    results = chapter_results_for(selection, runs_dir) if results is None else results
    built = tables_module.tables_from_results(selection.chapter, results)
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
    tables = [_for_profile(table, profile) for table in selection_tables(selection, runs_dir, results)
              if keys is None or table.key in keys]
    for table in tables:
        titled = replace(table, title=f"{table.title} — your runs ({profile.name})")
        _display(_html(table_html(titled, kind="participant", caption=f"Your runs — {profile_title(profile)}",
                                  profile=profile.name)))
    return tables


def _for_profile(table: Table, profile: Profile) -> Table:
    """As a reader must see a table of this profile: stand-in models named as such, no all-n/a columns."""
    return tables_module.drop_unrecorded(tables_module.for_stand_ins(table, profile))


def profile_title(profile: Profile) -> str:
    """How a table of this profile is titled: "tiny CPU stand-in", "ibex (KAUST Ibex A100 nodes, …)"."""
    if profile.name == "tiny":
        return "tiny CPU stand-in: tiny random models, synthetic data, a few steps on CPU processes"
    return f"profile {profile.name}: {profile.description}"


def reference_results(chapter: int | str) -> tuple[dict, pd.DataFrame] | None:
    """A chapter's results measured on real GPUs (book/reference/chapter<N>.json, or book/reference/<name>.json)."""
    import json

    name = f"chapter{chapter}" if isinstance(chapter, int) else chapter
    path = repository_root() / "book" / "reference" / f"{name}.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    # Rows from before an engine recorded its step cap (the custom GPT's) ran under the reference profile's
    # max_steps: say so, or their tables would describe the full epochs they never trained.
    cap = load_profile(data["profile"]).training.max_steps if data.get("profile") else None
    for row in data["results"]:
        settings = row.get("run_settings")
        if cap and isinstance(settings, dict) and settings and settings.get("max_steps") is None:
            row["run_settings"] = {**settings, "max_steps": cap}
    return data, pd.DataFrame(data["results"])


def reference_caption(data: dict, results: pd.DataFrame, source: str, engine: str | None = None) -> str:
    """Where and how the reference ran: GPUs, recipe, steps, weights, data, software, date and file."""
    provenance = data["provenance"] if isinstance(data["provenance"], list) else [data["provenance"]]
    first = provenance[0]
    # One machine per session of the reference driver; name each machine size once ("2 × H200 and 4 × H200").
    machines = sorted({(len(p.get("gpus") or ["?"]), (p.get("gpus") or ["unknown GPU"])[0].split(",")[0])
                       for p in provenance})
    where = " and ".join(f"{count} × {gpu}" for count, gpu in machines)
    profile = load_profile(data["profile"]) if data.get("profile") else None
    done = results[results["state"] == COMPLETED]
    recipes = sorted({_recipe_text(r) for r in done.to_dict("records")} - {""})
    steps = sorted({int(s["max_steps"]) for s in done.get("run_settings", []) if isinstance(s, dict)
                    and s.get("max_steps") is not None})
    weights = ("random-init weights (memory and speed are the real model's, the loss is not)"
               if profile is not None and profile.training.random_init else "trained weights")
    data_kind = f"{profile.training.data} data" if profile is not None else ""
    dates = sorted({p.get("date", "")[:10] for p in provenance if p.get("date")})
    steps_text = f"{' / '.join(map(str, steps))} optimizer steps" if steps else "full epochs"
    if engine and engine.startswith("NeMo"):  # NeMo's steps are its job script's trainer.max_steps (the profile's cap)
        steps_text = "the optimizer steps of its job script's trainer.max_steps"
    software = ", ".join(f"{name} {first[key]}" for key, name in
                         (("torch", "torch"), ("transformers", "transformers"), ("deepspeed", "DeepSpeed"),
                          ("nemo", "NeMo")) if _installed(first.get(key)))
    return (f"Reference, measured on real GPUs: {where} (profile {data.get('profile')}); "
            + (f"trained by {engine}; " if engine else "") +
            f"{'; '.join(recipes) or 'recipe as declared'}; {steps_text}; {weights}; {data_kind}; "
            f"{software or 'software versions not recorded'}; measured {', '.join(dates)}. Source: {source}.")


def _installed(version) -> bool:
    """A version the reference machine had; not its "unavailable (ModuleNotFoundError)" of a package that run
    did not need (chapter 1's stand-in runs without DeepSpeed)."""
    return bool(version) and not str(version).startswith("unavailable")


def _recipe_text(record: dict) -> str:
    """"seed recipe (fp16, batch 4 × accumulation 4)" for a Trainer run; the global batch for a NeMo run."""
    def known(key):
        value = record.get(key)
        return None if value is None or (isinstance(value, float) and pd.isna(value)) else value

    recipe, precision = known("recipe") or "seed", known("precision") or known("run_precision") or "precision as run"
    if known("per_device_batch") and known("grad_accum"):
        return (f"{recipe} recipe ({precision}, batch {int(record['per_device_batch'])} × accumulation "
                f"{int(record['grad_accum'])})")
    if known("global_batch"):
        return f"{recipe} recipe ({precision}, global batch {int(record['global_batch'])})"
    return ""


def show_reference_tables(chapter: int, keys: Sequence[str] | None = None,
                          missing: str = "needs more than the one 4-GPU machine the references ran on") -> list[Table]:
    """The chapter's tables (those of part ``keys``, or all) filled from the runs on real GPUs, each with
    its provenance; a note saying so where the part has no reference measurement."""
    loaded = reference_results(chapter)
    if loaded is None:
        _reference_missing(f"No reference measurement for chapter {chapter} yet "
                           f"(book/reference/chapter{chapter}.json).")
        return []
    data, results = loaded
    shown = []
    # One set of tables per engine that ran (NeMo itself, the stand-in, the HF/GPT engines): a row is never
    # read as another engine's, and the same experiment by two engines does not collide in one table.
    for engine, engine_results in _by_engine(results):
        caption = reference_caption(data, engine_results, f"book/reference/chapter{chapter}.json",
                                    engine=engine_text(engine_results))
        tables = [tables_module.drop_unrecorded(table)
                  for table in tables_module.tables_from_results(chapter, engine_results)
                  if keys is None or table.key in keys]
        tables = [table for table in tables if not table.frame.empty and len(table.frame.columns) > 1]
        for table in tables:
            titled = replace(table, title=f"{table.title} — on real GPUs, {engine_title(engine)}")
            _display(_html(table_html(titled, kind="reference", caption=caption, profile=data.get("profile", ""))))
        shown += tables
    if not shown:
        _reference_missing(f"No reference measurement for this part: it {missing}. Your runs below are the only "
                           "numbers here.")
    return shown


def _by_engine(results: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The reference rows split by `run_engine` (rows from before the field: the engine they declare)."""
    if results.empty:
        return []
    declared = results["engine"] if "engine" in results else pd.Series(["?"] * len(results), index=results.index)
    engines = results["run_engine"].fillna(declared) if "run_engine" in results else declared
    # Only NeMo and its stand-in must never share a table; the Trainer and GPT engines of chapters 3-4 do.
    engines = engines.where(engines.isin(["nemo", "stand-in"]), "engines")
    order = {"nemo": 0, "stand-in": 1}
    return [(engine, results[engines == engine].reset_index(drop=True))
            for engine in sorted(engines.unique(), key=lambda name: (order.get(name, 2), name))]


def engine_title(engine: str) -> str:
    return {"nemo": "NeMo itself", "stand-in": "PyTorch stand-in (not NeMo)"}.get(engine, "the chapter's engines")


def engine_text(results: pd.DataFrame) -> str:
    """"NeMo 2.4.1 on NVIDIA H100 …" / "the PyTorch stand-in (not NeMo)" / "hf", for a caption."""
    engines = set(results["run_engine"].dropna()) if "run_engine" in results else set()
    if engines == {"nemo"}:
        versions = sorted({str(v) for v in results.get("nemo_version", pd.Series(dtype=object)).dropna()})
        return f"NeMo {', '.join(versions) or '(version not recorded)'} itself (run_engine nemo)"
    if engines == {"stand-in"}:
        return ("the PyTorch stand-in at the real model's shape (run_engine stand-in), not NeMo: "
                "book/reference/nemo and the chapter's reference table give its measured ratio to NeMo")
    names = {"hf": "Hugging Face Trainer (DeepSpeed / FSDP as each row says)", "gpt": "the custom GPT's FSDP loop"}
    return "; ".join(names.get(engine, engine) for engine in sorted(engines)) or "as declared by each experiment"


def _reference_missing(text: str) -> str:
    block = f'<div class="workshop-reference-missing workshop-note">{_escape(text)}</div>'
    _display(_html(block))
    return block


def show_results(selection: Selection, keys: Sequence[str], runs_dir: Path | str | None = None,
                 plots: bool = True, missing: str | None = None) -> None:
    """One part of a chapter's results: the reference on real GPUs first (tables, then plots), then the
    same tables and plots from your runs, titled by the profile that ran them."""
    reference = show_reference_tables(selection.chapter, keys, **({"missing": missing} if missing else {}))
    if plots and reference:
        loaded = reference_results(selection.chapter)
        show_figures(chapter_figures(selection.chapter, loaded[1], keys, "reference, real GPUs"))
    results = chapter_results_for(selection, runs_dir)  # parsed once: the tables and the plots show the same
    mine = show_tables(selection, runs_dir, keys, results)
    if plots and mine:
        show_figures(chapter_figures(selection.chapter, results, keys, f"your runs, {selection.profile.name}",
                                     selection.profile))


def show_recipe_benchmark() -> list[Table]:
    """The seed recipe against the tuned one on one GPU (benchmarks/recipe_benchmark.py), steady and end to
    end, then the changes one at a time with why each pays; every figure from the stored result files."""
    from workshop_lib.book import reference_views

    tables = reference_views.recipe_benchmark_tables()
    if not tables:
        _reference_missing("No recipe benchmark result yet (benchmarks/results/recipe/).")
    shown = []
    for title, frame, note, sources in tables:
        table = Table(title, frame)
        first, *others = [path.relative_to(reference_views.REPOSITORY).as_posix() for path in sources]
        also = f" (also {', '.join(others)})" if others else ""
        caption = (f"Reference, measured on real GPUs: random-init BLOOM-560m shape, synthetic SQuAD. {note}{also} "
                   f"Source: {first}.")
        _display(_html(table_html(table, kind="reference", caption=caption, profile="recipe-benchmark")))
        shown.append(table)
    return shown


def show_engine_scaling() -> Table | None:
    """DDP vs ZeRO-2 vs FSDP FULL_SHARD weak scaling on real GPUs (book/reference/engine_scaling.json)."""
    from workshop_lib.book import reference_views

    loaded = reference_results("engine_scaling")
    if loaded is None:
        _reference_missing("No engine-scaling reference results yet (book/reference/engine_scaling.json).")
        return None
    data, results = loaded
    table = Table("Weak scaling of the data-parallel engines",
                  reference_views.engine_scaling_table(),
                  "Efficiency = T1/TN from the median step time (steps 4-30): each GPU does the same work, so "
                  "100 % means no time lost to communication or waiting. Blank model states: measured before "
                  "the engines recorded them.")
    caption = reference_caption(data, results, "book/reference/engine_scaling.json")
    _display(_html(table_html(table, kind="reference", caption=caption, profile=data.get("profile", ""))))
    return table


def table_html(table: Table, kind: str = "participant", caption: str = "", profile: str = "") -> str:
    """One table: a heading, whose measurement it is (``kind`` reference or participant, with ``caption``
    saying where it ran), the frame (numbers as numbers, empty cells blank) and its note."""
    frame = table.frame.map(format_cell)
    text = frame.to_html(index=False, border=0, na_rep="", classes="workshop-table")
    note = f"<p><small>{_escape(table.note)}</small></p>" if table.note else ""
    provenance = f'<p class="workshop-provenance"><small>{_escape(caption)}</small></p>' if caption else ""
    # Wide tables scroll inside the page's text column instead of running under the side bar.
    return (f'<div class="workshop-table-block workshop-{kind}" data-profile="{_escape(profile)}">'
            f'<h4>{_escape(table.title)}</h4>{provenance}{scrollable(text)}{note}</div>')


def format_cell(value) -> str:
    """Numbers as a reader wants them: whole numbers without ".0", others to 5 significant digits."""
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.1f}" if abs(value) >= 1000 else f"{value:.5g}"


def _has_data(figure) -> bool:
    return any(axes.lines or axes.patches or axes.collections for axes in figure.axes)


def show_figure(figure, empty_message: str = "no completed run recorded this value yet") -> bool:
    """Show a matplotlib figure inline (once) and close it; a note instead when it has nothing drawn."""
    import matplotlib.pyplot as plt

    drawn = _has_data(figure)
    if drawn:
        _display(figure)
    else:
        title = figure.axes[0].get_title() if figure.axes else "plot"
        message(f"{title}: {empty_message}.")
    plt.close(figure)
    return drawn


def show_figures(figures: Sequence) -> int:
    """Every figure of a list (see `show_figure`); returns how many had data."""
    return sum(show_figure(figure) for figure in figures)


def show_plots(selection: Selection, runs_dir: Path | str | None = None, keys: Sequence[str] | None = None) -> int:
    """The chapter's plots of your runs (speedup, efficiency, memory, loss); returns how many had data."""
    results = chapter_results_for(selection, runs_dir)
    if results.empty or not (results["state"] == COMPLETED).any():
        message("No completed run yet: nothing to plot.", "warning")
        return 0
    return show_figures(chapter_figures(selection.chapter, results, keys, f"your runs, {selection.profile.name}",
                                        selection.profile))


def chapter_figures(chapter: int, results: pd.DataFrame, keys: Sequence[str] | None = None,
                    label: str = "", profile: Profile | None = None) -> list:
    """The figures of a chapter's parts ``keys`` (all when None) from a results frame, titles ending in
    ``label`` (whose runs they show) and naming ``profile``'s stand-in models as such. Loss curves need
    the runs' folders, so a reference has none."""
    figures = _chapter_figures(chapter, results, keys, label)
    names = tables_module.stand_in_names(profile) if profile is not None else {}
    for figure in figures if names else ():
        for axes in figure.axes:
            axes.set_title(tables_module.rename_models(axes.get_title(), names), wrap=True)
    return figures


def _chapter_figures(chapter: int, results: pd.DataFrame, keys: Sequence[str] | None, label: str) -> list:
    from workshop_lib.book import plots

    wanted = (lambda key: True) if keys is None else (lambda key: key in keys)  # noqa: E731
    group = lambda name: results[results["group"] == name]  # noqa: E731
    suffix = f" ({label})" if label else ""
    memory = _memory_metric(results)
    has_folders = "run_dir" in results and any(Path(str(d)).is_dir() for d in results["run_dir"].dropna())
    figures = []
    if chapter in (1, 2):
        what = "LoRA, data parallel" if chapter == 1 else "tensor (x expert) parallel"
        for name, model in (("llama", "llama-3.1-8b"), ("mixtral", "mixtral-8x7b")):
            if wanted(name) and len(group(name)) > 1:
                shown = tables_module.MODEL_NAMES[model]
                if chapter == 1:
                    figures.append(plots.speedup_plot(group(name), "total_time_s",
                                                      f"{shown} ({what}): speedup of the total job time{suffix}"))
                else:  # layouts, not GPU counts, are what differ (two of them use 4 GPUs)
                    step = tables_module.step_time_key(group(name).to_dict("records"))
                    figures.append(plots.step_time_plot(group(name), step, tables_module.layout_name,
                                                        f"{shown} ({what}): step time per layout{suffix}"))
        if wanted("memory"):
            figures.append(plots.memory_plot(results, by="id", metric=memory[0],
                                             title=f"Peak memory per process ({memory[1]}){suffix}", ylabel="MiB"))
        if wanted("loss") and has_folders:
            figures.append(plots.loss_curves(results, f"Training loss per run{suffix}"))
    elif chapter == 3:
        single = pd.concat([group("baseline"), group("single-gpu")])
        if wanted("single-gpu"):
            figures.append(plots.memory_plot(single, by="id", metric=memory[0],
                                             title=f"One GPU: peak memory per ZeRO setup ({memory[1]}){suffix}",
                                             ylabel="MiB"))
            figures.append(plots.cpu_memory_plot(single, f"One GPU: CPU memory of the job (psrecord){suffix}"))
            if has_folders:
                figures.append(plots.loss_curves(single, f"Training loss, one GPU{suffix}"))
        if wanted("two-gpus"):
            figures.append(plots.memory_plot(group("two-gpus"), by="id", metric=memory[0],
                                             title=f"Two GPUs: peak memory per GPU ({memory[1]}){suffix}",
                                             ylabel="MiB"))
            figures.append(plots.cpu_memory_plot(group("two-gpus"),
                                                 f"Two GPUs: CPU memory of the job (psrecord){suffix}"))
        if wanted("multi-gpu") or wanted("multi-node"):
            one_gpu = single[single["id"] == "zero/single-gpu/zero0"]
            series = {}
            if wanted("multi-gpu"):
                series["one node (ZeRO 0)"] = pd.concat([one_gpu, group("multi-gpu")])
            if wanted("multi-node"):
                series["2 GPUs per node, across nodes"] = group("multi-node")
            figures.append(_throughput_plot(series, f"Weak scaling: training throughput{suffix}"))
    else:
        one_node = pd.concat([group("single-gpu"), group("multi-gpu")])
        if wanted("multi-gpu"):
            if tables_module.ran_fixed_steps(one_node.to_dict("records")):
                step = tables_module.step_time_key(one_node.to_dict("records"))
                figures.append(plots.efficiency_plot(one_node, step, "BLOOM-560m with FSDP on one node: weak "
                                                     f"scaling efficiency from the step time{suffix}"))
            else:
                figures.append(plots.speedup_plot(one_node, "train_runtime_s", "BLOOM-560m with FSDP on one node: "
                                                  f"speedup of the training runtime{suffix}"))
        if wanted("strategies"):
            figures.append(plots.memory_plot(group("strategies"), by="id", metric=memory[0],
                                             title=f"Sharding strategies: peak memory per rank ({memory[1]}){suffix}",
                                             ylabel="MiB"))
        if wanted("weak-scaling"):
            depth = group("weak-scaling")
            step = tables_module.step_time_key(depth.to_dict("records"))
            figures.append(plots.efficiency_plot(depth, step, f"Custom GPT: weak scaling efficiency by depth{suffix}"))
        if wanted("gpt") and has_folders:
            figures.append(plots.loss_curves(pd.concat([group("baseline"), group("single-gpu"), group("gpt")]),
                                             f"Training loss{suffix}"))
    return figures


def _memory_metric(results: pd.DataFrame) -> tuple[str, str]:
    """nvidia-smi's GPU 0 peak where a GPU monitor ran; else the tensor bytes of rank 0 at the step's peak
    (what ZeRO and FSDP shrink, counted even on a CPU); else the engine's own per-rank peak."""
    if "gpu0_peak_mib" in results and results["gpu0_peak_mib"].notna().any():
        return "gpu0_peak_mib", "nvidia-smi, GPU 0"
    if "rank0_step_peak_mib" in results and results["rank0_step_peak_mib"].notna().any():
        return "rank0_step_peak_mib", "tensor bytes at the step's peak, rank 0"
    kinds = results.get("allocated_kind")
    kind = next((str(k) for k in kinds.dropna()), "engine peak") if kinds is not None else "engine peak"
    return "allocated_peak_mib", kind.replace("_", " ")


def _throughput_plot(series: dict[str, pd.DataFrame], title: str):
    """Training samples/s against GPUs, one line per series, with the ideal line from the first point
    (weak scaling: the total throughput should grow in proportion to the GPUs)."""
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4), constrained_layout=True)
    axes.set_title(title)
    axes.set_xlabel("GPUs")
    axes.set_ylabel("train samples/s (all GPUs)")
    axes.grid(alpha=0.3)
    base, ticks = None, set()
    for label, results in series.items():
        done = results[(results["state"] == COMPLETED) & results["train_samples_per_s"].notna()].sort_values("gpus")
        if done.empty:
            continue
        if base is None:
            base = done.iloc[0]
        axes.plot(done["gpus"], done["train_samples_per_s"], "o-", label=label)
        ticks.update(int(g) for g in done["gpus"])
    if base is not None:
        xs = sorted(ticks)
        axes.plot(xs, [base["train_samples_per_s"] * x / base["gpus"] for x in xs], "--", color="grey",
                  label="ideal")
        axes.set_xticks(xs)
        axes.legend()
    return figure


# ---- the whole chapter ----------------------------------------------------------------------------
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
    from workshop_lib.experiments import summary_row

    left = {experiment.id for experiment, _ in selection.left_out}
    rows = []
    for experiment in selection.chosen:
        row = summary_row(experiment)
        rows.append({"id": row["id"], "nodes": row["nodes"], "GPUs": row["gpus"], "engine": row["engine"],
                     "knobs": row["knobs"], f"on {selection.profile.name}": "no" if row["id"] in left else "yes"})
    frame = pd.DataFrame(rows)
    runs_here = sum(row[f"on {selection.profile.name}"] == "yes" for row in rows)
    # Folded: the list is reference material, the chapter's narrative reads on without it.
    _display(_html(f"<details><summary>The chapter's {len(rows)} experiments ({runs_here} run on profile "
                   f"{_escape(selection.profile.name)})</summary>"
                   + scrollable(frame.to_html(index=False, border=0, classes="workshop-experiments")) + "</details>"))
    return frame


__all__ = ["Selection", "chapter_figures", "chapter_header", "chapter_results_for", "check_experiment",
           "experiments_overview", "message", "profile_title", "reference_caption", "reference_results",
           "repository_root", "resolve_runs_dir", "run_experiments", "select", "selection_tables", "show_figure",
           "show_figures", "show_plots", "show_reference_script", "show_reference_tables", "show_results",
           "engine_text", "engine_title",
           "show_scripts", "show_tables", "show_time_plan", "submitting_enabled", "table_html"]

