"""The class rehearsal's job (workshop_lib.train.rehearsal): what it writes fills the chapter's tables, and a
staged folder that does not match its manifest stops the job with a message naming the file."""

from __future__ import annotations

import hashlib
import json

import pytest

from workshop_lib.book.chapter.selection import select
from workshop_lib.book.chapter.your_runs import selection_tables
from workshop_lib.scripts import render_script
from workshop_lib.train import rehearsal


@pytest.fixture
def staged(tmp_path):
    folder = tmp_path / "staged"
    (folder / "models").mkdir(parents=True)
    content = b"weights" * 100
    (folder / "models" / "llama.bin").write_bytes(content)
    (folder / "manifest.json").write_text(json.dumps(
        {"files": {"models/llama.bin": {"bytes": len(content), "sha256": hashlib.sha256(content).hexdigest()}}}))
    return folder


def test_the_rehearsal_script_runs_the_job_instead_of_training(staged):
    from dataclasses import replace

    from workshop_lib.experiments import get_experiment
    from workshop_lib.sites.profiles import load_profile

    profile = load_profile("rehearsal")
    profile = replace(profile, rehearsal=replace(profile.rehearsal, staged=str(staged)))
    script = render_script(get_experiment("lora/mixtral/2-gpus"), profile)
    assert "-m workshop_lib.train.rehearsal --experiment lora/mixtral/2-gpus" in script
    assert f'--staged "{staged}"' in script and "torchrun" not in script and "Total time" in script


def test_what_the_jobs_write_fills_every_table_of_chapter_1(tmp_path, staged, monkeypatch, capsys):
    selection = select(1, "rehearsal")
    for experiment in selection.runnable:
        folder = tmp_path / "runs" / experiment.id
        folder.mkdir(parents=True)
        monkeypatch.chdir(folder)
        monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-2]")
        assert rehearsal.main(["--experiment", experiment.id, "--output-dir", "train", "--sleep", "0",
                               "--staged", str(staged)]) == 0
        assert (folder / "gpu_memory_node1.csv").is_file() and not (folder / "gpu_memory_node2.csv").exists()
    assert "1 file(s), 700 bytes read and checked" in capsys.readouterr().out
    tables = selection_tables(selection, tmp_path / "runs")
    assert [table.key for table in tables] == ["llama", "mixtral"]
    for table in tables:
        step_times = list(table.frame["Train step time (s)"])
        assert all(isinstance(value, float) and value > 0 for value in step_times), table.frame
        assert step_times == sorted(step_times, reverse=True), "more GPUs, shorter steps"
        assert all(value > 1000 for value in table.frame["GPU 0 Peak (MiB)"]), table.frame


def test_a_staged_file_that_differs_from_the_manifest_stops_the_job(tmp_path, staged, monkeypatch, capsys):
    (staged / "models" / "llama.bin").write_bytes(b"changed")
    monkeypatch.chdir(tmp_path)
    code = rehearsal.main(["--experiment", "lora/llama/1-gpu", "--output-dir", "train", "--sleep", "0",
                           "--staged", str(staged)])
    assert code == rehearsal.STAGED_ERROR_EXIT
    assert "llama.bin does not match manifest.json" in capsys.readouterr().err
    assert not (tmp_path / "train" / "metrics.jsonl").exists()
    (staged / "manifest.json").unlink()
    assert rehearsal.main(["--experiment", "lora/llama/1-gpu", "--output-dir", "train", "--sleep", "0",
                           "--staged", str(staged)]) == rehearsal.STAGED_ERROR_EXIT
    assert "cannot read" in capsys.readouterr().err
