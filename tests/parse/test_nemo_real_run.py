"""The NeMo parser and the run reader on this project's own NeMo run: `lora/llama/1-gpu` trained by NeMo 2.4.1
on one H100 (tests/samples/nemo/README.md). Expected values are recomputed here from the raw lines with plain
string handling, not copied from the parser."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from workshop_lib.core.log_text import read_text
from workshop_lib.experiments import chapter_experiments
from workshop_lib.results import read_run
from workshop_lib.results.parse.nemo import parse_nemo_log

SAMPLES = Path(__file__).parents[1] / "samples"
LOG = SAMPLES / "nemo" / "llama_lora_1gpu_nemo241_h100.out"
MONITOR = SAMPLES / "nvidia_smi" / "llama_lora_1gpu_nemo241_h100.csv"


def _raw_timings() -> list[float]:
    return [float(re.search(r"train_step_timing in s: ([0-9.]+)", line).group(1))
            for line in LOG.read_text().splitlines() if line.startswith("Training epoch")]


def test_every_step_line_of_the_real_run_is_read():
    log = parse_nemo_log(read_text(LOG))
    assert not log.problems
    assert [step.global_step for step in log.steps] == list(range(60))
    assert log.last_step.last_iteration == 59  # trainer.max_steps=60, the profile's cap
    assert [step.train_step_timing_s for step in log.steps] == _raw_timings()
    assert log.steps[0].consumed_samples is None and log.steps[1].consumed_samples == 16
    # val_loss appears from the first validation (after 30 steps) on
    assert log.steps[29].val_loss is None and log.steps[30].val_loss == pytest.approx(10.89)


def test_mean_step_time_leaves_the_first_step_out():
    timings = _raw_timings()
    assert parse_nemo_log(read_text(LOG)).mean_step_time_s == pytest.approx(sum(timings[1:]) / len(timings[1:]))


def test_lora_summary_and_resolved_arguments_of_the_real_run():
    log = parse_nemo_log(read_text(LOG))
    assert log.after_lora.trainable_params == 17_800_000  # "17.8 M Trainable params": rank 8 on 4 targets x 32 layers
    assert log.after_lora.total_params == 8_000_000_000
    # NeMo-Run's own table, as the CLI prints it: the recipe with the chapter's overrides applied
    assert log.resolved_arguments["peft"] == "LoRA(dim=8, alpha=16)"
    assert log.resolved_arguments["data"] == "SquadDataModule(seq_length=2048, micro_batch_size=1, global_batch_size=8)"
    assert "max_steps=60" in log.resolved_arguments["trainer"].replace(" ", "")


def test_the_run_folder_reads_into_one_row(tmp_path):
    folder = tmp_path / "lora" / "llama" / "1-gpu"
    folder.mkdir(parents=True)
    shutil.copy(LOG, folder / "slurm-3.out")
    shutil.copy(MONITOR, folder / "gpu_memory_vm.csv")
    experiment = next(e for e in chapter_experiments(1) if e.id == "lora/llama/1-gpu")
    result = read_run(folder, experiment.id)
    timings = _raw_timings()
    used = [int(line.split(",")[4]) for line in MONITOR.read_text().splitlines()[1:]]
    assert result.train_step_time_s == timings[-1]
    assert result.mean_step_time_s == pytest.approx(sum(timings[1:]) / 59)
    assert result.gpu_peak_max_mib == max(used) == 21943
    assert result.total_time_s == 177  # the footer's 00:02:57


def test_nemo_checkpoint_save_lines_are_not_the_jobs_footer():
    # NeMo prints "Global Checkpoint Save : … Start time: 1795613081.807s" at each save (3 in this run); only the
    # job's own footer lines (" Start time : YYYY-MM-DD …" at the start of a line) are footer lines.
    from workshop_lib.jobs.footer import parse_footer

    text = read_text(LOG)
    saves = [line for line in text.splitlines() if "Global Checkpoint Save" in line and "Start time:" in line]
    assert len(saves) == 3
    footer = parse_footer(text)
    assert footer.problems == []
    assert str(footer.start_time) == "2026-11-25 13:23:13" and footer.total_time_s == 177
    assert footer.exit_status == 0
