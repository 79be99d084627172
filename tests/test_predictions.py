"""Predicted vs measured memory: hand-computed model states, the real CUDA smoke runs (BLOOM-560m shape on an
H200, torch.cuda.max_memory_allocated), and the companion table of chapters 3 and 4."""

import json
from pathlib import Path

import pytest

from workshop_lib.errors import WorkshopError
from workshop_lib.predictions import (
    GOAL_MODEL_STATES, GOAL_PEAK, compare_summary, read_summary, reference_comparisons, reference_frame,
    setup_from_summary,
)
from workshop_lib.tables import chapter_tables

SMOKE = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "cuda_smoke"
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
        compare_summary({"model": "gpt-5", "world_size": 1, "peak_memory_mib_per_rank": [1.0]}, "x")


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
    assert row["Measured peak (MiB)"] == round(summary["peak_memory_mib_per_rank"][0], 1)
    assert row["Peak error (%)"] == round(100 * estimate.peak_error, 1)
    assert table.frame.set_index("Run").loc["fsdp/baseline", "Predicted peak (MiB)"] == "MISSING"
    assert "max_memory_allocated" in table.note
