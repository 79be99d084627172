"""Predicted vs measured memory: hand-computed model states, the real CUDA smoke runs (BLOOM-560m shape on an
H200, torch.cuda.max_memory_allocated), CPU runs' tensor bytes, and the companion table of chapters 3 and 4.

The real tiny CPU runs are compared with the estimate in tests/train/test_engines.py (every engine, every rank).
"""

import json

import pytest
from repo_paths import REPO

from workshop_lib.book.measurements.memory_predictions import (
    GOAL_MODEL_STATES,
    GOAL_PEAK,
    STEP_PEAK,
    compare_summary,
    model_of_summary,
    read_summary,
    reference_comparisons,
    reference_frame,
    setup_from_summary,
)
from workshop_lib.book.tables import chapter_tables
from workshop_lib.core.errors import WorkshopError
from workshop_lib.estimate import estimate_memory, parameter_tensors

SMOKE = REPO / "benchmarks" / "results" / "cuda_smoke"
BLOOM_560M = 559_214_592  # parameters (the runs' own total_params)
MIB = 2**20


@pytest.fixture(scope="module")
def smoke():
    return {c.label: c for c in reference_comparisons(sorted(SMOKE.glob("*.metrics.jsonl")))}


def test_setups_are_read_from_the_summaries():
    plain = setup_from_summary(read_summary(SMOKE / "plain.metrics.jsonl"))
    assert (plain.gpus, plain.precision, plain.batch, plain.seq_len, plain.resolved_engine) == (1, "fp16", 4, 512, "ddp")
    fsdp = setup_from_summary(read_summary(SMOKE / "fsdp-full-shard-2.metrics.jsonl"))
    assert (fsdp.gpus, fsdp.fsdp, fsdp.offload) == (2, "FULL_SHARD", "none")
    zero = setup_from_summary({"engine": "deepspeed", "world_size": 1, "precision": "fp16",
                               "settings": {"zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu"}})
    assert (zero.zero_stage, zero.offload) == (3, "parameters")


def test_model_states_by_hand(smoke):
    # Autocast (HF Trainer --fp16, DDP, FSDP) keeps fp32 params 4 + grads 4 + Adam 8 = 16 bytes per parameter.
    assert smoke["plain"].predicted_model_states_mib == pytest.approx(16 * BLOOM_560M / MIB)  # 8533.0 MiB
    assert smoke["ddp-2"].predicted_model_states_mib == pytest.approx(16 * BLOOM_560M / MIB)  # replicated
    assert smoke["fsdp-full-shard-2"].predicted_model_states_mib == pytest.approx(16 * BLOOM_560M / 2 / MIB)


def test_gpu_peaks_within_the_goal(smoke):
    for label in ("plain", "ddp-2", "fsdp-full-shard-2"):
        comparison = smoke[label]
        assert comparison.measured_kind == "cuda_max_allocated"
        assert abs(comparison.peak_error) <= GOAL_PEAK, (label, comparison)
    assert smoke["plain"].measured_peak_mib == pytest.approx(19597.0546875)


def test_model_state_differences_within_the_goal(smoke):
    """What separates configurations is (mostly) model states: DDP - plain = the gradient buckets (4Ψ bytes,
    by hand 2133.2 MiB); FSDP - DDP = half the 16Ψ states, buckets and the working copies."""
    frame = reference_frame([smoke["plain"], smoke["ddp-2"], smoke["fsdp-full-shard-2"]]).set_index("Run")
    assert frame.loc["ddp-2", "Predicted Δ vs reference (MiB)"] == round(4 * BLOOM_560M / MIB)
    measured = 21730.3056640625 - 19597.0546875
    assert frame.loc["ddp-2", "Measured Δ vs reference (MiB)"] == round(measured)
    for label in ("ddp-2", "fsdp-full-shard-2"):
        assert abs(frame.loc[label, "Δ error (%)"]) <= 100 * GOAL_MODEL_STATES, label
    assert frame.loc["plain", "Peak error (%)"] == round(100 * (smoke["plain"].peak_error), 1)


