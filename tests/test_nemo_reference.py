"""The chapters 1-2 reference view: rows from the stored runs on real GPUs, predictions next to them,
rows not run shown as "not measured yet"."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from workshop_lib.book.nemo_reference import (
    REFERENCE_DIR, chapter_rows, memory_sentences, provenance_line, reference_table, resolved_table,
)


@pytest.mark.parametrize("chapter", [1, 2])
def test_every_experiment_has_a_row_and_unmeasured_rows_say_so(chapter):
    table = reference_table(chapter)
    assert list(table["experiment"]) == [e.id for e in chapter_rows(chapter)]
    stored = {row["id"]: row for row in json.loads((REFERENCE_DIR / f"chapter{chapter}.json").read_text())["results"]
              if row.get("run_engine", "stand-in") == "stand-in"}
    for _, row in table.iterrows():
        run = stored.get(row["experiment"])
        if run is None:
            assert row["state"].startswith("not measured yet") and pd.isna(row["stand-in: measured GiB/GPU"])
        else:  # the number shown is the run's own, in GiB
            assert row["state"] == run["state"] == "COMPLETED"
            assert row["stand-in: measured GiB/GPU"] == pytest.approx(run["allocated_peak_mib"] / 1024, abs=0.05)
            assert run["run_model"] in ("llama-3.1-8b", "mixtral-8x7b")  # the real shape, not a tiny model
            assert run["run_seq_len"] == 2048  # NeMo's resolved sequence length, not the seeds' 512


def test_the_measured_rows_are_real_shapes_on_real_gpus():
    provenance = json.loads((REFERENCE_DIR / "chapter1.json").read_text())["provenance"]
    first = provenance[0] if isinstance(provenance, list) else provenance
    assert first["gpus"] and "H200" in first["gpus"][0]
    assert "H200" in provenance_line(1) and "stand-ins (not NeMo" in provenance_line(1)
    table = reference_table(1)
    sentences = memory_sentences(table)
    measured = table[table["state"] == "COMPLETED"]
    assert len(sentences) == len(measured) >= 1
    for sentence, (_, row) in zip(sentences, measured.iterrows()):
        assert f"{row['stand-in: measured GiB/GPU']:.1f} GiB allocated" in sentence


def test_the_resolved_table_reports_nemos_verdict():
    table = resolved_table(2).set_index("experiment")
    assert table.loc["model-parallel/llama/tp4", "NeMo's dry run"] == "accepted"
    assert "refused by `workshop validate`" in table.loc["model-parallel/llama/tp2", "NeMo's dry run"]
    assert table.loc["model-parallel/llama/tp4", "learning rate"] == 5e-6
    assert Path(REFERENCE_DIR / "nemo" / "model-parallel_llama_tp4.dryrun.txt").is_file()


def test_every_stored_row_says_what_ran_it():
    for chapter in (1, 2, 3, 4):
        for row in json.loads((REFERENCE_DIR / f"chapter{chapter}.json").read_text())["results"]:
            assert row["run_engine"] in ("nemo", "stand-in", "hf", "gpt"), row["id"]
            assert (row["nemo_version"] is not None) == (row["run_engine"] == "nemo"), row["id"]
            assert row["run_gpu"].startswith("NVIDIA "), row["id"]
            if chapter in (1, 2):  # chapters 1-2 teach NeMo: every row is NeMo's or says it is a stand-in
                assert row["run_engine"] in ("nemo", "stand-in")


def test_nemo_and_the_stand_in_side_by_side_with_their_measured_ratios():
    from workshop_lib.book.nemo_reference import engine_comparisons, nemo_run_line, stand_in_caveat

    rows = json.loads((REFERENCE_DIR / "chapter1.json").read_text())["results"]
    done = {(r["id"], r["run_engine"]): r for r in rows if r["state"] == "COMPLETED"}
    # The experiments both engines completed on one kind of card: only those may form a ratio.
    same_card = sorted(experiment for experiment, engine in done if engine == "nemo" and (experiment, "stand-in") in done
                       and done[experiment, "nemo"]["run_gpu"] == done[experiment, "stand-in"]["run_gpu"])
    assert sorted(p["experiment"] for p in engine_comparisons(1)) == same_card
    assert same_card, "the reference holds no experiment run by both engines on one card"
    experiment = same_card[0]
    nemo, stand_in = done[experiment, "nemo"], done[experiment, "stand-in"]
    assert nemo["nemo_version"] == "2.4.1"
    [pair] = [p for p in engine_comparisons(1) if p["experiment"] == experiment]
    assert pair["step_ratio"] == pytest.approx(stand_in["mean_step_time_s"] / nemo["mean_step_time_s"])
    assert pair["memory_ratio"] == pytest.approx(stand_in["gpu_peak_max_mib"] / nemo["gpu_peak_max_mib"])
    caveat = stand_in_caveat(2)  # chapter 2's stand-in rows carry chapter 1's measured ratio
    assert f"{pair['step_ratio']:.2f}× NeMo" in caveat and f"{pair['memory_ratio']:.2f}× its peak memory" in caveat
    table = reference_table(1).set_index("experiment")
    assert table.loc[experiment, "NeMo: nvidia-smi peak GiB/GPU"] == round(nemo["gpu_peak_max_mib"] / 1024, 1)
    assert pd.isna(table.loc["lora/llama/8-gpus", "NeMo: nvidia-smi peak GiB/GPU"])  # NeMo has not run it
    line = nemo_run_line(1)
    assert "was trained by NeMo 2.4.1 itself" in line and "GiB predicted for NeMo" in line


def test_no_ratio_without_both_engines_on_the_same_card(tmp_path):
    from workshop_lib.book.nemo_reference import engine_comparisons, stand_in_caveat

    data = json.loads((REFERENCE_DIR / "chapter1.json").read_text())
    for row in data["results"]:
        if row["run_engine"] == "stand-in":
            row["run_gpu"] = "NVIDIA A100-SXM4-80GB"  # the stand-in measured on another card: no ratio may be formed
    (tmp_path / "chapter1.json").write_text(json.dumps(data))
    assert engine_comparisons(1, tmp_path) == []
    assert "No experiment has been run by both NeMo and the stand-in on the same card" in stand_in_caveat(1, tmp_path)
