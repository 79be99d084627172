"""Matplotlib figures of a chapter's results: speedup against ideal, efficiency, peak memory, loss curves.

Each function takes the DataFrame of `workshop_lib.results.chapter_results` (or a part of it) and returns
a Figure; only completed runs are drawn. matplotlib is imported when a plot is asked for."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pandas as pd

from workshop_lib.book.measurements.series import same_series
from workshop_lib.core.log_text import read_text
from workshop_lib.results import COMPLETED
from workshop_lib.results.parse.metrics import parse_metrics


def _figure(title: str, xlabel: str, ylabel: str):
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4), constrained_layout=True)
    axes.set_title(title)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(alpha=0.3)
    return figure, axes


def _completed(results: pd.DataFrame, metric: str) -> pd.DataFrame:
    done = results[(results["state"] == COMPLETED) & results[metric].notna()]
    return done.sort_values("gpus")


def _one_series(done: pd.DataFrame) -> pd.DataFrame:
    """The rows a ratio plot divides: refused where they are of two engines or cards (`book.measurements.series`), and one
    per GPU count (the first by id, as the tables' baseline): a second run on the same GPUs is no scaling step."""
    same_series(*done.to_dict("records"))
    if "id" in done:
        done = done.sort_values(["gpus", "id"]).drop_duplicates("gpus")
    return done


def speedup_plot(results: pd.DataFrame, metric: str = "total_time_s", title: str = "Speedup"):
    """Speedup = time on the fewest GPUs / time on N GPUs, with the ideal (linear) line."""
    done = _one_series(_completed(results, metric))
    figure, axes = _figure(title, "GPUs", "speedup (×)")
    if done.empty:
        return figure
    base = done.iloc[0]
    ideal = done["gpus"] / base["gpus"]
    measured = base[metric] / done[metric]
    axes.plot(done["gpus"], ideal, "--", color="grey", label="ideal")
    axes.plot(done["gpus"], measured, "o-", label="measured")
    if (measured > ideal * 1.001).any():  # more than linear: the baseline carried a one-off cost
        axes.text(0.02, 0.97, "above ideal: the first run carried a one-off start-up\n(a warm-up, not scaling)",
                  transform=axes.transAxes, va="top", fontsize="small", color="#b7791f")
    axes.set_xticks(list(done["gpus"]))
    axes.legend(loc="lower right")
    return figure


def step_time_plot(results: pd.DataFrame, metric: str, label: Callable[[dict], str], title: str):
    """A bar per completed run of its step time, named by ``label`` (chapter 2: the layout, since two
    layouts can share a GPU count and a speedup against GPUs would draw them on one x)."""
    done = _completed(results, metric)
    figure, axes = _figure(title, "layout", "step time (s)")
    if not done.empty:
        names = [f"{label(row)}\n({int(row['gpus'])} GPUs)" for row in done.to_dict("records")]
        axes.bar(range(len(done)), done[metric])
        axes.set_xticks(range(len(done)), names, fontsize="small")
    return figure


def efficiency_plot(results: pd.DataFrame, metric: str = "train_runtime_s", title: str = "Weak scaling efficiency"):
    """Weak scaling efficiency (%) = runtime on the fewest GPUs / runtime on N GPUs × 100."""
    done = _one_series(_completed(results, metric))
    figure, axes = _figure(title, "GPUs", "efficiency (%)")
    if not done.empty:
        axes.axhline(100, linestyle="--", color="grey", label="ideal")
        axes.plot(done["gpus"], 100 * done[metric].iloc[0] / done[metric], "o-", label="measured")
        axes.set_xticks(list(done["gpus"]))
        axes.legend()
    return figure


def memory_plot(results: pd.DataFrame, by: str = "gpus", metric: str = "gpu0_peak_mib",
                title: str = "Peak GPU memory per GPU", ylabel: str = "peak memory (MiB)"):
    """A bar per run of `metric` against `by` (gpus, zero_stage, fsdp, or the run title)."""
    done = results[(results["state"] == COMPLETED) & results[metric].notna()]
    figure, axes = _figure(title, by.replace("_", " "), ylabel)
    if not done.empty:
        labels = [str(value) for value in (done[by] if by in done else done["id"])]
        axes.bar(range(len(done)), done[metric])
        axes.set_xticks(range(len(done)), labels, rotation=30, ha="right")
    return figure


def cpu_memory_plot(results: pd.DataFrame, title: str = "CPU memory under offload"):
    """Peak and average CPU memory (psrecord) of each run that recorded it."""
    done = results[(results["state"] == COMPLETED) & results["cpu_peak_mib"].notna()]
    figure, axes = _figure(title, "run", "CPU memory (MiB)")
    if not done.empty:
        positions = range(len(done))
        axes.bar([p - 0.2 for p in positions], done["cpu_peak_mib"], width=0.4, label="peak")
        axes.bar([p + 0.2 for p in positions], done["cpu_avg_mib"], width=0.4, label="average")
        axes.set_xticks(list(positions), list(done["id"].str.split("/").str[-1]), rotation=30, ha="right")
        axes.legend()
    return figure


def loss_curves(results: pd.DataFrame, title: str = "Training loss"):
    """Loss against step for every completed run with a metrics.jsonl."""
    figure, axes = _figure(title, "step", "loss")
    drawn: dict[tuple, str] = {}  # the values of each curve drawn so far, and its name
    styles = ["-", "--", ":", "-."]
    for row in results[results["state"] == COMPLETED].itertuples():
        path = Path(str(row.run_dir)) / "train" / "metrics.jsonl"
        if not path.exists():
            continue
        steps = parse_metrics(read_text(path)).steps
        if steps:
            name = str(row.id).split("/")[-1]
            values = tuple((s.step, s.loss) for s in steps)
            duplicate = values in drawn
            if duplicate:  # the same numbers would hide under the first curve: say so in the legend
                name = f"{name} (same values as {drawn[values]})"
            else:
                drawn[values] = name
            style = styles[len(axes.lines) % len(styles)]
            axes.plot([s.step for s in steps], [s.loss for s in steps], style, marker="o" if duplicate else None,
                      markersize=3, label=name)
    if axes.lines:
        axes.legend(fontsize="small")
    return figure


def loss_against_tokens(results: pd.DataFrame, title: str = "Training loss against real tokens trained"):
    """NeMo's loss per step (``loss_by_step``) against the real tokens trained so far (step x tokens_per_step):
    runs that put different numbers of tokens into a step compare on one axis. One engine and card only."""
    done = results[results["state"] == COMPLETED]
    if "loss_by_step" in done and "tokens_per_step" in done:
        done = done[done["loss_by_step"].apply(lambda value: isinstance(value, dict) and bool(value))
                    & done["tokens_per_step"].notna()]
    else:
        done = done.iloc[0:0]
    same_series(*done.to_dict("records"))
    figure, axes = _figure(title, "real tokens trained (thousands)", "reduced_train_loss")
    for row in done.itertuples():
        losses = sorted((int(step), float(loss)) for step, loss in row.loss_by_step.items())
        axes.plot([(step + 1) * row.tokens_per_step / 1e3 for step, _ in losses], [loss for _, loss in losses],
                  label=str(row.id).split("/")[-1])
    if axes.lines:
        axes.legend(fontsize="small")
    return figure


# ---- diagrams: what each GPU keeps (the 16-bytes-per-parameter rule of mixed-precision Adam) -----------

STATE_BYTES = {"parameters": 2, "gradients": 2, "optimizer states": 12}  # per parameter, fp16/bf16 + fp32 Adam
_COLOURS = {"parameters": "#4c78a8", "gradients": "#f58518", "optimizer states": "#54a24b"}


def zero_layouts(gpus: int = 2) -> dict[str, dict[str, dict[str, float]]]:
    """Bytes per parameter each GPU (and the host) keeps per ZeRO stage, from the chapter's formula table."""
    n = gpus
    return {
        "ZeRO-0 (data parallel)": {"gpu": {"parameters": 2, "gradients": 2, "optimizer states": 12}},
        "ZeRO-1": {"gpu": {"parameters": 2, "gradients": 2, "optimizer states": 12 / n}},
        "ZeRO-2": {"gpu": {"parameters": 2, "gradients": 2 / n, "optimizer states": 12 / n}},
        "ZeRO-3": {"gpu": {"parameters": 2 / n, "gradients": 2 / n, "optimizer states": 12 / n}},
        "ZeRO-2 + optimizer offload": {"gpu": {"parameters": 2, "gradients": 2 / n},
                                       "host": {"optimizer states": 12 / n}},
        "ZeRO-3 + parameter offload": {"gpu": {}, "host": {"parameters": 2 / n, "gradients": 2 / n,
                                                           "optimizer states": 12 / n}},
    }


def fsdp_layouts(nodes: int = 2, gpus_per_node: int = 2) -> dict[str, dict[str, dict[str, float]]]:
    """Bytes per parameter each GPU keeps per FSDP strategy on nodes × GPUs (between the passes of a step)."""
    n, local = nodes * gpus_per_node, gpus_per_node
    return {
        "no sharding (DDP)": {"gpu": {"parameters": 2, "gradients": 2, "optimizer states": 12}},
        "SHARD_GRAD_OP (forward → backward)": {"gpu": {"parameters": 2, "gradients": 2 / n,
                                                       "optimizer states": 12 / n}},
        "HYBRID_SHARD": {"gpu": {"parameters": 2 / local, "gradients": 2 / local, "optimizer states": 12 / local}},
        "FULL_SHARD": {"gpu": {"parameters": 2 / n, "gradients": 2 / n, "optimizer states": 12 / n}},
        "FULL_SHARD + CPU offload": {"gpu": {}, "host": {"parameters": 2 / n, "gradients": 2 / n,
                                                         "optimizer states": 12 / n}},
    }


def memory_layout_diagram(layouts: dict[str, dict[str, dict[str, float]]], title: str):
    """One bar per layout: the model-state bytes per parameter a GPU keeps (solid) and what it leaves in
    host memory (hatched, to the left of zero). Activations are not drawn: no layout here divides them."""
    figure, axes = _figure(title, "bytes per parameter, per GPU (left of 0: in host memory)", "")
    names = list(layouts)
    for row, name in enumerate(names):
        for side, sign, hatch in (("gpu", 1, None), ("host", -1, "//")):
            start = 0.0
            for kind, value in layouts[name].get(side, {}).items():
                axes.barh(row, sign * value, left=sign * start, color=_COLOURS[kind], hatch=hatch,
                          edgecolor="white", label=kind if (side == "gpu" and row == 0) else None)
                start += value
    axes.axvline(0, color="black", linewidth=0.8)
    axes.set_yticks(range(len(names)), names)
    axes.invert_yaxis()
    axes.legend(loc="lower right", fontsize="small")
    axes.set_title(title, fontsize="medium", wrap=True)
    figure.set_size_inches(8, 0.5 * len(names) + 1.8)
    return figure


def mixtral_layouts(gpus: int = 4, experts: int = 8) -> dict[str, list[str]]:
    """What each of ``gpus`` GPUs holds of Mixtral under data (DP), tensor (TP) and expert (EP) parallelism."""
    def expert_range(group: int, groups: int) -> str:
        per = experts // groups
        return f"experts {group * per}–{group * per + per - 1}"

    half = gpus // 2
    return {
        f"DP {gpus}": [f"all {experts} experts\nwhole matrices\n1/{gpus} of the batch" for _ in range(gpus)],
        f"TP {gpus}": [f"all {experts} experts\n1/{gpus} of each matrix\nwhole batch" for _ in range(gpus)],
        # The EP ranks are carved out of the data-parallel ones: attention stays whole and takes its share
        # of the batch; tokens travel to their experts' GPUs and back (all-to-all).
        f"EP {gpus}": [f"{expert_range(g, gpus)}\nattention whole, tokens routed\n1/{gpus} of the batch"
                       for g in range(gpus)],
        # Megatron: DP for attention = GPUs / TP, so each TP pair takes its own share of the batch.
        f"TP 2 × EP {half}": [f"{expert_range(g // 2, half)}\n1/2 of each matrix (+ SP)\n1/{half} of the batch"
                              for g in range(gpus)],
    }


def gpu_layout_diagram(layouts: dict[str, list[str]], title: str):
    """One row per layout, one box per GPU with what that GPU holds (e.g. `mixtral_layouts`)."""
    import matplotlib.pyplot as plt

    names = list(layouts)
    columns = max(len(boxes) for boxes in layouts.values())
    figure, axes = plt.subplots(figsize=(2.3 * columns + 1.5, 1.3 * len(names) + 0.6), constrained_layout=True)
    axes.set_title(title)
    for row, name in enumerate(names):
        for column, text in enumerate(layouts[name]):
            axes.add_patch(plt.Rectangle((column + 0.05, -row - 0.9), 0.9, 0.8, facecolor="#e8f1fb",
                                         edgecolor="#2b6cb0"))
            axes.text(column + 0.5, -row - 0.5, f"GPU {column}\n{text}", ha="center", va="center", fontsize=7)
    axes.set_xlim(0, columns)
    axes.set_ylim(-len(names), 0)
    axes.set_yticks([-row - 0.5 for row in range(len(names))], names)
    axes.set_xticks([])
    for side in ("top", "right", "bottom"):
        axes.spines[side].set_visible(False)
    return figure