def test_cpu_rss_is_not_compared_as_tensor_bytes():
    summary = {"model": "tiny-bloom", "world_size": 1, "precision": "fp32", "engine": "hf",
               "settings": {"per_device_batch": 4, "max_length": 512}, "peak_memory_mib_per_rank": [720.5],
               "peak_memory_kind": "cpu_max_rss"}
    comparison = compare_summary(summary, "tiny")
    assert comparison.predicted_model_states_mib == pytest.approx(16 * 132_992 / MIB)  # fp32, by hand
    assert comparison.peak_error is None and not comparison.comparable


def test_errors_a_user_can_cause_say_what_to_do(tmp_path):
    with pytest.raises(WorkshopError, match="no metrics file"):
        read_summary(tmp_path / "nothing.metrics.jsonl")
    (tmp_path / "cut.metrics.jsonl").write_text(json.dumps({"kind": "step", "step": 1}) + "\n")
    with pytest.raises(WorkshopError, match="no summary record"):
        read_summary(tmp_path / "cut.metrics.jsonl")
    with pytest.raises(WorkshopError, match="not known to the estimator"):
        compare_summary({"engine": "hf", "model": "gpt-5", "world_size": 1, "peak_memory_mib_per_rank": [1.0]}, "x")
    with pytest.raises(WorkshopError, match="engine 'lora' is not compared"):
        compare_summary({"engine": "lora", "model": "tiny-llama", "world_size": 1}, "x")


def test_chapter_tables_carry_the_companion_table(tmp_path):
    """A GPU-measured run in a chapter 4 run directory: predicted beside measured, error computed."""
    summary = read_summary(SMOKE / "fsdp-full-shard-2.metrics.jsonl")
    folder = tmp_path / "fsdp/multi-gpu/2-gpus/train"
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text(json.dumps(summary) + "\n")
    tables = {t.title: t for t in chapter_tables(4, tmp_path)}
    table = tables["Predicted vs measured memory per GPU"]
    row = table.frame.set_index("Run").loc["fsdp/multi-gpu/2-gpus"]
    estimate = compare_summary(summary, "fsdp")
    assert row["Predicted model states (MiB)"] == round(16 * BLOOM_560M / 2 / MIB, 2)
    assert row["Measured peak (MiB)"] == round(summary["peak_memory_mib_per_rank"][0], 2)
    assert row["Peak error (%)"] == round(100 * estimate.peak_error, 1)
    assert row["Measured model states (MiB)"] == "n/a"  # recorded before the census existed
    assert table.frame.set_index("Run").loc["fsdp/baseline", "Predicted peak (MiB)"] == "MISSING"
    assert "max_memory_allocated" in table.note


# ---- CPU runs: tensor bytes (workshop_lib.train.tensor_census) --------------------------------------

TINY_BLOOM = 132_992
# The summary of a real tiny run (tests/train: tiny-bloom, HF Trainer + ZeRO-2 on 2 CPU ranks, fp32, batch 2 x 128).
ZERO2_CPU = {"kind": "summary", "engine": "deepspeed", "model": "tiny-bloom", "world_size": 2, "nodes": 1,
             "precision": "fp32", "device": "cpu",
             "settings": {"per_device_batch": 2, "grad_accum": 2, "max_length": 128, "config": "zero2.json",
                          "zero_stage": 2, "offload_optimizer": "none", "offload_param": "none"},
             "peak_memory_mib_per_rank": [700.1, 690.2], "peak_memory_kind": "cpu_max_rss",
             "model_state_bytes_per_rank": [1_595_928, 1_595_928], "step_peak_bytes_per_rank": [2_006_339_336] * 2,
             "model_state_parts_per_rank": [{"parameters": 531_968, "gradients": 265_988, "optimizer_states": 797_972,
                                             "buffers": 0, "buckets": 0}] * 2}


