"""A chapter's parts are declared once (workshop_lib.book.parts): the notebooks' keys, the tables and the figures
agree with that declaration, and a key it does not have is an error that names the chapter's parts."""

from __future__ import annotations

import re

import matplotlib
import pytest
from repo_paths import REPO

from workshop_lib.book import parts
from workshop_lib.book.chapter import facade as nb
from workshop_lib.book.claims import figures
from workshop_lib.book.reference.chapter_views import reference_results, reference_shown
from workshop_lib.book.tables import tables_from_results
from workshop_lib.core.errors import WorkshopError

matplotlib.use("Agg")
ROOT = REPO


def test_a_misspelt_part_is_an_error_naming_the_chapters_parts(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORKSHOP_SUBMIT", "0")
    with pytest.raises(WorkshopError) as raised:
        nb.show_results(nb.select(3, "tiny"), ["singel-gpu"], tmp_path)
    assert str(raised.value).startswith("chapter 3 has parts baseline, single-gpu, multi-gpu, two-gpus, multi-node, "
                                        "prediction; got 'singel-gpu'")
    assert capsys.readouterr().out == "", "nothing is shown before the key is checked"


@pytest.mark.parametrize("notebook", sorted((ROOT / "notebooks").glob("0*.py")), ids=lambda path: path.stem)
def test_every_key_a_notebook_shows_is_a_part_of_its_chapter(notebook):
    chapter = int(notebook.name[:2])
    calls = re.findall(r"show_results\(selection, \[([^\]]*)\]", notebook.read_text())
    assert calls, f"{notebook.name} shows no part"
    for call in calls:
        keys = re.findall(r'"([^"]+)"', call)
        assert [part.key for part in parts.lookup(chapter, keys)] == keys


@pytest.mark.parametrize("chapter", [1, 2, 3, 4])
@pytest.mark.slow  # over 5 s on a loaded 2-core machine
def test_the_tables_a_chapter_builds_are_the_tables_its_parts_declare(chapter):
    built = {table.key for table in tables_from_results(chapter, reference_shown(chapter)[1])}
    assert built == set(parts.table_keys(parts.PARTS[chapter]))


@pytest.mark.slow  # over 5 s on a loaded 2-core machine
def test_a_figure_only_part_shows_its_figure_without_tables(tmp_path, monkeypatch, capsys):
    [memory] = parts.lookup(1, ["memory"])
    assert memory.tables == ()
    [figure] = figures.chapter_figures([memory], reference_results(1)[1], "reference, real GPUs")
    assert figure.axes[0].get_title().startswith("Peak memory per process")
    monkeypatch.setenv("WORKSHOP_SUBMIT", "0")
    nb.show_results(nb.select(1, "tiny"), ["memory"], tmp_path)
    out = capsys.readouterr().out
    assert "Figure(" in out and "workshop-table-block" not in out and "No reference measurement" not in out
