"""The recipe benchmark's book tables are computed from the stored result files (benchmarks/results/recipe/)."""

from __future__ import annotations

import json

import pytest

from workshop_lib.book.reference import benchmark_views as views
from workshop_lib.core.vocabulary import parse_recipe


def _variant(recipe, features, samples_per_s, end_to_end, eval_loss, **extra):
    return {"recipe": recipe, "features": list(features), "samples_per_s": samples_per_s,
            "end_to_end_samples_per_s": end_to_end, "eval_loss": eval_loss, "train_runtime_s": 1500 / end_to_end,
            "mfu": samples_per_s / 1000, "peak_memory_mib": 20480, "kernel_cache_files_at_start": 0, **extra}


def test_variants_are_named_by_what_ran_not_by_the_label_of_their_day():
    tuned = parse_recipe("tuned")
    assert views.recipe_label({"recipe": "tuned+grouping", "features": tuned}) == "tuned"
    older = [f for f in tuned if f != "grouping"]
    assert views.recipe_label({"recipe": "tuned", "features": older}) == "tuned − grouping"
    assert views.recipe_label({"recipe": "tuned#2", "features": [*tuned, "compile"]}) == "tuned + compile#2"
    assert views.recipe_label({"recipe": "seed+bf16", "features": ["bf16"]}) == "seed+bf16"


def test_side_by_side_takes_each_workload_from_the_first_file_with_seed_and_tuned(tmp_path):
    tuned = parse_recipe("tuned")
    first = {"workloads": [{"name": "baseline", "what": "500 x 3", "variants": [
        _variant("seed", [], 50.0, 40.0, 5.0), _variant("tuned+grouping", tuned, 200.0, 120.0, 5.05)]}]}
    second = {"workloads": [
        {"name": "baseline", "what": "500 x 3", "variants": [
            _variant("seed", [], 50.0, 40.0, 5.0), _variant("tuned", tuned, 999.0, 999.0, 5.0)]},
        {"name": "long", "what": "1600 x 1", "variants": [
            _variant("seed", [], 60.0, 50.0, 4.0), _variant("tuned", tuned, 240.0, 100.0, 3.96),
            {"recipe": "tuned+compile", "returncode": "timeout"}]}]}
    paths = []
    for index, document in enumerate((first, second)):
        paths.append(tmp_path / f"r{index}.json")
        paths[-1].write_text(json.dumps(document))
    table = views.recipe_end_to_end_table(paths)
    assert table["result file"].tolist() == ["r0.json", "r1.json"]  # baseline not taken twice
    assert table["steady × seed"].tolist() == pytest.approx([4.0, 4.0])
    assert table["end to end × seed"].tolist() == pytest.approx([3.0, 2.0])
    assert table["Δ eval loss %"].tolist() == pytest.approx([1.0, -1.0])
    headline = views.recipe_headline(paths)
    assert "3.0× end to end and 4.0× in its steady steps" in headline and "eval loss -1.0 %" in headline


def test_stored_results_give_the_figures_the_chapter_shows():
    if not all(path.is_file() for path in views.RECIPE_END_TO_END):
        pytest.skip("no stored recipe benchmark results")
    table = views.recipe_end_to_end_table()
    assert set(table["workload"].str.contains("500 samples x 3 epochs")) >= {True}
    for (workload, seed, tuned, path), row in zip(views._seed_and_tuned(views.RECIPE_END_TO_END), table.itertuples()):
        assert tuple(tuned["features"]) == parse_recipe("tuned")  # today's tuned recipe, whatever its label then
        # the ratio the benchmark stored for that variant is the one the table shows
        assert tuned["end_to_end_speedup_vs_seed"] == pytest.approx(row[table.columns.get_loc("end to end × seed") + 1])
    gains = views.recipe_gains_table()
    assert gains["recipe"].iloc[0] == "seed" and gains["recipe"].iloc[-1] == "tuned"
    assert all(gains["why"].str.len() > 0)  # every change has its reason


def test_the_chapter_gets_both_tables_with_generated_notes():
    if not all(path.is_file() for path in (*views.RECIPE_END_TO_END, views.RECIPE_LADDER)):
        pytest.skip("no stored recipe benchmark results")
    (title, table, note, _), (ladder_title, ladder, ladder_note, _) = views.recipe_benchmark_tables()
    assert "end to end" in title and len(table) == 2 and "why" in ladder.columns
    first = table.iloc[0]
    assert f"{first['end to end × seed']:.1f}× end to end" in note  # the prose carries the table's figure


def test_the_second_job_sentence_says_whether_the_first_started_cold():
    tuned = parse_recipe("tuned")
    second = {"second": {"recipe": "tuned#2", "features": tuned}, "first_train_runtime_s": 13.7,
              "second_train_runtime_s": 11.7, "first_kernel_cache_files": 0, "second_kernel_cache_files": 43}
    cold = views.second_job_sentence(second)
    assert "empty kernel cache" in cold and "13.7 s, then 11.7 s" in cold and "(tuned)" in cold
    warm = views.second_job_sentence({**second, "first_kernel_cache_files": 35})
    assert "already filled" in warm and "35 and 43 files" in warm and "empty" not in warm


def test_mfu_divides_by_the_datasheet_peak_and_keeps_the_measured_fraction_beside_it():
    document = {"provenance": {"gpu": "NVIDIA H100 80GB HBM3"}, "matmul_peak": {"tflops": 784.0}}
    mfu, of_measured = views.mfu_figures({"mfu": 0.25}, document)
    assert of_measured == pytest.approx(25.0)
    assert mfu == pytest.approx(25.0 * 784 / 989)  # 989 TFLOP/s: H100 SXM, bf16, dense
    assert views.mfu_figures({"mfu": 0.25}, {**document, "provenance": {"gpu": "NVIDIA H100 PCIe"}}) == (None, 25.0)
    headline = views.recipe_headline()
    assert "MFU against the datasheet peak" in headline and "of the matmul rate measured in the run" in headline
