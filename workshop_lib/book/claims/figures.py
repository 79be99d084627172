"""The figures of a chapter's parts, drawn from a results frame (the reference's or the participant's runs),
titled by whose runs they are and naming a profile's stand-in models as such; shown inline, or a note where a
figure has nothing drawn. Each part names its figure builders (`book.parts`); a builder gets the results and
the part's key and returns its figures (none when the runs cannot draw one)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import pandas as pd

from workshop_lib.book.claims import plots
from workshop_lib.book.pages.html import display, message
from workshop_lib.book.tables import (
    MODEL_NAMES,
    layout_name,
    ran_fixed_steps,
    rename_models,
    stand_in_names,
    step_time_key,
)
from workshop_lib.experiments import known_id
from workshop_lib.results import COMPLETED
from workshop_lib.sites.profiles import Profile

if TYPE_CHECKING:
    from workshop_lib.book.parts import Part


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


@dataclass(frozen=True)
class FigureData:
    """What a part's figure builders draw from: one results frame (the reference's or your runs'), the parts
    asked for, the title suffix saying whose runs they are, the memory metric those runs recorded, and whether
    their folders are here (loss curves read them, so a reference has none)."""

    results: pd.DataFrame
    keys: frozenset[str]
    suffix: str
    memory: tuple[str, str]  # (column, how it was measured)
    has_folders: bool

    def group(self, name: str) -> pd.DataFrame:
        return self.results[self.results["group"] == name]


FigureBuilder = Callable[[FigureData, str], list]  # (data, the part's key) -> figures


def chapter_figures(parts: Sequence[Part], results: pd.DataFrame, label: str = "",
                    profile: Profile | None = None) -> list:
    """The figures of the chapter ``parts`` (`book.parts.lookup`), in the chapter's order, from a results frame,
    titles ending in ``label`` (whose runs they show) and naming ``profile``'s stand-in models as such. A
    builder two parts share (one figure with a series per part) draws once."""
    data = FigureData(results, frozenset(part.key for part in parts), f" ({label})" if label else "",
                      _memory_metric(results),
                      "run_dir" in results and any(Path(str(d)).is_dir() for d in results["run_dir"].dropna()))
    figures, drawn = [], set()
    for part in parts:
        for builder in part.figures:
            if builder not in drawn:
                drawn.add(builder)
                figures += builder(data, part.key)
    names = stand_in_names(profile) if profile is not None else {}
    for figure in figures if names else ():
        for axes in figure.axes:
            axes.set_title(rename_models(axes.get_title(), names), wrap=True)
    return figures


# ---- chapters 1 and 2: one figure per model, and (parts of their own) memory and loss -------------------
_MODELS = {"llama": "llama-3.1-8b", "mixtral": "mixtral-8x7b"}  # part key -> the model its runs train


def data_parallel_speedup(data: FigureData, key: str) -> list:
    """Chapter 1: the speedup of the total job time over the GPUs, for one model's LoRA runs."""
    runs = data.group(key)
    if len(runs) < 2:
        return []
    return [plots.speedup_plot(runs, "total_time_s", f"{MODEL_NAMES[_MODELS[key]]} (LoRA, data parallel): speedup "
                                                     f"of the total job time{data.suffix}")]


def step_time_per_layout(data: FigureData, key: str) -> list:
    """Chapter 2: the step time per parallel layout (layouts, not GPU counts, differ: two use 4 GPUs)."""
    runs = data.group(key)
    if len(runs) < 2:
        return []
    step = step_time_key(runs.to_dict("records"))
    return [plots.step_time_plot(runs, step, layout_name, f"{MODEL_NAMES[_MODELS[key]]} (tensor (x expert) "
                                                          f"parallel): step time per layout{data.suffix}")]


def memory_per_process(data: FigureData, key: str) -> list:
    return [plots.memory_plot(data.results, by="id", metric=data.memory[0],
                              title=f"Peak memory per process ({data.memory[1]}){data.suffix}", ylabel="MiB")]


