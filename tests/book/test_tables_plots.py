"""Figures are drawn from completed runs only, with labelled axes."""

import json

import matplotlib

matplotlib.use("Agg")

from workshop_lib.book.claims.plots import efficiency_plot, loss_curves, memory_plot, speedup_plot  # noqa: E402
from workshop_lib.results import chapter_results  # noqa: E402


def test_plots_from_weak_scaling_runs(tmp_path):
    runs = tmp_path / "runs"
    for gpus, runtime in ((2, 10.0), (4, 12.5)):
        folder = runs / f"fsdp/weak-scaling/{gpus}-gpus/train"
        folder.mkdir(parents=True)
        lines = [json.dumps({"kind": "step", "step": s, "loss": 3.0 - s / 10}) for s in range(1, 4)]
        lines.append(json.dumps({"kind": "summary", "train_runtime_s": runtime, "final_loss": 2.7}))
        (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    results = chapter_results(4, runs)
    weak = results[results["group"] == "weak-scaling"]
    efficiency = efficiency_plot(weak).axes[0]
    measured = efficiency.lines[-1]
    assert list(measured.get_ydata()) == [100.0, 80.0]
    assert efficiency.get_ylabel() == "efficiency (%)" and efficiency.get_xlabel() == "GPUs"
    assert len(loss_curves(weak).axes[0].lines) == 2
    speedup = speedup_plot(weak, metric="train_runtime_s").axes[0]
    assert list(speedup.lines[0].get_ydata()) == [1.0, 2.0]  # ideal
    assert len(memory_plot(weak).axes[0].patches) == 0  # no memory was recorded: nothing drawn, not zeros


def test_memory_layout_diagrams_follow_the_model_state_formulas():
    import matplotlib

    matplotlib.use("Agg")
    from workshop_lib.book.claims import plots

    zero = plots.zero_layouts(2)
    total = {name: sum(layout.get("gpu", {}).values()) + sum(layout.get("host", {}).values())
             for name, layout in zero.items()}
    assert total["ZeRO-0 (data parallel)"] == 16  # 2 + 2 + 12 bytes per parameter
    assert total["ZeRO-3"] == 16 / 2 and sum(zero["ZeRO-2"]["gpu"].values()) == 2 + 14 / 2
    fsdp = plots.fsdp_layouts(2, 2)
    assert sum(fsdp["FULL_SHARD"]["gpu"].values()) == 16 / 4 and sum(fsdp["HYBRID_SHARD"]["gpu"].values()) == 16 / 2
    figure = plots.memory_layout_diagram(zero, "ZeRO")
    assert len(figure.axes[0].patches) == sum(len(part) for layout in zero.values() for part in layout.values())
    layouts = plots.mixtral_layouts(4)
    assert [box.split("\n")[0] for box in layouts["EP 4"]] == ["experts 0–1", "experts 2–3", "experts 4–5",
                                                                "experts 6–7"]
    # Megatron carves EP out of the data-parallel ranks: every layout but TP 4 splits the batch.
    assert all(box.endswith("1/4 of the batch") for box in layouts["EP 4"] + layouts["DP 4"])
    assert all(box.endswith("1/2 of the batch") for box in layouts["TP 2 × EP 2"])
    assert len(plots.gpu_layout_diagram(layouts, "Mixtral").axes[0].patches) == 16


def _weak_runs(tmp_path, losses: dict[int, list[float]], runtimes: dict[int, float]):
    runs = tmp_path / "runs"
    for gpus, values in losses.items():
        folder = runs / f"fsdp/weak-scaling/{gpus}-gpus/train"
        folder.mkdir(parents=True)
        lines = [json.dumps({"kind": "step", "step": s, "loss": loss}) for s, loss in enumerate(values, 1)]
        lines.append(json.dumps({"kind": "summary", "train_runtime_s": runtimes[gpus], "final_loss": values[-1]}))
        (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    results = chapter_results(4, runs)
    return results[results["group"] == "weak-scaling"]


def test_a_loss_curve_identical_to_another_says_so_and_stays_visible(tmp_path):
    weak = _weak_runs(tmp_path, {2: [3.0, 2.9, 2.8], 4: [3.0, 2.9, 2.8]}, {2: 10.0, 4: 12.0})
    axes = loss_curves(weak).axes[0]
    first, second = axes.lines
    assert second.get_label() == "4-gpus (same values as 2-gpus)"
    assert second.get_linestyle() != first.get_linestyle() and second.get_marker() == "o"
    different = _weak_runs(tmp_path / "other", {2: [3.0, 2.9], 4: [3.0, 2.7]}, {2: 10.0, 4: 12.0})
    assert "same values" not in "".join(line.get_label() for line in loss_curves(different).axes[0].lines)


def test_a_speedup_above_ideal_is_marked_as_warm_up(tmp_path):
    weak = _weak_runs(tmp_path, {2: [3.0], 4: [3.0]}, {2: 40.0, 4: 10.0})  # 4x on 2x the GPUs
    axes = speedup_plot(weak, metric="train_runtime_s").axes[0]
    assert any("a warm-up, not scaling" in text.get_text() for text in axes.texts)
    even = _weak_runs(tmp_path / "even", {2: [3.0], 4: [3.0]}, {2: 10.0, 4: 6.0})
    assert not speedup_plot(even, metric="train_runtime_s").axes[0].texts


def test_chapter_2_draws_a_bar_per_layout_not_a_line_over_gpus():
    import pandas as pd

    from workshop_lib.book.claims.plots import step_time_plot
    from workshop_lib.book.tables import layout_name
    from workshop_lib.experiments import chapter_experiments

    rows = [{**e.to_dict(), "gpus": e.gpus, "state": "COMPLETED", "mean_step_time_s": 1.0 + i}
            for i, e in enumerate(chapter_experiments(2)[:3])]
    axes = step_time_plot(pd.DataFrame(rows), "mean_step_time_s", layout_name, "t").axes[0]
    labels = [tick.get_text() for tick in axes.get_xticklabels()]
    assert labels == ["TP 2 x DP 2\n(4 GPUs)", "TP 4\n(4 GPUs)", "TP 8\n(8 GPUs)"] and len(axes.patches) == 3
