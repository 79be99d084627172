"""Which figures a chapter part shows, drawn from a results frame (the reference's or the participant's
runs), titled by whose runs they are and naming a profile's stand-in models as such; shown inline, or a note
where a figure has nothing drawn."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import pandas as pd

from workshop_lib.book import plots
from workshop_lib.book.html import display, message
from workshop_lib.book.tables import (
    MODEL_NAMES, layout_name, ran_fixed_steps, rename_models, stand_in_names, step_time_key,
)
from workshop_lib.profiles import Profile
from workshop_lib.results import COMPLETED


def _has_data(figure) -> bool:
    return any(axes.lines or axes.patches or axes.collections for axes in figure.axes)


def show_figure(figure, empty_message: str = "no completed run recorded this value yet") -> bool:
    """Show a matplotlib figure inline (once) and close it; a note instead when it has nothing drawn."""
    import matplotlib.pyplot as plt

    drawn = _has_data(figure)
    if drawn:
        display(figure)
    else:
        title = figure.axes[0].get_title() if figure.axes else "plot"
        message(f"{title}: {empty_message}.")
    plt.close(figure)
    return drawn


def show_figures(figures: Sequence) -> int:
    """Every figure of a list (see `show_figure`); returns how many had data."""
    return sum(show_figure(figure) for figure in figures)


def chapter_figures(chapter: int, results: pd.DataFrame, keys: Sequence[str] | None = None,
                    label: str = "", profile: Profile | None = None) -> list:
    """The figures of a chapter's parts ``keys`` (all when None) from a results frame, titles ending in
    ``label`` (whose runs they show) and naming ``profile``'s stand-in models as such. Loss curves need
    the runs' folders, so a reference has none."""
    figures = _chapter_figures(chapter, results, keys, label)
    names = stand_in_names(profile) if profile is not None else {}
    for figure in figures if names else ():
        for axes in figure.axes:
            axes.set_title(rename_models(axes.get_title(), names), wrap=True)
    return figures