def packing_loss(data: FigureData, key: str) -> list:
    """The packed and unpacked 1-GPU runs' losses against the real tokens each had trained on."""
    from workshop_lib.book.tables.nemo_lessons import packing_rows

    rows = packing_rows(data.results)
    return [plots.loss_against_tokens(pd.DataFrame(rows), f"Packed or not: loss against tokens trained{data.suffix}")] if rows else []


def loss_per_run(data: FigureData, key: str) -> list:
    return [plots.loss_curves(data.results, f"Training loss per run{data.suffix}")] if data.has_folders else []


# ---- chapter 3: ZeRO ------------------------------------------------------------------------------------
def _zero_one_gpu_runs(data: FigureData) -> pd.DataFrame:
    return pd.concat([data.group("baseline"), data.group("single-gpu")])


def zero_one_gpu(data: FigureData, key: str) -> list:
    """GPU and CPU memory of each ZeRO setup on one GPU, and their loss curves where the runs are here."""
    single = _zero_one_gpu_runs(data)
    figures = [plots.memory_plot(single, by="id", metric=data.memory[0],
                                 title=f"One GPU: peak memory per ZeRO setup ({data.memory[1]}){data.suffix}",
                                 ylabel="MiB"),
               plots.cpu_memory_plot(single, f"One GPU: CPU memory of the job (psrecord){data.suffix}")]
    if data.has_folders:
        figures.append(plots.loss_curves(single, f"Training loss, one GPU{data.suffix}"))
    return figures


def zero_two_gpus(data: FigureData, key: str) -> list:
    runs = data.group("two-gpus")
    return [plots.memory_plot(runs, by="id", metric=data.memory[0],
                              title=f"Two GPUs: peak memory per GPU ({data.memory[1]}){data.suffix}", ylabel="MiB"),
            plots.cpu_memory_plot(runs, f"Two GPUs: CPU memory of the job (psrecord){data.suffix}")]


def zero_weak_scaling(data: FigureData, key: str) -> list:
    """One throughput figure for the multi-gpu and multi-node parts: a series for each of them asked for."""
    series = {}
    if "multi-gpu" in data.keys:
        single = _zero_one_gpu_runs(data)
        series["one node (ZeRO 0)"] = pd.concat([single[single["id"] == known_id("zero/single-gpu/zero0")],
                                                 data.group("multi-gpu")])
    if "multi-node" in data.keys:
        series["2 GPUs per node, across nodes"] = data.group("multi-node")
    return [_throughput_plot(series, f"Weak scaling: training throughput{data.suffix}")]


# ---- chapter 4: FSDP ------------------------------------------------------------------------------------
def fsdp_one_node(data: FigureData, key: str) -> list:
    """Weak-scaling efficiency from the step time when the runs did equal work per GPU, else the speedup."""
    one_node = pd.concat([data.group("single-gpu"), data.group("multi-gpu")])
    if ran_fixed_steps(one_node.to_dict("records")):
        step = step_time_key(one_node.to_dict("records"))
        return [plots.efficiency_plot(one_node, step, "BLOOM-560m with FSDP on one node: weak scaling efficiency "
                                                      f"from the step time{data.suffix}")]
    return [plots.speedup_plot(one_node, "train_runtime_s", "BLOOM-560m with FSDP on one node: speedup of the "
                                                            f"training runtime{data.suffix}")]


def fsdp_strategies(data: FigureData, key: str) -> list:
    return [plots.memory_plot(data.group("strategies"), by="id", metric=data.memory[0],
                              title=f"Sharding strategies: peak memory per rank ({data.memory[1]}){data.suffix}",
                              ylabel="MiB")]


def gpt_depth(data: FigureData, key: str) -> list:
    depth = data.group("weak-scaling")
    step = step_time_key(depth.to_dict("records"))
    return [plots.efficiency_plot(depth, step, f"Custom GPT: weak scaling efficiency by depth{data.suffix}")]


def gpt_loss(data: FigureData, key: str) -> list:
    if not data.has_folders:
        return []
    return [plots.loss_curves(pd.concat([data.group("baseline"), data.group("single-gpu"), data.group("gpt")]),
                              f"Training loss{data.suffix}")]


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
