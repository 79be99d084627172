"""The chapter notebooks and their glue (workshop_lib.book.chapter.facade and the modules beside it).

The slow tests execute every chapter with papermill on the tiny profile against the local SLURM cluster
and check what a reader gets: each chapter's seed tables filled with numbers from runs that completed
(no placeholder, no failed or missing row), plots drawn from those runs, the book built with warnings
as errors, and no job submitted by the build or by running a chapter again. The fast ones check the
notebooks' shape and the glue's decisions (where runs live, read-only mode, selections).
"""

from __future__ import annotations

import math
import re
import subprocess
import sys

import nbformat
import pandas as pd
import pytest
from book_fixtures import ROOT, built_book, executed_chapters  # noqa: F401  (session fixtures)

slow_cluster = [pytest.mark.slow, pytest.mark.cluster]
CHAPTER_FILES = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))

# Cells that describe the experiment (never measured) in the tables' first columns.
DESCRIPTIVE = {"GPUs", "Batch per GPU", "Setup", "Total GPUs", "DeepSpeed Config", "Metric", "Category",
               "Source", "Num Layers", "Per-GPU Batch"}
STATE_WORDS = {"MISSING", "FAILED", "TIMEOUT", "CANCELLED", "INCOMPLETE", "NOT SUBMITTED", "UNKNOWN",
               "OUT_OF_MEMORY", "NODE_FAIL", "PENDING", "RUNNING"}


def _number(value) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return None if math.isnan(value) else float(value)
    text = str(value)
    if re.fullmatch(r"\d{2}:\d{2}:\d{2}", text):  # HH:MM:SS
        hours, minutes, seconds = map(int, text.split(":"))
        return float(hours * 3600 + minutes * 60 + seconds)
    try:
        return float(text)
    except ValueError:
        return None


def _measured_cells(frame: pd.DataFrame) -> list:
    return [value for column in frame.columns if column not in DESCRIPTIVE for value in frame[column]]


def _outputs(path) -> tuple[list[str], int]:
    """(HTML outputs, number of PNG images) of an executed notebook."""
    notebook = nbformat.read(str(path), as_version=4)
    html, images = [], 0
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "text/html" in data:
                html.append("".join(data["text/html"]))
            images += "image/png" in data
    return html, images


@pytest.mark.slow
@pytest.mark.cluster
def test_every_run_of_every_chapter_completed(executed_chapters):
    for run in executed_chapters.chapters:
        assert run.jobs, f"{run.notebook.name} selected no experiment for the tiny profile"
        not_completed = {i: s for i, s in run.states.items() if s != "COMPLETED"}
        assert not not_completed, f"{run.notebook.name}: runs that did not complete: {not_completed}"


@pytest.mark.slow
@pytest.mark.cluster
def test_tables_hold_numbers_from_real_runs(executed_chapters):
    from workshop_lib.book.chapter.selection import select
    from workshop_lib.book.chapter.your_runs import selection_tables
    from workshop_lib.cli.demo import chapter_number, notebook_parameters

    for run in executed_chapters.chapters:
        chapter = chapter_number(run.notebook)
        selection = select(chapter, "tiny", notebook_parameters(run.notebook).get("experiments"))
        tables = selection_tables(selection, executed_chapters.runs_dir)
        assert tables, f"chapter {chapter}: no table"
        for table in tables:
            cells = _measured_cells(table.frame)
            states = [cell for cell in cells if str(cell) in STATE_WORDS]
            assert not states, f"chapter {chapter}, {table.title!r}: cells show run states {states}"
            numbers = [n for n in map(_number, cells) if n is not None]
            assert numbers, f"chapter {chapter}, {table.title!r}: no measured number\n{table.frame}"
            assert any(n != 0 for n in numbers), f"chapter {chapter}, {table.title!r}: only zeros"
        # Every run's job really ran: its log footer gave a total time, and the trainer a loss.
        for experiment_id in run.jobs:
            assert run.job_seconds.get(experiment_id, 0) > 0, f"{experiment_id}: no job time in its log"


@pytest.mark.slow
@pytest.mark.cluster
def test_executed_notebooks_show_tables_plots_and_scripts(executed_chapters):
    for run in executed_chapters.chapters:
        html, images = _outputs(executed_chapters.output_dir / f"{run.notebook.stem}.ipynb")
        page = "\n".join(html)
        assert page.count('class="dataframe workshop-table"') >= 1, f"{run.notebook.name}: no result table shown"
        assert "<details>" in page and "#SBATCH" in page, f"{run.notebook.name}: no folded job script"
        assert "workshop-warning" not in page, f"{run.notebook.name} showed a warning:\n" + "\n".join(
            block for block in html if "workshop-warning" in block)
        assert images >= 2, f"{run.notebook.name}: {images} plot(s), expected at least 2"


@pytest.mark.slow
@pytest.mark.cluster
def test_the_book_build_submits_nothing(built_book):
    assert (built_book.html_dir / "index.html").is_file()
    assert built_book.jobs_after == built_book.jobs_before, "the book build submitted jobs"
    for stem in ("01_data_parallel_lora", "02_model_parallel", "03_deepspeed_zero", "04_fsdp"):
        page = (built_book.html_dir / "notebooks" / f"{stem}.html").read_text()
        assert "workshop-table" in page, f"{stem}: the built page has no result table"


