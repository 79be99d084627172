"""What a built page prints: no folders of the machine that built it, no packages a run did not use, tables that scroll."""

from workshop_lib.book.chapter import facade as nb
from workshop_lib.book.chapter.your_runs import shown_path
from workshop_lib.book.pages.html import table_html
from workshop_lib.book.reference.chapter_views import reference_caption


def test_a_runs_folder_inside_the_workshop_is_shown_relative(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKSHOP_ROOT", str(tmp_path))
    (tmp_path / "runs").mkdir()
    assert shown_path(tmp_path / "runs") == "runs/"


def test_a_runs_folder_chosen_by_the_variable_is_named_by_it(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKSHOP_ROOT", str(tmp_path / "workshop"))
    monkeypatch.setenv("WORKSHOP_RUNS_DIR", str(tmp_path / "elsewhere"))
    assert shown_path(tmp_path / "elsewhere") == "$WORKSHOP_RUNS_DIR"
    monkeypatch.delenv("WORKSHOP_RUNS_DIR")
    assert shown_path(tmp_path / "elsewhere") == str((tmp_path / "elsewhere").resolve())


def test_the_chapter_header_shows_the_relative_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORKSHOP_ROOT", str(tmp_path))
    monkeypatch.setenv("WORKSHOP_SUBMIT", "0")
    nb.chapter_header(3, "tiny", None, tmp_path / "runs")
    out = capsys.readouterr().out
    assert "runs in runs/;" in out and str(tmp_path) not in out


def test_reference_captions_list_only_software_the_reference_machine_had():
    from workshop_lib.book.reference.chapter_views import reference_series

    data, results = nb.reference_results(1)
    assert "unavailable" in str(data["provenance"][0].get("deepspeed"))  # chapter 1's stand-in ran without it
    for choice, frame in reference_series(1):
        caption = reference_caption(data, frame, "book/reference/chapter1.json", choice)
        assert "DeepSpeed" not in caption and "unavailable" not in caption and "torch 2.11" in caption


def test_wide_tables_scroll_inside_the_text_column():
    import pandas as pd

    from workshop_lib.book.tables import Table

    html = table_html(Table("wide", pd.DataFrame([{f"column {i}": i for i in range(40)}])))
    assert 'class="workshop-scroll" style="overflow-x:auto' in html


def test_reference_rows_without_a_recorded_cap_get_their_profiles(monkeypatch):
    data, results = nb.reference_results(4)
    gpt = results[results["id"] == "fsdp/gpt/1-gpu"].iloc[0]
    assert gpt["run_settings"]["max_steps"] == 30  # gpu-workstation's max_steps; the GPT engine did not record it


def test_messages_about_missing_runs_show_the_folder_relative(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORKSHOP_ROOT", str(tmp_path))
    (tmp_path / "runs").mkdir()
    nb.show_log_lines("zero/baseline", "train_loss", tmp_path / "runs")
    nb.show_results(nb.select(3, "tiny"), ["baseline"], tmp_path / "runs")
    out = capsys.readouterr().out
    assert "No log of zero/baseline in runs/zero/baseline/ yet" in out
    assert "No completed run of chapter 3 in runs/ yet" in out and str(tmp_path) not in out