def test_cpu_runs_compare_tensor_bytes():
    comparison = compare_summary(ZERO2_CPU, "zero2")
    # ZeRO-2 in fp32 on 2 ranks: fp32 weights 4Ψ, and per rank the gradient partition 4Ψ/2 and the fp32 master +
    # Adam moments 12Ψ/2 (ZeRO clones a master even of fp32 weights).
    assert comparison.predicted_model_states_mib == pytest.approx((4 + 16 / 2) * TINY_BLOOM / MIB)
    assert comparison.comparable and abs(comparison.model_state_error) < 1e-4
    # The peak is DeepSpeed's reduce bucket (5e8 fp32 elements) over the states and activations.
    assert comparison.compared_peak_mib == comparison.measured_step_peak_mib == pytest.approx(2_006_339_336 / MIB)
    assert abs(comparison.peak_error) <= GOAL_PEAK
    frame = reference_frame([comparison])
    assert frame.loc[0, "Model-state error (%)"] == round(100 * comparison.model_state_error, 1)


def test_setups_are_what_ran_on_a_cpu():
    plain = {"engine": "hf", "model": "tiny-bloom", "world_size": 1, "precision": "fp32", "device": "cpu",
             "settings": {"per_device_batch": 2, "max_length": 128}}
    # Accelerate wraps even one CPU process in DDP: its gradient bucket (4Ψ) is there; on a GPU it is not.
    assert setup_from_summary(plain).has_ddp_buckets
    assert not setup_from_summary({**plain, "device": "cuda"}).has_ddp_buckets
    gpt = {"engine": "gpt", "model": "gpt", "world_size": 2, "precision": "fp32", "device": "cpu",
           "settings": {"layers": 4, "hidden": 64, "heads": 4, "ffn": 256, "vocab": 512, "seq_len": 128,
                        "parallelism": "fsdp", "fsdp": "FULL_SHARD", "offload_applied": False,
                        "per_device_batch": 2, "max_length": 128}}
    assert setup_from_summary(gpt).fsdp == "FULL_SHARD"
    assert sum(parameter_tensors(model_of_summary(gpt))) == estimate_memory(
        model_of_summary(gpt), setup_from_summary(gpt)).total_parameters
    auto = {**ZERO2_CPU, "settings": {**ZERO2_CPU["settings"], "zero_stage": 3, "reduce_bucket_size": "auto",
                                      "stage3_param_persistence_threshold": "auto"}}
    setup = setup_from_summary(auto)
    assert (setup.reduce_bucket, setup.persistence_threshold) == (64 * 64, 640)  # the HF Trainer's "auto" fill
    hybrid = {**plain, "engine": "fsdp", "world_size": 2, "settings": {"strategy": "HYBRID_SHARD"}}
    assert setup_from_summary(hybrid).fsdp == "FULL_SHARD"  # one node: one shard group


def test_chapter_table_compares_a_cpu_run(tmp_path):
    """A tiny-profile run with the census: both errors computed, measured as the step's tensor peak."""
    folder = tmp_path / "zero/two-gpus/zero2/train"
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text(json.dumps(ZERO2_CPU) + "\n")
    row = {t.title: t for t in chapter_tables(3, tmp_path)}["Predicted vs measured memory per GPU"]
    row = row.frame.set_index("Run").loc["zero/two-gpus/zero2"]
    comparison = compare_summary(ZERO2_CPU, "zero2")
    assert row["Measured as"] == STEP_PEAK
    assert row["Measured model states (MiB)"] == round(1_595_928 / MIB, 2)
    assert row["Model-state error (%)"] == round(100 * comparison.model_state_error, 1)
    assert row["Peak error (%)"] == round(100 * comparison.peak_error, 1)
    assert abs(row["Model-state error (%)"]) <= 100 * GOAL_MODEL_STATES
