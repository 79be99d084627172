"""The Ibex time plan: GPU demand, the queue under the per-user cap and A100 estimates from the reference."""

import json
import math

import pytest

from workshop_lib.book.plans import time_plan
from workshop_lib.core.paths import SOURCE_ROOT
from workshop_lib.experiments import chapter_experiments, get_experiment
from workshop_lib.sites.profiles import load_profile

REFERENCE = SOURCE_ROOT / "book" / "reference"


def test_the_card_factors_are_the_datasheet_ratios():
    h100, h200 = time_plan.CARDS["H100"], time_plan.CARDS["H200"]
    assert time_plan.a100_factors(h100) == pytest.approx((3.35 / 2.039, 989 / 312))
    assert time_plan.a100_factors(h200) == pytest.approx((4.8 / 2.039, 989 / 312))
    assert time_plan.card_of("NVIDIA H100 80GB HBM3") is h100 and time_plan.card_of("NVIDIA H200") is h200
    assert time_plan.card_of("Tesla V100") is None
    assert "3.2×" in time_plan.factor_sentence([h100]) and "1.6×" in time_plan.factor_sentence([h100])


@pytest.mark.parametrize("experiment_id, steps", [
    ("lora/llama/1-gpu", 250),                 # NeMo's trainer.max_steps
    ("zero/baseline", 3 * math.ceil(math.ceil(500 / 4) / 4)),  # 3 epochs of 125 batches, accumulation 4
    ("zero/multi-gpu/4-gpus", 96),             # 500 samples per GPU: the same steps on every GPU count
    ("fsdp/baseline", 5 * 125),                # batch 1, accumulation 4, 500 samples, 5 epochs
    ("fsdp/multi-gpu/4-gpus", 5 * math.ceil(125 / 4)),  # a fixed 500 samples split over 4 GPUs
])
def test_planned_steps_follow_the_trainers_counting(experiment_id, steps):
    assert time_plan.planned_steps(get_experiment(experiment_id), load_profile("ibex")) == steps


def test_a_profile_cap_limits_the_steps():
    assert time_plan.planned_steps(get_experiment("fsdp/baseline"), load_profile("gpu-workstation")) == 30


def test_a_measured_job_is_its_reference_row_scaled_by_the_card_factors():
    row = next(r for r in json.loads((REFERENCE / "chapter3.json").read_text())["results"] if r["id"] == "zero/baseline")
    (estimate,) = time_plan.estimate_chapter([get_experiment("zero/baseline")])
    step = row.get("median_step_time_s") or row["mean_step_time_s"]
    overhead = row["total_time_s"] - row["run_settings"]["max_steps"] * step
    assert estimate.basis == "measured" and estimate.steps == 96
    assert estimate.high_s == pytest.approx(overhead + 96 * step * 989 / 312)
    assert estimate.low_s == pytest.approx(overhead + 96 * step * 4.8 / 2.039)


def test_nemo_experiments_take_nemos_own_run_before_the_stand_in():
    (estimate,) = time_plan.estimate_chapter([get_experiment("lora/llama/1-gpu")])
    rows = [r for r in json.loads((REFERENCE / "chapter1.json").read_text())["results"] if r["id"] == "lora/llama/1-gpu"]
    nemo = next(r for r in rows if r.get("run_engine") == "nemo")
    assert estimate.reference_step_s == pytest.approx(nemo["mean_step_time_s"]) and estimate.reference_gpu == nemo["run_gpu"]


def test_an_unmeasured_job_borrows_a_sibling_or_counts_its_time_limit():
    estimates = {e.experiment.id: e for e in time_plan.estimate_chapter(chapter_experiments(2))}
    assert estimates["model-parallel/llama/tp4"].basis == "measured"  # NeMo ran it on 4 GPUs
    assert estimates["model-parallel/llama/tp8"].basis.startswith("like model-parallel/llama/")
    mixtral = estimates["model-parallel/mixtral/tp2-pp4-ep2-sp"]
    assert mixtral.high_s is None and mixtral.planned_s == 8 * 3600  # ibex.yml's chapter 2 limit


