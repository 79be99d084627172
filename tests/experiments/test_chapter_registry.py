"""The chapters are declared once (workshop_lib.experiments.CHAPTER_SPECS) and everything that lists chapters
follows that declaration; experiment ids named in the book's sentences and figures go through one lookup that
refuses a misspelt id."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml
from repo_paths import REPO

from workshop_lib.book import parts
from workshop_lib.book.calculator.measured_runs import PRESET_CHAPTERS, chapter_presets
from workshop_lib.book.claims import figures
from workshop_lib.book.claims import sentences as claims
from workshop_lib.book.tables import render
from workshop_lib.cli.main import build_parser
from workshop_lib.core.errors import WorkshopError
from workshop_lib.core.vocabulary import HF
from workshop_lib.experiments import (
    CHAPTER_SPECS,
    CHAPTERS,
    Experiment,
    all_experiments,
    chapter_experiments,
    get_experiment,
    known_id,
)
from workshop_lib.results import COMPLETED
from workshop_lib.sites.profiles import PROFILES_DIR, ProfileError, load_profile
from workshop_lib.widgets import builder, form

ROOT = REPO
NUMBERS = tuple(spec.number for spec in CHAPTER_SPECS)


# ---- the registry itself --------------------------------------------------------------------------------


def test_the_registry_numbers_chapters_from_one_without_gaps_and_each_matrix_is_its_own():
    assert NUMBERS == tuple(range(1, len(NUMBERS) + 1))
    assert tuple(CHAPTERS) == NUMBERS
    for spec in CHAPTER_SPECS:
        rows = spec.experiments()
        assert rows and all(row.chapter == spec.number for row in rows), spec.number
        assert get_experiment(spec.start).chapter == spec.number, f"chapter {spec.number} starts on another's row"
        unknown = set(spec.knobs) - {field for field in Experiment.__dataclass_fields__}
        assert not unknown, f"chapter {spec.number} names knobs that are not Experiment fields: {unknown}"
    assert [row.chapter for row in all_experiments()] == sorted(row.chapter for row in all_experiments())


def test_an_unknown_chapter_is_an_error_listing_the_registrys_chapters():
    missing = max(NUMBERS) + 1
    for call in (lambda: chapter_experiments(missing), lambda: parts.lookup(missing, "baseline"),
                 lambda: render.chapter_tables(missing)):
        with pytest.raises(WorkshopError, match=rf"there is no chapter {missing}: choose one of \[1, 2, 3, 4"):
            call()


# ---- what derives from it ---------------------------------------------------------------------------------


def _chapter_choices(*command: str) -> tuple:
    """The --chapter choices of a `workshop` subcommand, read from the parser the command line uses."""
    parser = build_parser()
    for word in command:
        parser = next(action.choices[word] for action in parser._actions
                      if isinstance(action.choices, dict) and word in action.choices)
    option = next(action for action in parser._actions if "--chapter" in action.option_strings)
    return tuple(option.choices)


@pytest.mark.parametrize("command", [("experiments",), ("submit",), ("status",), ("cancel",), ("collect",),
                                     ("class", "publish"), ("class", "pool")], ids=" ".join)
def test_every_chapter_option_of_the_command_line_offers_the_registrys_chapters(command):
    assert _chapter_choices(*command) == NUMBERS


def test_the_calculator_presets_the_form_and_the_book_parts_follow_the_registry():
    assert PRESET_CHAPTERS == NUMBERS
    assert list(chapter_presets()) == [str(number) for number in NUMBERS]
    assert tuple(parts.PARTS) == NUMBERS, "every chapter has its parts in book/parts.py, and only those"
    assert tuple(render._BUILDERS) == NUMBERS, "every chapter has a table builder, and only those"
    widget = builder.ExperimentBuilder(chapter=NUMBERS[-1], interactive=False)
    assert [value for _, value in widget.choices("chapter")] == list(NUMBERS)
    assert form.START_ROWS == {spec.number: spec.start for spec in CHAPTER_SPECS}
    knobs = {knob for spec in CHAPTER_SPECS for knob in spec.knobs}
    assert knobs <= set(form.CONTROL_NAMES), "every knob of a chapter's track has a control"
    for control in form.CONTROLS:
        if control.name in knobs:
            assert control.chapters == tuple(spec.number for spec in CHAPTER_SPECS if control.name in spec.knobs)
    # The NeMo chapters' form (peft, TP, EP, SP) is exactly where every row of the matrix runs NeMo.
    assert form.NEMO_CHAPTERS == tuple(spec.number for spec in CHAPTER_SPECS if "peft" in spec.knobs)


def test_a_profile_may_set_a_time_limit_for_each_chapter_of_the_registry_and_no_other(tmp_path):
    data = yaml.safe_load((PROFILES_DIR / "ibex.yml").read_text())
    data["scheduler"]["time_limits"] = {number: "00:30:00" for number in NUMBERS}
    (tmp_path / "every.yml").write_text(yaml.safe_dump(data))
    assert set(load_profile(tmp_path / "every.yml").scheduler.time_limits) == set(NUMBERS)
    data["scheduler"]["time_limits"] = {max(NUMBERS) + 1: "00:30:00"}
    (tmp_path / "beyond.yml").write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError, match=rf"expected a chapter number \(1 to {max(NUMBERS)}\)"):
        load_profile(tmp_path / "beyond.yml")


# ---- experiment ids in the book's sentences and figures -------------------------------------------------


def test_a_misspelt_id_raises_naming_the_closest_ids():
    assert known_id("zero/single-gpu/zero2-offload") == "zero/single-gpu/zero2-offload"
    with pytest.raises(WorkshopError, match=r"unknown experiment id 'zero/single-gpu/zero2-ofload': did you mean "
                                            r"'zero/single-gpu/zero2-offload'"):
        known_id("zero/single-gpu/zero2-ofload")
    with pytest.raises(WorkshopError, match="no known id is close to it"):
        known_id("nothing/like/it")


def test_a_claim_asking_for_a_misspelt_id_raises_instead_of_dropping_its_sentence():
    row = {"id": "zero/single-gpu/zero2", "state": COMPLETED, "engine": HF, "group": "single-gpu"}
    runs = claims._runs(pd.DataFrame([row]), HF)
    assert runs.get("zero/single-gpu/zero2-offload") is None, "a known id without a run reads as not measured"
    assert runs["zero/single-gpu/zero2"]["group"] == "single-gpu"
    for lookup in (lambda: runs.get("zero/single-gpu/zero-2"), lambda: runs["zero/singel-gpu/zero2"],
                   lambda: "zero/single-gpu/zero2 " in runs):
        with pytest.raises(WorkshopError, match="unknown experiment id"):
            lookup()


_ID = re.compile(r"(lora|model-parallel|zero|fsdp|scaling)/[a-z0-9-]+(/[a-z0-9-]+)?")


def _literal_ids(module) -> set[str]:
    """Every string constant of the module that has the shape of an experiment id (defaults included). Pieces of
    f-strings are left out: the ids they build are looked up when tests/test_book_claims.py writes the sentences."""
    tree = ast.parse(Path(module.__file__).read_text())
    pieces = {id(value) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for value in node.values}
    return {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and id(node) not in pieces
            and isinstance(node.value, str) and _ID.fullmatch(node.value)}


@pytest.mark.parametrize("module", [claims, figures], ids=lambda module: module.__name__)
def test_every_id_the_sentences_and_figures_name_is_an_experiment(module):
    named = _literal_ids(module)
    assert named, f"found no experiment id in {module.__name__}: the pattern no longer matches how they are written"
    assert all(known_id(experiment_id) == experiment_id for experiment_id in sorted(named))
