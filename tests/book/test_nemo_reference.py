"""The chapters 1-2 reference view: rows from the stored runs on real GPUs, predictions next to them,
rows not run shown as "not measured yet"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workshop_lib.book.reference.nemo_views import (
    REFERENCE_DIR,
    chapter_rows,
    measured_table,
    memory_sentences,
    provenance_line,
    reference_table,
    resolved_table,
)


@pytest.mark.parametrize("chapter", [1, 2])
def test_every_experiment_has_a_row_and_unmeasured_rows_say_so(chapter):
    assert list(reference_table(chapter)["experiment"]) == [e.id for e in chapter_rows(chapter)]
    table = measured_table(chapter)
    assert list(dict.fromkeys(table["experiment"])) == [e.id for e in chapter_rows(chapter)]
    stored = {(row["id"], row["run_engine"]): row
              for row in json.loads((REFERENCE_DIR / f"chapter{chapter}.json").read_text())["results"]}
    for _, row in table.iterrows():
        if row["engine"] == "—":
            assert row["state"].startswith("not measured yet") and row["nvidia-smi peak GiB/GPU"] == "—"
            assert not any(key[0] == row["experiment"] for key in stored)
            continue
        engine = "nemo" if row["engine"].startswith("NeMo") else "stand-in"
        run = stored[(row["experiment"], engine)]
        assert row["state"] == run["state"] == "COMPLETED" and row["card"] in run["run_gpu"]
        assert row["nvidia-smi peak GiB/GPU"] == pytest.approx(run["gpu_peak_max_mib"] / 1024, abs=0.05)
        if engine == "stand-in":  # the number shown is the run's own, in GiB, at the real shape
            assert row["allocated GiB/GPU"] == pytest.approx(run["allocated_peak_mib"] / 1024, abs=0.05)
            assert run["run_model"] in ("llama-3.1-8b", "mixtral-8x7b") and run["run_seq_len"] == 2048


def test_the_measured_rows_are_real_shapes_on_real_gpus():
    line = provenance_line(1)
    assert "H200" in line and "stand-in, not NeMo" in line and "run_engine" not in line
    table = measured_table(1)
    sentences = memory_sentences(table)
    measured = table[table["state"] == "COMPLETED"]
    assert len(sentences) == len(measured) >= 1
    for sentence, (_, row) in zip(sentences, measured.iterrows()):
        shown = row["allocated GiB/GPU"] if row["engine"] == "stand-in" else row["nvidia-smi peak GiB/GPU"]
        assert f"{shown:.1f} GiB" in sentence and f"{row['predicted GiB/GPU']:.1f} GiB predicted" in sentence


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


def test_nemo_and_the_stand_in_side_by_side_as_one_observation_never_a_ratio():
    from workshop_lib.book.reference.nemo_views import engine_comparisons, nemo_run_line, stand_in_caveat

    rows = json.loads((REFERENCE_DIR / "chapter1.json").read_text())["results"]
    done = {(r["id"], r["run_engine"]): r for r in rows if r["state"] == "COMPLETED"}
    # The experiments both engines completed on one kind of card: only those are shown side by side.
    same_card = sorted(experiment for experiment, engine in done if engine == "nemo" and (experiment, "stand-in") in done
                       and done[experiment, "nemo"]["run_gpu"] == done[experiment, "stand-in"]["run_gpu"])
    assert same_card, "the reference holds no experiment run by both engines on one card"
    assert sorted(p["experiment"] for p in engine_comparisons(1)) == same_card
    experiment = same_card[0]
    nemo, stand_in = done[experiment, "nemo"], done[experiment, "stand-in"]
    assert nemo["nemo_version"] == "2.4.1"
    [pair] = [p for p in engine_comparisons(1) if p["experiment"] == experiment]
    assert not any("ratio" in key for key in pair)
    caveat = stand_in_caveat(2)  # chapter 2's stand-in rows carry chapter 1's observation
    assert f"{nemo['mean_step_time_s']:.2f} s per step" in caveat and f"the stand-in {stand_in['mean_step_time_s']:.2f} s" in caveat
    assert "×" not in caveat and "no factor" in caveat and "different work" in caveat
    table = measured_table(1)
    shown = table[(table["experiment"] == experiment) & (table["engine"] == "NeMo 2.4.1")].iloc[0]
    assert shown["nvidia-smi peak GiB/GPU"] == round(nemo["gpu_peak_max_mib"] / 1024, 1)
    assert "NeMo 2.4.1" not in set(table[table["experiment"] == "lora/llama/8-gpus"]["engine"])  # NeMo has not run it
    line = nemo_run_line(1)
    assert "was trained by NeMo 2.4.1 itself" in line and "GiB predicted for NeMo" in line
    assert "runs faster" not in line and "upper bound" in line


def test_no_ratio_without_both_engines_on_the_same_card(tmp_path):
    from workshop_lib.book.reference.nemo_views import engine_comparisons, stand_in_caveat

    data = json.loads((REFERENCE_DIR / "chapter1.json").read_text())
    for row in data["results"]:
        if row["run_engine"] == "stand-in":
            row["run_gpu"] = "NVIDIA A100-SXM4-80GB"  # the stand-in measured on another card: no ratio may be formed
    (tmp_path / "chapter1.json").write_text(json.dumps(data))
    assert engine_comparisons(1, tmp_path) == []
    assert "No experiment has been run by both NeMo and the stand-in on the same card" in stand_in_caveat(1, tmp_path)