def _chapter_figures(chapter: int, results: pd.DataFrame, keys: Sequence[str] | None, label: str) -> list:
    wanted = (lambda key: True) if keys is None else (lambda key: key in keys)  # noqa: E731
    group = lambda name: results[results["group"] == name]  # noqa: E731
    suffix = f" ({label})" if label else ""
    memory = _memory_metric(results)
    has_folders = "run_dir" in results and any(Path(str(d)).is_dir() for d in results["run_dir"].dropna())
    figures = []
    if chapter in (1, 2):
        what = "LoRA, data parallel" if chapter == 1 else "tensor (x expert) parallel"
        for name, model in (("llama", "llama-3.1-8b"), ("mixtral", "mixtral-8x7b")):
            if wanted(name) and len(group(name)) > 1:
                shown = MODEL_NAMES[model]
                if chapter == 1:
                    figures.append(plots.speedup_plot(group(name), "total_time_s",
                                                      f"{shown} ({what}): speedup of the total job time{suffix}"))
                else:  # layouts, not GPU counts, are what differ (two of them use 4 GPUs)
                    step = step_time_key(group(name).to_dict("records"))
                    figures.append(plots.step_time_plot(group(name), step, layout_name,
                                                        f"{shown} ({what}): step time per layout{suffix}"))
        if wanted("memory"):
            figures.append(plots.memory_plot(results, by="id", metric=memory[0],
                                             title=f"Peak memory per process ({memory[1]}){suffix}", ylabel="MiB"))
        if wanted("loss") and has_folders:
            figures.append(plots.loss_curves(results, f"Training loss per run{suffix}"))
    elif chapter == 3:
        single = pd.concat([group("baseline"), group("single-gpu")])
        if wanted("single-gpu"):
            figures.append(plots.memory_plot(single, by="id", metric=memory[0],
                                             title=f"One GPU: peak memory per ZeRO setup ({memory[1]}){suffix}",
                                             ylabel="MiB"))
            figures.append(plots.cpu_memory_plot(single, f"One GPU: CPU memory of the job (psrecord){suffix}"))
            if has_folders:
                figures.append(plots.loss_curves(single, f"Training loss, one GPU{suffix}"))
        if wanted("two-gpus"):
            figures.append(plots.memory_plot(group("two-gpus"), by="id", metric=memory[0],
                                             title=f"Two GPUs: peak memory per GPU ({memory[1]}){suffix}",
                                             ylabel="MiB"))
            figures.append(plots.cpu_memory_plot(group("two-gpus"),
                                                 f"Two GPUs: CPU memory of the job (psrecord){suffix}"))
        if wanted("multi-gpu") or wanted("multi-node"):
            one_gpu = single[single["id"] == "zero/single-gpu/zero0"]
            series = {}
            if wanted("multi-gpu"):
                series["one node (ZeRO 0)"] = pd.concat([one_gpu, group("multi-gpu")])
            if wanted("multi-node"):
                series["2 GPUs per node, across nodes"] = group("multi-node")
            figures.append(_throughput_plot(series, f"Weak scaling: training throughput{suffix}"))
    else:
        one_node = pd.concat([group("single-gpu"), group("multi-gpu")])
        if wanted("multi-gpu"):
            if ran_fixed_steps(one_node.to_dict("records")):
                step = step_time_key(one_node.to_dict("records"))
                figures.append(plots.efficiency_plot(one_node, step, "BLOOM-560m with FSDP on one node: weak "
                                                     f"scaling efficiency from the step time{suffix}"))
            else:
                figures.append(plots.speedup_plot(one_node, "train_runtime_s", "BLOOM-560m with FSDP on one node: "
                                                  f"speedup of the training runtime{suffix}"))
        if wanted("strategies"):
            figures.append(plots.memory_plot(group("strategies"), by="id", metric=memory[0],
                                             title=f"Sharding strategies: peak memory per rank ({memory[1]}){suffix}",
                                             ylabel="MiB"))
        if wanted("weak-scaling"):
            depth = group("weak-scaling")
            step = step_time_key(depth.to_dict("records"))
            figures.append(plots.efficiency_plot(depth, step, f"Custom GPT: weak scaling efficiency by depth{suffix}"))
        if wanted("gpt") and has_folders:
            figures.append(plots.loss_curves(pd.concat([group("baseline"), group("single-gpu"), group("gpt")]),
                                             f"Training loss{suffix}"))
    return figures


def _memory_metric(results: pd.DataFrame) -> tuple[str, str]:
    """nvidia-smi's GPU 0 peak where a GPU monitor ran; else the tensor bytes of rank 0 at the step's peak
    (what ZeRO and FSDP shrink, counted even on a CPU); else the engine's own per-rank peak."""
    if "gpu0_peak_mib" in results and results["gpu0_peak_mib"].notna().any():
        return "gpu0_peak_mib", "nvidia-smi, GPU 0"
    if "rank0_step_peak_mib" in results and results["rank0_step_peak_mib"].notna().any():
        return "rank0_step_peak_mib", "tensor bytes at the step's peak, rank 0"
    kinds = results.get("allocated_kind")
    kind = next((str(k) for k in kinds.dropna()), "engine peak") if kinds is not None else "engine peak"
    return "allocated_peak_mib", kind.replace("_", " ")


def _throughput_plot(series: dict[str, pd.DataFrame], title: str):
    """Training samples/s against GPUs, one line per series, with the ideal line from the first point
    (weak scaling: the total throughput should grow in proportion to the GPUs)."""
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4), constrained_layout=True)
    axes.set_title(title)
    axes.set_xlabel("GPUs")
    axes.set_ylabel("train samples/s (all GPUs)")
    axes.grid(alpha=0.3)
    base, ticks = None, set()
    for label, results in series.items():
        done = results[(results["state"] == COMPLETED) & results["train_samples_per_s"].notna()].sort_values("gpus")
        if done.empty:
            continue
        if base is None:
            base = done.iloc[0]
        axes.plot(done["gpus"], done["train_samples_per_s"], "o-", label=label)
        ticks.update(int(g) for g in done["gpus"])
    if base is not None:
        xs = sorted(ticks)
        axes.plot(xs, [base["train_samples_per_s"] * x / base["gpus"] for x in xs], "--", color="grey",
                  label="ideal")
        axes.set_xticks(xs)
        axes.legend()
    return figure
