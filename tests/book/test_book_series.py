"""One series at a time: no table, plot, caption or time plan of the book divides or pools rows of two engines
or two kinds of card. Small synthetic reference files mix NeMo and the stand-in on H100s and H200s."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from repo_paths import REPO

from workshop_lib.book.measurements.series import MixedSeriesError, Series, choose_series, same_series
from workshop_lib.experiments import get_experiment

H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
STAND_IN_SESSION = {"date": "2026-11-22T18:00:00+00:00", "gpus": [f"{H200}, 580, 143771 MiB"] * 4,
                    "command": "benchmarks/reference_runs.py --chapter 1 --only lora/llama/2-gpus lora/llama/4-gpus",
                    "torch": "2.11.0", "transformers": "5.17.0", "peft": "0.21.0", "nemo_toolkit": "unavailable"}
NEMO_SESSION = {"date": "2026-11-27T10:00:00+00:00", "gpus": [f"{H100}, 580, 81559 MiB"] * 4,
                "command": "benchmarks/reference_runs.py --chapter 1 --profile gpu-workstation-nemo --only "
                           "lora/llama/1-gpu lora/llama/2-gpus",
                "torch": "2.7.0", "transformers": "4.51.3", "peft": "0.17.1", "nemo_toolkit": "2.4.1"}


def row(experiment_id: str, engine: str, gpu: str, total: float = 100.0, step: float = 1.0, peak: float = 20000.0,
        **extra) -> dict:
    experiment = get_experiment(experiment_id)
    stand_in = engine == "stand-in"
    return {**experiment.to_dict(), "id": experiment_id, "gpus": experiment.gpus, "state": "COMPLETED",
            "total_time_s": total, "mean_step_time_s": step, "gpu0_peak_mib": peak, "gpu_peak_max_mib": peak,
            "run_engine": engine, "run_gpu": gpu, "nemo_version": None if stand_in else "2.4.1",
            "run_settings": {"max_steps": 30} if stand_in else {}, **extra}


def mixed_chapter_1() -> tuple[dict, pd.DataFrame]:
    rows = [row("lora/llama/1-gpu", "nemo", H100, 180, 1.8), row("lora/llama/2-gpus", "nemo", H100, 110, 1.1),
            row("lora/llama/1-gpu", "nemo", H200, 170, 1.7),
            row("lora/llama/2-gpus", "stand-in", H200, 60, 1.2), row("lora/llama/4-gpus", "stand-in", H200, 40, 0.6),
            row("lora/mixtral/2-gpus", "stand-in", H200, 70, 1.4)]
    data = {"profile": "gpu-workstation", "provenance": [STAND_IN_SESSION, NEMO_SESSION], "results": rows}
    return data, pd.DataFrame(rows)


def test_nemo_is_chosen_where_it_ran_on_the_card_with_the_most_rows():
    data, frame = mixed_chapter_1()
    llama = [r for r in data["results"] if r["group"] == "llama"]
    choice = choose_series(llama, data["provenance"])
    assert choice.series == Series("nemo", "H100")
    assert [r["id"] for r in choice.rows] == ["lora/llama/1-gpu", "lora/llama/2-gpus"]
    assert len(choice.left_out) == 3 and "most rows" in choice.reason and "2 of 3" in choice.reason
    text = choice.left_out_text("book/reference/chapter1.json")
    assert "1 row by NeMo on H200" in text and "2 rows by the PyTorch stand-in (not NeMo) on H200" in text
    mixtral = choose_series([r for r in data["results"] if r["group"] == "mixtral"], data["provenance"])
    assert mixtral.series == Series("stand-in", "H200") and mixtral.left_out == []  # no NeMo row: the stand-in's


def test_cards_with_as_many_rows_go_to_the_one_measured_last():
    older = {**NEMO_SESSION, "date": "2026-11-20T00:00:00+00:00"}
    newer = {**NEMO_SESSION, "date": "2026-11-28T00:00:00+00:00", "gpus": [f"{H200}, 580, 143771 MiB"]}
    rows = [row("lora/llama/1-gpu", "nemo", H100), row("lora/llama/1-gpu", "nemo", H200)]
    choice = choose_series(rows, [older, newer])
    assert choice.series == Series("nemo", "H200") and "measured last (2026-11-28)" in choice.reason


@pytest.mark.parametrize("other", [row("lora/llama/2-gpus", "stand-in", H100),  # another engine
                                   row("lora/llama/2-gpus", "nemo", H200)])  # another card
def test_no_table_or_plot_divides_rows_of_two_series(other):
    from workshop_lib.book.claims.plots import speedup_plot
    from workshop_lib.book.tables.columns import ratio
    from workshop_lib.book.tables.nemo import chapter_1_tables

    base = row("lora/llama/1-gpu", "nemo", H100)
    with pytest.raises(MixedSeriesError, match="different engines or cards"):
        ratio(base, other, "total_time_s")
    with pytest.raises(MixedSeriesError):
        chapter_1_tables(pd.DataFrame([base, other]))
    with pytest.raises(MixedSeriesError):
        speedup_plot(pd.DataFrame([base, other]))
    assert same_series(base, row("lora/llama/2-gpus", "nemo", H100)) == Series("nemo", "H100")


def test_the_chapter_shows_one_series_per_table_each_with_its_own_provenance():
    from workshop_lib.book.reference.chapter_views import reference_caption, reference_series

    data, frame = mixed_chapter_1()
    shown = {choice.series: (choice, rows) for choice, rows in reference_series(1, (data, frame))}
    assert set(shown) == {Series("nemo", "H100"), Series("stand-in", "H200")}
    nemo_choice, nemo_rows = shown[Series("nemo", "H100")]
    caption = reference_caption(data, nemo_rows, "book/reference/chapter1.json", nemo_choice)
    # NeMo's session only: its card, date, versions, profile, and the steps its profile capped the run at.
    assert "4 × NVIDIA H100 80GB HBM3" in caption and "2026-11-27" in caption and "transformers 4.51.3" in caption
    assert "NeMo 2.4.1" in caption and "gpu-workstation-nemo" in caption and "60 optimizer steps" in caption
    assert "H200 (" not in caption.split("Not shown")[0] and "2026-11-22" not in caption and "5.17" not in caption
    stand_in_choice, stand_in_rows = shown[Series("stand-in", "H200")]
    assert list(stand_in_rows["group"]) == ["mixtral"]  # the Llama stand-in rows left the table: NeMo ran it
    caption = reference_caption(data, stand_in_rows, "book/reference/chapter1.json", stand_in_choice)
    assert "4 × NVIDIA H200" in caption and "2026-11-22" in caption and "transformers 5.17.0" in caption
    assert "H100" not in caption and "4.51.3" not in caption and "30 optimizer steps" in caption
    with pytest.raises(MixedSeriesError):  # one caption never pools two series
        reference_caption(data, frame, "book/reference/chapter1.json")


def test_two_layouts_on_the_same_gpus_are_compared_as_layouts_not_scaling():
    from workshop_lib.book.tables.nemo import chapter_2_tables

    rows = [row("model-parallel/llama/tp2-dp2", "nemo", H200, 200, 2.0, 60000),
            row("model-parallel/llama/tp4", "nemo", H200, 100, 1.5, 50000),  # faster on the same 4 GPUs
            row("model-parallel/llama/tp8", "nemo", H200, 150, 1.0, 30000)]
    table = chapter_2_tables(pd.DataFrame(rows))[0]
    frame = table.frame.set_index("Layout")
    assert frame.loc["TP 4", "Time scaling vs 4 GPU"] == "—" and frame.loc["TP 8", "Time scaling vs 4 GPU"] == 1.33
    assert frame.loc["TP 4", "Step time vs TP 2 x DP 2 (same GPUs)"] == 0.75
    assert frame.loc["TP 4", "Peak memory vs TP 2 x DP 2 (same GPUs)"] == 0.83
    assert frame.loc["TP 8", "Step time vs TP 2 x DP 2 (same GPUs)"] == "—"
    assert "choice of layout, not a step of scaling" in table.note
    assert "warm-up" not in table.note  # a faster layout on as many GPUs is no warm-up


def test_the_time_plan_estimates_a_table_from_one_series(tmp_path):
    from workshop_lib.book.plans.time_plan import estimate_chapter
    from workshop_lib.experiments import chapter_experiments

    data, _ = mixed_chapter_1()
    (tmp_path / "chapter1.json").write_text(json.dumps(data))
    estimates = {e.experiment.id: e for e in estimate_chapter(chapter_experiments(1), folder=tmp_path)}
    for experiment_id in ("lora/llama/1-gpu", "lora/llama/2-gpus", "lora/llama/4-gpus", "lora/llama/8-gpus"):
        estimate = estimates[experiment_id]
        assert (estimate.reference_engine, estimate.card.name) == ("nemo", "H100 SXM"), experiment_id
    assert estimates["lora/llama/4-gpus"].basis == "like lora/llama/2-gpus"  # NeMo's, not the stand-in's 4-GPU row
    assert estimates["lora/mixtral/4-gpus"].reference_engine == "stand-in"  # NeMo never ran Mixtral here


def test_no_generated_sentence_divides_rows_of_two_cards():
    from workshop_lib.book.claims import sentences as claims
    from workshop_lib.book.reference.chapter_views import reference_results

    results = reference_results(4)[1].copy()
    assert claims.fsdp_one_node(results)  # one card today: the sentence is written
    results.loc[results["id"] == "fsdp/multi-gpu/4-gpus", "run_gpu"] = H100
    with pytest.raises(MixedSeriesError):
        claims.fsdp_one_node(results)


def test_each_chapter_4_table_has_its_own_caption_naming_the_fsdp_that_ran():
    from workshop_lib.book.reference.chapter_views import reference_caption, reference_results, reference_series

    data, results = reference_results(4)
    captions = {}
    for choice, frame in reference_series(4, (data, results)):
        for group, rows in frame.groupby("group"):
            captions[group] = reference_caption(data, rows, "book/reference/chapter4.json", choice)
    assert "FSDP2 (FULL_SHARD, SHARD_GRAD_OP)" in captions["strategies"] and "2 nodes × 2 GPUs" in captions["strategies"]
    assert "FSDP1 (FULL_SHARD)" in captions["gpt"] and "FSDP2" not in captions["gpt"]
    assert "FSDP" not in captions["baseline"] and "DeepSpeed" not in captions["baseline"]
    tables = ("baseline", "strategies", "multi-gpu", "gpt", "weak-scaling")  # the table keys of the parts
    assert len({captions[key] for key in tables}) == len(tables)  # no one caption pasted under every table
    assert not any("emulated" in text or "local executor" in text for text in captions.values())


def test_a_second_run_on_the_baselines_gpus_is_no_scaling_step_in_chapter_1_either():
    from workshop_lib.book.tables.nemo import chapter_1_tables

    packed = {**row("lora/llama/1-gpu", "nemo", H200, 60, 0.5, 25000), "id": "lora/llama/1-gpu-packed"}
    rows = [row("lora/llama/1-gpu", "nemo", H200, 180, 1.8, 22000), packed,
            row("lora/llama/2-gpus", "nemo", H200, 110, 1.1, 22000)]
    table = chapter_1_tables(pd.DataFrame(rows))[0]
    frame = table.frame.set_index("Run")
    assert frame.loc["lora/llama/1-gpu-packed", "Time scaling vs 1 GPU"] == "—"  # not 3.0 "on 1 GPU"
    assert frame.loc["lora/llama/1-gpu-packed", "Step time vs lora/llama/1-gpu (same GPUs)"] == round(0.5 / 1.8, 2)
    assert frame.loc["lora/llama/2-gpus", "Time scaling vs 1 GPU"] == round(180 / 110, 2)
    assert "not a step of scaling" in table.note and "warm-up" not in table.note


def test_a_caption_lists_only_the_rows_its_own_table_left_out():
    from workshop_lib.book.reference.chapter_views import reference_caption, reference_series

    data, _ = mixed_chapter_1()
    data["results"].append(row("lora/mixtral/2-gpus", "nemo", H100, 90, 1.5))  # NeMo ran Mixtral too
    frame = pd.DataFrame(data["results"])
    [(choice, rows)] = [(c, r) for c, r in reference_series(1, (data, frame)) if c.series == Series("nemo", "H100")]
    llama = reference_caption(data, rows[rows["group"] == "llama"], "book/reference/chapter1.json", choice)
    mixtral = reference_caption(data, rows[rows["group"] == "mixtral"], "book/reference/chapter1.json", choice)
    assert "2 rows by the PyTorch stand-in (not NeMo) on H200" in llama  # Llama's own, not Mixtral's
    assert "1 row by the PyTorch stand-in (not NeMo) on H200" in mixtral and "NeMo on H200" not in mixtral


def test_the_reference_files_have_one_reader(tmp_path):
    """book/reference/*.json is parsed in one place (book.measurements.reference_files): a single provenance
    record reads as a list, a missing file as None, and the views read through it, so they agree."""
    import ast

    from workshop_lib.book.measurements.reference_files import read_reference
    from workshop_lib.book.plans.time_plan import reference_data
    from workshop_lib.book.reference.nemo_views import measured_results

    (tmp_path / "chapter9.json").write_text(json.dumps({
        "profile": "tiny", "provenance": {"torch": "2.5"},
        "results": [{"id": "a", "state": "COMPLETED"}, {"id": "b", "state": "FAILED", "run_engine": "nemo"}]}))
    stored = read_reference(9, tmp_path)
    assert stored.provenance == [{"torch": "2.5"}] and stored.profile == "tiny"
    assert [row["id"] for row in stored.completed()] == ["a"]
    assert read_reference(8, tmp_path) is None and reference_data(8, tmp_path) == ([], [])
    assert reference_data(9, tmp_path) == ([{"torch": "2.5"}], [{"id": "a", "state": "COMPLETED",
                                                                  "reference_profile": "tiny"}])
    assert measured_results(9, tmp_path, "nemo") == ([{"torch": "2.5"}], {"b": stored.results[1]})

    book = REPO / "workshop_lib" / "book"
    readers = []
    for path in book.rglob("*.py"):
        tree = ast.parse(path.read_text())
        names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
        parses = any(isinstance(node, ast.Attribute) and node.attr in ("load", "loads")
                     and isinstance(node.value, ast.Name) and node.value.id == "json" for node in ast.walk(tree))
        if parses and "REFERENCE_DIR" in names:
            readers.append(path.relative_to(book).as_posix())
    assert readers == ["measurements/reference_files.py"], readers
