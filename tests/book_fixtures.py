"""Session fixtures shared by test_notebooks.py and test_book_browser.py: execute every chapter once, build once.

Both test modules import these fixtures. Pytest keeps a session fixture per module that defines (or
imports) it, so the expensive work is memoised here and done once per test process, whichever module
asks first.

The chapters run with papermill on the tiny profile against the local SLURM cluster, into a temporary
folder; their runs go to the workshop's runs folder (``workshop_lib.book.chapter.your_runs.resolve_runs_dir``), where
completed runs are reused, exactly as a participant re-running a chapter would see. The book is then
built into a temporary folder (never the checkout's ``_build/html``, the user's own book) with warnings as
errors while $WORKSHOP_SUBMIT=0, so the build can only read.
"""

from __future__ import annotations

import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOT_DIR = ROOT / "_build" / "screenshots"

_MEMO: dict[str, object] = {}


@dataclass
class ExecutedChapters:
    runs_dir: Path
    output_dir: Path
    chapters: list  # workshop_lib.cli.demo.ChapterRun, in chapter order


@dataclass
class BuiltBook:
    html_dir: Path
    jobs_before: dict[int, dict[str, str]]  # chapter -> experiment id -> job id, before the build
    jobs_after: dict[int, dict[str, str]]


def _need_book_tools() -> None:
    for module in ("papermill", "jupytext", "nbformat"):
        pytest.importorskip(module)
    if not (Path(sys.executable).parent / "jupyter-book").exists() and not shutil.which("jupyter-book"):
        pytest.skip("jupyter-book is not installed (make setup)")


def _execute_all(output_dir: Path, say) -> ExecutedChapters:
    """Every chapter, with a line as each starts and ends and as each of its jobs moves on: this is the largest part of
    `make test`'s time (about 21 minutes on 2 cores), which pytest's dots would spend in silence."""
    from workshop_lib.book.chapter.your_runs import resolve_runs_dir
    from workshop_lib.cli.demo import chapter_notebooks, execute_and_account

    runs_dir = resolve_runs_dir()
    chapters = []
    notebooks = chapter_notebooks()
    started = time.monotonic()
    for number, path in enumerate(notebooks, 1):
        say(f"chapter {number}/{len(notebooks)} {path.stem}: executing with papermill (tiny profile, local SLURM)")
        run = execute_and_account(path, "tiny", output_dir, runs_dir, show_progress=True, echo=say)
        done = sum(state == "COMPLETED" for state in run.states.values())
        say(f"chapter {number}/{len(notebooks)} {path.stem}: done in {run.seconds:.0f} s, {done} of "
            f"{len(run.states)} runs completed ({len(run.submitted)} submitted now)")
        chapters.append(run)
    say(f"all chapters executed in {time.monotonic() - started:.0f} s")
    return ExecutedChapters(runs_dir, output_dir, chapters)


def _build(executed: ExecutedChapters, output: Path) -> BuiltBook:
    from workshop_lib.cli.demo import build_book, chapter_number, run_snapshot

    numbers = [chapter_number(run.notebook) for run in executed.chapters]
    before = {n: run_snapshot(n, executed.runs_dir) for n in numbers}
    # Into pytest's folder: the checkout's _build/html is the book the user built (`make demo`, `make book`).
    html_dir = build_book(read_only=True, output=output)
    after = {n: run_snapshot(n, executed.runs_dir) for n in numbers}
    return BuiltBook(html_dir, before, after)


def executed_so_far() -> ExecutedChapters | None:
    """The chapters this test process has already executed, or None: for tests that can read runs the session
    already has instead of training the same experiments again."""
    return _MEMO.get("executed")


@pytest.fixture(scope="session")
def executed_chapters(local_cluster, progress_line, tmp_path_factory) -> ExecutedChapters:
    """Every chapter notebook executed once with papermill (tiny profile)."""
    _need_book_tools()
    if "executed" not in _MEMO:
        _MEMO["executed"] = _execute_all(tmp_path_factory.mktemp("chapters"), progress_line)
    return _MEMO["executed"]


@pytest.fixture(scope="session")
def built_book(executed_chapters, progress_line, tmp_path_factory) -> BuiltBook:
    """The book built once into _build/html after the chapters ran (jupyter-book build -W)."""
    if "book" not in _MEMO:
        say = progress_line
        say("building the book from those runs (jupyter-book, warnings as errors; a few minutes)")
        started = time.monotonic()
        _MEMO["book"] = _build(executed_chapters, tmp_path_factory.mktemp("book"))
        say(f"book built in {time.monotonic() - started:.0f} s")
    return _MEMO["book"]
