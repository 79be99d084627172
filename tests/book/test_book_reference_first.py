"""The built book puts real measurements first and says where they ran; tiny tables say what they are.

For every chapter page with reference data (book/reference/chapter<N>.json): in each section that shows
result tables, the first one is a reference table with a provenance caption (or a note that this part has
no reference measurement), the participant's tables come after it titled by their profile, and every
sentence generated from the reference data (`workshop_lib.book.claims.sentences`, checked against the JSON in
tests/book/test_book_claims.py) is on the page. A book built without runs says so where the runs' tables
would be; a book built after the tiny chapters ran names every tiny model as a stand-in.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from book_fixtures import built_book, executed_chapters  # noqa: F401 - session fixtures
from repo_paths import REPO
from test_book_config import copy_book, jupyter_book

ROOT = REPO
CHAPTERS = {1: "notebooks/01_data_parallel_lora", 2: "notebooks/02_model_parallel",
            3: "notebooks/03_deepspeed_zero", 4: "notebooks/04_fsdp"}
PARTS = {1: 2, 2: 2, 3: 4, 4: 4}  # results parts of each chapter (chapters 1-2: Llama and Mixtral)
PROVENANCE = re.compile(r"^Reference, measured on real GPUs: .*(H100|H200|A100|GPU).*\d{4}-\d{2}-\d{2}.*"
                        r"Source: (book/reference|benchmarks/results)/\S+\.json\.$", re.S)


def _soup(page: Path):
    bs4 = pytest.importorskip("bs4")
    return bs4.BeautifulSoup(page.read_text(), "html.parser")


def _blocks(section):
    """The result blocks directly in this section (not in a nested one), in page order."""
    found = section.select("div.workshop-table-block, div.workshop-reference-missing")
    return [block for block in found if block.find_parent("section") is section]


def _plain(text: str) -> str:
    """Text without Markdown marks and without whitespace (HTML puts spaces around inline elements)."""
    text = text.translate(str.maketrans("‘’“”", "''\"\""))  # Sphinx's smart quotes
    return re.sub(r"\s+", "", text.replace("**", "").replace("*", "").replace("`", ""))


def check_reference_first(page: Path) -> int:
    """Assert the reference-first rule on one built chapter page; returns how many sections it checked."""
    soup = _soup(page)
    checked = 0
    for section in soup.find_all("section"):
        blocks = _blocks(section)
        if not blocks:
            continue
        checked += 1
        title = section.find(re.compile("^h[1-6]$")).get_text(" ", strip=True)
        first = blocks[0]
        classes = first.get("class", [])
        if "workshop-reference-missing" in classes:
            assert "No reference measurement" in first.get_text(), title
        else:
            assert "workshop-reference" in classes, f"{page.name}, {title!r}: the first table is not a reference"
            caption = first.select_one("p.workshop-provenance")
            assert caption is not None, f"{page.name}, section {title!r}: reference table without provenance"
            assert PROVENANCE.match(caption.get_text(" ", strip=True)), caption.get_text(" ", strip=True)
        seen_participant = False
        for block in blocks:
            kind = "participant" if "workshop-participant" in block.get("class", []) else "reference"
            if kind == "participant":
                seen_participant = True
                assert block.get("data-profile"), f"{title}: a participant table without its profile"
                assert block.select_one("p.workshop-provenance").get_text().startswith("Your runs — ")
            else:
                assert not seen_participant, f"{page.name}, section {title!r}: a reference after your runs"
    return checked


def check_stand_ins(page: Path) -> int:
    """No table of a stand-in profile names a real model except as "stand-in for …"; returns tables seen."""
    from workshop_lib.book.tables import MODEL_NAMES, stand_in_names
    from workshop_lib.sites.profiles import load_profile

    soup = _soup(page)
    tables = soup.select("div.workshop-participant")
    for block in tables:
        names = stand_in_names(load_profile(block["data-profile"]))
        text = block.get_text(" ", strip=True)
        for real in MODEL_NAMES.values():
            if real not in names:
                continue
            bare = [m.start() for m in re.finditer(re.escape(real), text)
                    if not text[:m.start()].endswith("stand-in for ")]
            assert not bare, f"{page.name}: {block.h4.get_text()!r} names {real} without 'stand-in'"
    return len(tables)


def check_claims(page: Path, chapter: int) -> None:
    """Every generated sentence of the chapter is on the page, as generated from the reference JSON."""
    from workshop_lib.book.claims import sentences as claims
    from workshop_lib.book.reference.chapter_views import reference_results

    generators = {3: [("chapter3", claims.zero_one_gpu), ("chapter3", claims.zero_two_gpus),
                      ("chapter3", claims.model_states_versus_peak), ("chapter3", claims.zero_weak_scaling),
                      ("chapter3", claims.losses_differ), ("engine_scaling", claims.engine_scaling)],
                  4: [("chapter4", claims.fsdp_strategies), ("chapter4", claims.fsdp_one_node), ("chapter4", claims.fsdp_single_gpu),
                      ("chapter4", claims.gpt_depth), ("chapter4", claims.gpt_architecture)]}
    text = _plain(_soup(page).get_text(" "))
    for source, generate in generators.get(chapter, []):
        sentence = _plain(generate(reference_results(source)[1]))
        assert sentence and sentence in text, f"{page.name}: the generated {generate.__name__} text is missing"


@pytest.fixture(scope="module")
def book_without_runs(tmp_path_factory):
    """The book built as `make book` builds it (read only, warnings as errors) with no runs at all."""
    build = tmp_path_factory.mktemp("book")
    copy_book(build, execute="force")
    empty = tmp_path_factory.mktemp("no-runs")
    environment = {**os.environ, "WORKSHOP_SUBMIT": "0", "WORKSHOP_RUNS_DIR": str(empty), "WORKSHOP_ROOT": str(ROOT),
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([jupyter_book(), "build", str(build), "-W", "--keep-going"], capture_output=True,
                            text=True, timeout=1500, env=environment)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    return build / "_build" / "html"


@pytest.mark.slow
@pytest.mark.parametrize("chapter", sorted(CHAPTERS))
def test_reference_first_with_provenance_and_generated_claims(book_without_runs, chapter):
    if not (ROOT / "book" / "reference" / f"chapter{chapter}.json").is_file():
        pytest.skip(f"no reference measurement for chapter {chapter} yet (book/reference/chapter{chapter}.json)")
    page = book_without_runs / f"{CHAPTERS[chapter]}.html"
    assert check_reference_first(page) >= PARTS[chapter], "fewer results sections than the chapter has parts"
    check_claims(page, chapter)
    assert "No completed run of chapter" in _soup(page).get_text(), "a build without runs must say so"


@pytest.mark.slow
@pytest.mark.cluster
def test_tiny_tables_name_their_models_as_stand_ins(built_book):  # noqa: F811 - the session fixture
    seen = 0
    for chapter, page in CHAPTERS.items():
        html = built_book.html_dir / f"{page}.html"
        seen += check_stand_ins(html)
        if (ROOT / "book" / "reference" / f"chapter{chapter}.json").is_file():
            check_reference_first(html)
    assert seen, "the tiny chapters ran but the book shows none of their tables"


@pytest.mark.slow  # over 5 s on a loaded 2-core machine
def test_show_results_puts_the_reference_first_then_your_runs_by_profile(tmp_path, capsys, monkeypatch):
    """The notebook call itself, outside a kernel: reference blocks, then the participant's, in that order."""
    import json

    import matplotlib

    from workshop_lib.book.chapter import facade as nb
    from workshop_lib.book.claims import figures
    from workshop_lib.results import chapter as results_module

    matplotlib.use("Agg")
    monkeypatch.setenv("WORKSHOP_SUBMIT", "0")
    selection = nb.select(4, "tiny", ["fsdp/single-gpu/full-shard", "fsdp/multi-gpu/2-gpus"])
    nb.show_results(selection, ["multi-gpu"], tmp_path, plots=False)
    out = capsys.readouterr().out
    assert out.index('class="workshop-table-block workshop-reference"') < out.index("No completed run of chapter 4")
    assert "Reference, measured on real GPUs:" in out
    for experiment_id, gpus in (("fsdp/single-gpu/full-shard", 1), ("fsdp/multi-gpu/2-gpus", 2)):
        folder = tmp_path / experiment_id / "train"
        folder.mkdir(parents=True)
        summary = {"kind": "summary", "engine": "fsdp", "world_size": gpus, "model": "tiny-bloom",
                   "train_runtime_s": 2.0, "mean_step_time_s": 0.5 * gpus, "samples_per_s": 1.0, "final_loss": 5.0,
                   "settings": {"max_steps": 3}, "model_state_bytes_per_rank": [2**20 / gpus] * gpus}
        (folder / "metrics.jsonl").write_text(json.dumps(summary) + "\n")
    parsed = []  # the run folders read, each time: tables and plots must share one reading
    read_run = results_module.read_run
    monkeypatch.setattr(results_module, "read_run",
                        lambda folder, *args: parsed.append(folder) or read_run(folder, *args))
    titles, show_figures = [], figures.show_figures
    monkeypatch.setattr(figures, "show_figures", lambda shown: titles.extend(f.axes[0].get_title() for f in shown)
                        or show_figures(shown))
    nb.show_results(selection, ["multi-gpu"], tmp_path)
    assert sorted(parsed) == sorted(tmp_path / e.id for e in selection.runnable), "each run folder parsed once"
    assert any(title.endswith("(your runs, tiny)") for title in titles), f"no plot of your runs in {titles}"
    out = capsys.readouterr().out
    reference = out.index('class="workshop-table-block workshop-reference"')
    mine = out.index('class="workshop-table-block workshop-participant" data-profile="tiny"')
    assert reference < mine
    assert "tiny-bloom (stand-in for BLOOM-560m), FSDP on one node" in out[mine:]
    assert "Your runs — tiny CPU stand-in" in out[mine:]
