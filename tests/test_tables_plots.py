"""Figures are drawn from completed runs only, with labelled axes."""

import json

import matplotlib

matplotlib.use("Agg")

from workshop_lib.plots import efficiency_plot, loss_curves, memory_plot, speedup_plot  # noqa: E402
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
    from workshop_lib import plots

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