@pytest.mark.slow
@pytest.mark.cluster
def test_running_a_chapter_again_reuses_its_runs(executed_chapters, tmp_path):
    from workshop_lib.cli.demo import execute_and_account

    first = executed_chapters.chapters[0]
    again = execute_and_account(first.notebook, "tiny", tmp_path, executed_chapters.runs_dir)
    assert again.submitted == [], f"re-running {first.notebook.name} resubmitted {again.submitted}"
    assert again.jobs == first.jobs


# ---- fast: the notebooks' shape and the glue ------------------------------------------------------
def test_four_chapters_with_a_papermill_parameters_cell():
    import jupytext

    assert [path.stem for path in CHAPTER_FILES] == ["01_data_parallel_lora", "02_model_parallel",
                                                     "03_deepspeed_zero", "04_fsdp"]
    for path in CHAPTER_FILES:
        text = path.read_text()
        assert "formats:" not in text.split("# %%")[0], f"{path.name}: a jupytext formats header breaks the book"
        assert not re.search(r"^\s*(import torch|from torch)", text, re.M), f"{path.name} imports torch"
        cells = jupytext.read(path).cells
        assert cells[0].cell_type == "markdown" and cells[0].source.startswith("# Chapter"), path.name
        tagged = [cell for cell in cells if "parameters" in cell.metadata.get("tags", [])]
        assert len(tagged) == 1, f"{path.name}: needs exactly one parameters cell"
        values: dict = {}
        exec(tagged[0].source, {}, values)
        assert values["profile"] == "tiny" and values["runs_dir"] is None and values["wait_timeout_s"] > 0
        assert "experiments" in values
        assert "{doc}`../book/answers`" in text and "{doc}`../book/seed_corrections`" in text, path.name


@pytest.mark.slow  # over 5 s on a loaded 2-core machine
def test_the_notebook_side_does_not_import_torch():
    code = ("import sys, workshop_lib.book.chapter.facade, workshop_lib.cli.demo; workshop_lib.book.chapter.facade.show_recipe_benchmark(); "
            "assert 'torch' not in sys.modules, 'torch'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_runs_dir_is_the_repository_runs_folder_from_any_working_folder(monkeypatch):
    from workshop_lib.book.chapter import your_runs

    monkeypatch.delenv("WORKSHOP_RUNS_DIR", raising=False)
    monkeypatch.delenv("WORKSHOP_ROOT", raising=False)
    monkeypatch.chdir(ROOT / "notebooks")  # where Jupyter Book executes a chapter
    assert your_runs.resolve_runs_dir() == ROOT / "runs"
    monkeypatch.setenv("WORKSHOP_RUNS_DIR", "somewhere/relative")
    assert your_runs.resolve_runs_dir() == (ROOT / "notebooks" / "somewhere" / "relative").resolve()


def test_selection_keeps_chapter_order_and_says_what_the_profile_leaves_out():
    from workshop_lib.book.chapter.selection import select
    from workshop_lib.core.errors import WorkshopError

    chosen = select(1, "tiny", ["lora/llama/8-gpus", "lora/llama/1-gpu"])
    assert [e.id for e in chosen.chosen] == ["lora/llama/1-gpu", "lora/llama/8-gpus"]
    assert [e.id for e in chosen.runnable] == ["lora/llama/1-gpu"]
    assert "8 GPUs" in chosen.left_out[0][1]
    with pytest.raises(WorkshopError, match="another chapter"):
        select(1, "tiny", ["zero/baseline"])


def test_read_only_mode_submits_nothing_and_says_so(monkeypatch, tmp_path, capsys):
    from workshop_lib.book.chapter import facade as nb
    from workshop_lib.book.chapter.your_runs import SUBMIT_VARIABLE, show_tables

    monkeypatch.setenv(SUBMIT_VARIABLE, "0")
    selection = nb.select(1, "tiny", ["lora/llama/1-gpu"])
    runs = nb.run_experiments(selection, tmp_path)
    assert [run.record for run in runs] == [None]
    assert not any(tmp_path.iterdir()), "read-only mode wrote a run folder"
    assert "NOT SUBMITTED" in capsys.readouterr().out
    assert show_tables(selection, tmp_path) == []
    assert "No completed run of chapter 1" in capsys.readouterr().out


def test_scripts_are_folded_with_their_findings(capsys):
    from workshop_lib.book.chapter.facade import select, show_scripts

    blocks = show_scripts(select(1, "tiny", ["lora/llama/1-gpu", "lora/llama/8-gpus"]))
    assert len(blocks) == 2 and all(block.startswith("<details>") for block in blocks)
    assert "--ntasks-per-node=1" in blocks[0] and "workshop_lib.train.lora" in blocks[0]
    assert "nemo llm finetune" in blocks[1] and "profile ibex" in blocks[1]  # 8 GPUs: shown as Ibex runs it