def _job(gpus: int, seconds: float, name: str):
    experiment = get_experiment("lora/llama/1-gpu")
    from dataclasses import replace

    experiment = replace(experiment, id=name, gpus_per_node=gpus)
    return time_plan.JobEstimate(experiment, 1, "measured", "H100", 1.0, 0.0, seconds, seconds, 3600.0)


def test_the_queue_never_runs_more_gpus_than_the_cap_and_lets_small_jobs_pass():
    jobs = [_job(16, 100, "a"), _job(8, 50, "b"), _job(16, 10, "c"), _job(8, 10, "d"), _job(30, 5, "e")]
    slots = {slot.estimate.experiment.id: slot for slot in time_plan.queue(jobs, cap=24)}
    assert (slots["a"].start_s, slots["b"].start_s) == (0, 0)  # 16 + 8: the cap is full
    assert slots["d"].start_s == 50  # b ends: 8 GPUs free, c (16) does not fit, d (8) passes it
    assert slots["c"].start_s == 100 and slots["c"].wave == 3  # waits for a
    assert "e" not in slots  # more than the cap: never starts
    for moment in (0, 25, 50, 75, 99):
        running = sum(s.estimate.experiment.gpus for s in slots.values() if s.start_s <= moment < s.end_s)
        assert running <= 24


def test_chapter_one_asks_for_29_gpus_and_one_job_waits_under_the_cap():
    sentence, table, factors = time_plan.chapter_plan(chapter_experiments(1))
    assert "29 GPUs" in sentence and "at most 24 GPUs" in sentence and "policy/ibex.rst:35" in sentence
    waiting = table[table["queue wave"] > 1]
    assert len(waiting) == 1 and "1 of them (8 GPUs) stays pending" in sentence
    assert set(table["GPUs"]) == {1, 2, 4, 8} and table["GPUs"].sum() == 29
    # Every measured card of the series gets its datasheet factor (today's NeMo rows: H200 only)
    assert "H200 SXM → A100" in factors


def test_the_sentence_says_when_everything_fits_under_the_cap():
    sentence, table, _ = time_plan.chapter_plan([get_experiment("zero/baseline"), get_experiment("zero/multi-gpu/4-gpus")])
    assert "all of them can run at once" in sentence and set(table["queue wave"]) == {1}


def test_a_reduced_depth_or_packed_run_never_stands_in_for_another_job():
    estimates = {e.experiment.id: e for e in time_plan.estimate_chapter(chapter_experiments(2))}
    for layout in ("model-parallel/mixtral/tp2-pp4-ep2-sp", "model-parallel/mixtral/tp4-pp2-ep2-sp"):
        assert "4-layers" not in estimates[layout].basis  # 4 of 32 layers say nothing of the whole model's step
    (unpacked,) = time_plan.estimate_chapter([get_experiment("lora/llama/8-gpus")])
    assert "packed" not in unpacked.basis


@pytest.mark.parametrize("profile_name", ["ibex", "gpu-workstation-nemo", "tiny"])
def test_the_step_cap_is_one_rule_for_the_job_script_the_disk_check_and_the_time_plan(profile_name):
    """NeMo's trainer.max_steps in the script, the checkpoints the disk check counts and the steps the time plan
    times all come from sites.step_cap: the experiment's 250 steps, or the profile's cap where it is smaller."""
    from workshop_lib.checks.disk import NEMO_CHECKPOINT_EVERY, NEMO_CHECKPOINTS_KEPT, disk_need
    from workshop_lib.scripts.commands import nemo_overrides
    from workshop_lib.sites.step_cap import step_cap

    assert step_cap(None, None) is None and step_cap(None, 30) == 30 and step_cap(250, 30, None) == 30
    profile, experiment = load_profile(profile_name), get_experiment("lora/llama/1-gpu")
    steps = step_cap(experiment.max_steps, profile.training.max_steps)
    assert steps == min(250, profile.training.max_steps or 250)
    assert f"trainer.max_steps={steps}" in nemo_overrides(experiment, profile.training.max_steps)
    assert time_plan.planned_steps(experiment, profile) == steps
    saves = min(steps // NEMO_CHECKPOINT_EVERY, NEMO_CHECKPOINTS_KEPT)
    if profile.nemo.enabled and saves:
        assert disk_need(experiment, profile).what.startswith(f"{saves} LoRA adapter checkpoint")
