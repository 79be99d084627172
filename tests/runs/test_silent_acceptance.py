"""Input that used to be accepted without a word (issue 40, item 6): a key given twice in a profile, an edited
runs/<id>/job.sbatch, a runs folder that is a file. Each is refused with what was wrong, or handled and said."""

from __future__ import annotations

import json

import pytest
import yaml

from test_runs import EXPERIMENT, isolated, quick_profile  # noqa: F401 - isolated is a fixture
from workshop_lib.cli import main
from workshop_lib.core.errors import WorkshopError
from workshop_lib.core.paths import runs_root
from workshop_lib.runs import submit_experiment, wait_for_runs
from workshop_lib.sites.profiles import PROFILES_DIR, ProfileError, load_profile


def test_a_key_given_twice_in_a_profile_is_refused_with_the_key_and_both_lines(tmp_path, capsys):
    text = (PROFILES_DIR / "tiny.yml").read_text()
    doubled = tmp_path / "doubled.yml"
    doubled.write_text(text + "training:\n  data: squad\n")  # a second block, pasted below the first
    first = text.split("\n").index("training:") + 1
    with pytest.raises(ProfileError, match=rf"key 'training' is given twice, on line {first} and line \d+"):
        load_profile(doubled)
    assert main(["render", EXPERIMENT.id, "--profile", str(doubled)]) == 2
    assert "given twice" in capsys.readouterr().err


@pytest.mark.slow  # over 5 s on a loaded 2-core machine
def test_a_profile_nested_too_deeply_is_a_message_not_a_recursion_error(tmp_path):
    deep = tmp_path / "deep.yml"
    deep.write_text("name: tiny\nx: " + "[" * 20000 + "]" * 20000 + "\n")
    with pytest.raises(ProfileError, match="nests its blocks too deeply"):
        load_profile(deep)


def test_a_runs_folder_that_is_a_file_is_refused(tmp_path, monkeypatch, capsys):
    afile = tmp_path / "runs"
    afile.write_text("")
    monkeypatch.setenv("WORKSHOP_RUNS_DIR", str(afile))
    with pytest.raises(WorkshopError, match=r"\$WORKSHOP_RUNS_DIR=.* is a file, not a folder"):
        runs_root()
    assert main(["status", EXPERIMENT.id]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err


def edit_time(script, limit: str) -> str:
    lines = [f"#SBATCH --time={limit}" if line.startswith("#SBATCH --time=") else line
             for line in script.read_text().split("\n")]
    script.write_text("\n".join(lines))
    return script.read_text()


@pytest.mark.slow
def test_an_edited_job_script_is_submitted_and_said_so(isolated):  # noqa: F811
    failing = quick_profile(isolated, status=3)
    first = submit_experiment(EXPERIMENT, failing)
    assert wait_for_runs([first], timeout=60, progress=False)[0].state == "FAILED"
    edited = edit_time(first.directory / "job.sbatch", "00:42:00")  # what the TIMEOUT explanation suggests
    again = submit_experiment(EXPERIMENT, quick_profile(isolated))
    assert again.submitted_now and "submitting your edited job.sbatch" in again.note
    assert (again.directory / "job.sbatch").read_text() == edited
    assert wait_for_runs([again], timeout=60, progress=False)[0].state == "COMPLETED"
    # Completed: reused, and the note says an edit made since is not submitted without --force.
    edit_time(again.directory / "job.sbatch", "00:43:00")
    reused = submit_experiment(EXPERIMENT, quick_profile(isolated))
    assert not reused.submitted_now and "--force submits the edited script" in reused.note


@pytest.mark.slow
def test_an_edit_made_for_an_earlier_version_of_the_experiment_is_kept_not_submitted(isolated):  # noqa: F811
    failing = quick_profile(isolated, status=3)
    first = submit_experiment(EXPERIMENT, failing)
    assert wait_for_runs([first], timeout=60, progress=False)[0].state == "FAILED"
    edited = edit_time(first.directory / "job.sbatch", "00:42:00")
    record = json.loads((first.directory / "job.json").read_text())
    record["content_hash"] = "an-earlier-version"
    (first.directory / "job.json").write_text(json.dumps(record))
    again = submit_experiment(EXPERIMENT, quick_profile(isolated))
    assert again.submitted_now and "not submitted" in again.note and "earlier version" in again.note
    assert "--time=00:42:00" not in (again.directory / "job.sbatch").read_text()
    [kept] = (again.directory / "attempts").iterdir()
    assert (kept / "job.sbatch").read_text() == edited
    wait_for_runs([again], timeout=60, progress=False)


def test_yaml_mappings_keep_loading_as_before(tmp_path):
    assert load_profile("tiny").name == "tiny"
    assert yaml.safe_load((PROFILES_DIR / "tiny.yml").read_text())["name"] == "tiny"
