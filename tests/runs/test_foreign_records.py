"""A job.json that this workshop did not write: copied from elsewhere, edited by hand, or written by a newer
version. Each is either read as it is or refused with the field named; never a traceback, a hang, or a file
outside the run folder read as the job's log."""

from __future__ import annotations

import json

import pytest

from workshop_lib.cli import main
from workshop_lib.core.run_directory import RECORD_NAME
from workshop_lib.experiments import get_experiment
from workshop_lib.jobs.slurm_output import JobInfo
from workshop_lib.results.read import read_run
from workshop_lib.runs import RunRecord, load_run, run_directory, run_status

EXPERIMENT = get_experiment("fsdp/baseline")


@pytest.fixture
def record_folder(tmp_path, monkeypatch):
    """The run folder of EXPERIMENT under a temporary runs folder, with a valid completed record."""
    monkeypatch.setenv("WORKSHOP_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("WORKSHOP_STATE_DIR", str(tmp_path / "state"))
    folder = run_directory(EXPERIMENT)
    folder.mkdir(parents=True)
    RunRecord(EXPERIMENT.id, EXPERIMENT.content_hash, "tiny", "12", "slurm", "2026-11-20T10:00:00+00:00",
              final_state="COMPLETED", exit_code=0).save(folder)
    (folder / "slurm-12.out").write_text("Exit status: 0\n")
    return folder


def edit_record(folder, **changes) -> None:
    data = json.loads((folder / RECORD_NAME).read_text())
    data.update(changes)
    (folder / RECORD_NAME).write_text(json.dumps(data))


@pytest.mark.parametrize("field, value, said", [
    ("final_state", 7, "'final_state' is 7, not a string"),
    ("job_id", 32, "'job_id' is 32, not a string"),
    ("exit_code", "0", "'exit_code' is '0', not a whole number"),
    ("backend", "pbs", "'backend' is 'pbs', not one of slurm, local"),
    ("stdout", "/etc/passwd", "'stdout' names '/etc/passwd', outside the run folder"),
    ("stdout", "/dev/zero", "'stdout' names '/dev/zero', outside the run folder"),
    ("stdout", "../../../etc/passwd", "outside the run folder"),
    ("final_state", "completed; rm", "not a scheduler state"),
])
def test_a_record_with_a_field_of_the_wrong_kind_is_damaged_with_the_field_named(record_folder, capsys, field,
                                                                                value, said):
    edit_record(record_folder, **{field: value})
    [status] = run_status([EXPERIMENT])
    assert status.state == "DAMAGED" and said in status.explanation
    assert main(["status", EXPERIMENT.id]) == 0
    printed = capsys.readouterr().out
    assert said in printed and "root:" not in printed  # /etc/passwd is never shown as the job's log
    assert main(["cancel", EXPERIMENT.id]) == 0
    assert "job.json is damaged" in capsys.readouterr().out
    assert read_run(record_folder).job_id is None  # collect reads the logs, not the foreign record


def test_fields_of_a_newer_format_survive_the_next_write(record_folder):
    edit_record(record_folder, final_state=None, written_by="workshop 9", attempt_notes=["kept"])
    run = load_run(EXPERIMENT)
    assert run.record.unknown_fields == {"written_by": "workshop 9", "attempt_notes": ["kept"]}
    run.remember(JobInfo(job_id="12", state="FAILED", exit_code=1))
    saved = json.loads((record_folder / RECORD_NAME).read_text())
    assert saved["final_state"] == "FAILED" and saved["written_by"] == "workshop 9"
    assert saved["attempt_notes"] == ["kept"]
