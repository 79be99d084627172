"""Disk as a fit check: what each run writes, and a refusal before the queue when the runs folder is short."""

from __future__ import annotations

import os
import subprocess

import pytest

from workshop_lib.checks.disk import CHECKPOINT_BYTES_PER_TRAINABLE, LOG_ALLOWANCE, DiskError, check_disk, disk_need
from workshop_lib.experiments import chapter_experiments, get_experiment
from workshop_lib.sites.profiles import load_profile


def test_a_lora_run_on_ibex_writes_the_adapter_checkpoints_nemo_keeps_and_nothing_else():
    need = disk_need(get_experiment("lora/llama/1-gpu"), load_profile("ibex"))
    assert need.what.startswith("3 LoRA adapter checkpoints")
    adapters = (need.bytes - LOG_ALLOWANCE) / 3 / CHECKPOINT_BYTES_PER_TRAINABLE
    assert 5e6 < adapters < 1e8, "the adapter's trainable parameters, not the 8 B frozen ones"
    assert need.bytes < 2e9


def test_full_fine_tunes_and_hugging_face_runs_write_no_checkpoint():
    ibex = load_profile("ibex")
    for experiment in chapter_experiments(2) + chapter_experiments(3) + chapter_experiments(4):
        need = disk_need(experiment, ibex)
        assert need.bytes == LOG_ALLOWANCE and "no checkpoint" in need.what, (experiment.id, need)


def test_a_run_that_stops_before_the_first_checkpoint_writes_none():
    profile = load_profile("gpu-workstation-nemo")  # max_steps 60: one save, at step 50
    assert disk_need(get_experiment("lora/llama/1-gpu"), profile).what.startswith("1 LoRA adapter checkpoint ")
    tiny = load_profile("tiny")  # NeMo off: the stand-in saves nothing
    assert disk_need(get_experiment("lora/llama/1-gpu"), tiny).bytes == LOG_ALLOWANCE


def test_the_whole_ibex_class_fits_a_participants_quota():
    ibex = load_profile("ibex")
    needs = [disk_need(experiment, ibex) for chapter in (1, 2, 3, 4) for experiment in chapter_experiments(chapter)]
    line = check_disk(needs, "/", free_bytes=int(1.5e12))  # 1.5 TB per user on /ibex/user (KAUST's docs)
    assert "write up to" in line and "1.5 TB free" in line


def test_too_little_room_is_refused_naming_the_largest_runs_and_the_fix():
    ibex = load_profile("ibex")
    needs = [disk_need(experiment, ibex) for experiment in chapter_experiments(1)]
    with pytest.raises(DiskError) as refused:
        check_disk(needs, "/ibex/user/someone/runs", free_bytes=100 * 2**20)
    text = str(refused.value)
    assert "not enough" in text and "lora/" in text and "LoRA adapter checkpoint" in text
    assert "du -sh runs/*" in text and "df -h /ibex/user/$USER" in text


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root (CI runs as root)")
def test_a_real_small_filesystem_is_measured_not_assumed(tmp_path):
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(small)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:  # a container without the right to mount
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        tiny = load_profile("tiny")
        needs = [disk_need(experiment, tiny) for experiment in chapter_experiments(3)[:2]]
        with pytest.raises(DiskError, match=r"MB free there"):
            check_disk(needs, small / "runs")  # the folder does not exist yet: its filesystem is measured
        assert "write up to" in check_disk(needs[:0], small / "runs")
    finally:
        subprocess.run(["umount", str(small)], check=True)
