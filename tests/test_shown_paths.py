"""A built page never prints the folders of the machine that built it."""

from workshop_lib import notebook as nb


def test_a_runs_folder_inside_the_workshop_is_shown_relative(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKSHOP_ROOT", str(tmp_path))
    (tmp_path / "runs").mkdir()
    assert nb.shown_path(tmp_path / "runs") == "runs/"


def test_a_runs_folder_chosen_by_the_variable_is_named_by_it(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKSHOP_ROOT", str(tmp_path / "workshop"))
    monkeypatch.setenv("WORKSHOP_RUNS_DIR", str(tmp_path / "elsewhere"))
    assert nb.shown_path(tmp_path / "elsewhere") == "$WORKSHOP_RUNS_DIR"
    monkeypatch.delenv("WORKSHOP_RUNS_DIR")
    assert nb.shown_path(tmp_path / "elsewhere") == str((tmp_path / "elsewhere").resolve())


def test_the_chapter_header_shows_the_relative_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORKSHOP_ROOT", str(tmp_path))
    monkeypatch.setenv("WORKSHOP_SUBMIT", "0")
    nb.chapter_header(3, "tiny", None, tmp_path / "runs")
    out = capsys.readouterr().out
    assert "runs in runs/;" in out and str(tmp_path) not in out
