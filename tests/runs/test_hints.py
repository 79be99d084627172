"""Hints that must not mislead (issue 40, item 8): a memory kill quotes the estimator only for a run that trained
the experiment's own model on GPUs, with a command that runs; a script that starts no memory monitor does not
ask for a memory summary (each such tiny job logged "workshop: error: … no memory log here")."""

from __future__ import annotations

import pytest

from workshop_lib.cli import main
from workshop_lib.experiments import get_experiment
from workshop_lib.runs import RunRecord, run_directory, run_status
from workshop_lib.scripts import render_script

EXPERIMENT = get_experiment("zero/single-gpu/zero1")
KILLED = ("slurmstepd: error: Detected 1 oom_kill event in StepId=12.batch. Some of the step tasks have been "
          "OOM Killed.\n")


@pytest.mark.parametrize("profile, quoted", [("tiny", False), ("ibex", True)])
def test_a_memory_kill_quotes_the_gpu_estimate_only_for_a_real_gpu_run(tmp_path, monkeypatch, capsys, profile,
                                                                      quoted):
    monkeypatch.setenv("WORKSHOP_RUNS_DIR", str(tmp_path))
    folder = run_directory(EXPERIMENT)
    folder.mkdir(parents=True)
    RunRecord(EXPERIMENT.id, EXPERIMENT.content_hash, profile, "12", "slurm", "2026-11-27T09:00:00+00:00",
              final_state="OUT_OF_MEMORY", exit_code=0, signal=9).save(folder)
    (folder / "slurm-12.out").write_text("Job 12 started\n" + KILLED)
    [status] = run_status([EXPERIMENT])
    assert ("The estimator predicted" in status.explanation) is quoted, status.explanation
    if quoted:  # the command it quotes runs
        assert f"`workshop estimate {EXPERIMENT.id}`" in status.explanation
        assert main(["estimate", EXPERIMENT.id]) == 0
        assert "model states per GPU" in capsys.readouterr().out


@pytest.mark.parametrize("experiment_id, profile, summarised", [
    ("lora/llama/1-gpu", "tiny", False),  # no nvidia-smi, no psrecord: nothing to summarise
    ("lora/llama/1-gpu", "ibex", True),
    ("zero/single-gpu/zero2-offload", "tiny", True),  # psrecord follows the offloading job
])
def test_the_memory_summary_is_asked_for_only_where_a_monitor_runs(experiment_id, profile, summarised):
    script = render_script(get_experiment(experiment_id), profile)
    assert ('workshop memory "$RUN_DIR"' in script) is summarised
