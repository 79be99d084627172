"""What `make demo` prints: each job's progress while a chapter executes, and no warning a reader cannot act on."""

from __future__ import annotations

import json

import pytest

from workshop_lib.cli.demo import JobProgress, execute_chapter, run_progress
from workshop_lib.experiments import get_experiment
from workshop_lib.runs import RunRecord

EXPERIMENT = get_experiment("zero/baseline")


def test_progress_lines_follow_a_run_from_submission_to_its_end(tmp_path):
    directory = tmp_path / EXPERIMENT.id
    shown: list[str] = []
    progress = JobProgress([EXPERIMENT], tmp_path, echo=lambda line, flush=True: shown.append(line))
    progress.poll()
    assert shown == []  # nothing submitted yet: nothing to say
    directory.mkdir(parents=True)
    RunRecord(experiment_id=EXPERIMENT.id, content_hash=EXPERIMENT.content_hash, profile="tiny", job_id="41",
              backend="slurm", submitted_at="2026-11-25T10:00:00+00:00", stdout="slurm-41.out").save(directory)
    progress.poll()
    (directory / "slurm-41.out").write_text("Job 41 (zero-baseline) on node1\n")
    (directory / "train").mkdir()
    steps = [{"kind": "step", "step": i, "loss": 3.0 - i / 10, "lr": 1e-4, "step_time_s": 0.5, "samples_per_s": 16,
              "epoch": 0.1 * i} for i in (1, 2)]
    (directory / "train" / "metrics.jsonl").write_text("".join(json.dumps(step) + "\n" for step in steps))
    progress.poll()
    progress.poll()  # nothing moved: no new line
    with (directory / "slurm-41.out").open("a") as log:
        log.write(" Total time : 00:01:07\n Exit status: 0\n")
    progress.poll()
    assert [line.split(maxsplit=1)[1] for line in shown] == [
        "job 41: submitted, waiting to start", "job 41: training, step 2 (loss 2.800)",
        "job 41: ended, exit status 0 after 00:01:07"]
    assert all(line.startswith(f"    {EXPERIMENT.id}") for line in shown)


def test_a_damaged_record_gives_no_progress_line_rather_than_an_error(tmp_path):
    directory = tmp_path / EXPERIMENT.id
    directory.mkdir(parents=True)
    (directory / "job.json").write_text("{")
    assert run_progress(directory) == ""


@pytest.mark.slow
def test_a_chapter_kernel_gives_no_tcp_warning(tmp_path, capfd):
    pytest.importorskip("papermill")
    notebook = tmp_path / "99_tiny.py"
    notebook.write_text('# %% tags=["parameters"]\nprofile = "tiny"\n\n# %%\nprint("ran with", profile)\n')
    executed = execute_chapter(notebook, "tiny", tmp_path / "out")
    assert "ran with tiny" in executed.read_text()
    captured = capfd.readouterr()
    assert "without encryption" not in captured.out + captured.err


def test_each_chapter_has_one_time_in_the_summary():
    from pathlib import Path

    from workshop_lib.cli.demo import ChapterRun, chapter_report

    run = ChapterRun(notebook=Path("01_data_parallel_lora.py"), seconds=407.6, jobs={"a": "1"}, submitted=["a"],
                     states={"a": "COMPLETED"}, job_seconds={"a": 12.0})
    report = chapter_report([run])
    assert "407.6" not in report  # the chapter's time is its line in "time per step", which measures all of it
    assert "01_data_parallel_lora" in report and "1 submitted, 0 reused; 1 completed" in report
