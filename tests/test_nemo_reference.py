"""The chapters 1-2 reference view: rows from the stored runs on real GPUs, predictions next to them,
rows not run shown as "not measured yet"."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from workshop_lib.nemo_reference import (REFERENCE_DIR, chapter_rows, memory_sentences, provenance_line,
                                         reference_table, resolved_table)


@pytest.mark.parametrize("chapter", [1, 2])
def test_every_experiment_has_a_row_and_unmeasured_rows_say_so(chapter):
    table = reference_table(chapter)
    assert list(table["experiment"]) == [e.id for e in chapter_rows(chapter)]
    stored = {row["id"]: row for row in json.loads((REFERENCE_DIR / f"chapter{chapter}.json").read_text())["results"]}
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
    assert "H200" in provenance_line(1) and "stand-ins (not NeMo)" in provenance_line(1)
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
