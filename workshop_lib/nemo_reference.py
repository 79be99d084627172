"""Chapters 1-2 on real GPUs: NeMo's layout, the prediction and the measurement, one row per experiment.

Each row joins three sources, all stored in the repository: the command NeMo resolved
(``book/reference/nemo/resolved.json``: data-parallel sizes, micro-batches), the memory estimate
(``workshop_lib.estimate.fit``: NeMo/Megatron on the site's A100s, and the PyTorch stand-in that ran on
the reference GPUs), and the stand-in's run (``book/reference/chapter<N>.json``). Rows that were not run
say so ("not measured yet") instead of disappearing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from .estimate.fit import check_fit
from .experiments import chapter_experiments, large_gpu_experiments
from .paths import SOURCE_ROOT

REFERENCE_DIR = SOURCE_ROOT / "book" / "reference"
A100_GIB = 80.0  # the Ibex profile's GPUs (slurm/profiles/ibex.yml, gpu_memory_gib)
MIB = 1024


def chapter_rows(chapter: int):
    rows = chapter_experiments(chapter)
    return rows + (large_gpu_experiments() if chapter == 2 else [])


def measured_results(chapter: int, folder: Path = REFERENCE_DIR) -> tuple[list[dict], dict[str, dict]]:
    """(provenance records, result rows by experiment id) of book/reference/chapter<N>.json; empty if absent."""
    path = folder / f"chapter{chapter}.json"
    if not path.is_file():
        return [], {}
    data = json.loads(path.read_text())
    provenance = data["provenance"] if isinstance(data["provenance"], list) else [data["provenance"]]
    return provenance, {row["id"]: row for row in data["results"]}


def _resolved():
    from .nemo_check.check import load_resolved

    return load_resolved()


def reference_table(chapter: int, folder: Path = REFERENCE_DIR, reference_gpu_gib: float = 140.0) -> pd.DataFrame:
    """One row per chapter experiment: layout as NeMo resolved it, predictions, the stand-in's measurement."""
    resolved = _resolved()
    _, measured = measured_results(chapter, folder)
    rows = []
    for experiment in chapter_rows(chapter):
        layout = resolved[experiment.id]["layout"]
        nemo = check_fit(experiment, A100_GIB)
        stand_in = check_fit(experiment, reference_gpu_gib, stand_in=True)
        run = measured.get(experiment.id)
        if run and run.get("run_model") not in (None, experiment.model):
            run = None  # a tiny stand-in model: its memory says nothing about the real shape predicted here
        state = run["state"] if run else None
        completed = state == "COMPLETED"
        allocated = run.get("allocated_peak_mib") if completed else None
        rows.append({
            "experiment": experiment.id, "GPUs": experiment.gpus,
            "TP x PP x EP": f"{layout['tp']} x {layout['pp']} x {layout['ep']}" + (" + SP" if layout["sp"] else ""),
            "DP (attention)": layout["dp"], "DP (experts)": layout["expert_dp"] if layout["ep"] > 1 else None,
            "batch per DP rank": layout["global_batch"] // layout["dp"],
            "micro-batches per step": layout["micro_batches_per_step"],
            "NeMo on A100: predicted GiB/GPU": round(nemo.predicted_gib, 1),
            "fits 80 GB A100": "yes" if nemo.fits else "no",
            "stand-in: predicted GiB/GPU": round(stand_in.predicted_gib, 1),
            "stand-in: measured GiB/GPU": round(allocated / MIB, 1) if allocated else None,
            "nvidia-smi peak GiB/GPU": round(run["gpu_peak_max_mib"] / MIB, 1)
            if completed and run.get("gpu_peak_max_mib") else None,
            "last step s": round(run["train_step_time_s"], 2) if completed and run.get("train_step_time_s") else None,
            "state": state or f"not measured yet (needs {experiment.gpus} GPU{'s' if experiment.gpus > 1 else ''})",
        })
    return pd.DataFrame(rows)


def provenance_line(chapter: int, folder: Path = REFERENCE_DIR) -> str:
    provenance, measured = measured_results(chapter, folder)
    if not provenance:
        return f"No reference run of chapter {chapter} yet (book/reference/chapter{chapter}.json)."
    first = provenance[0]
    # One machine per session of the driver (2 and 4 GPUs of the same kind so far): name each size once.
    machines = sorted({(len(p.get("gpus") or []), (p.get("gpus") or ["unknown GPU"])[0]) for p in provenance})
    where = " and ".join(f"{count} x {gpu}" for count, gpu in machines)
    dates = sorted({p.get("date", "?")[:10] for p in provenance})
    return (f"Measured with the PyTorch stand-ins (not NeMo) on {where}, torch {first.get('torch')}, "
            f"transformers {first.get('transformers')}, peft {first.get('peft')}, on {', '.join(dates)}: "
            f"{sum(1 for row in measured.values() if row.get('state') == 'COMPLETED')} runs completed.")


def memory_sentences(table: pd.DataFrame) -> list[str]:
    """What the measured rows say about the prediction, generated from the table."""
    sentences = []
    for _, row in table.iterrows():
        measured, predicted = row["stand-in: measured GiB/GPU"], row["stand-in: predicted GiB/GPU"]
        if measured is None or pd.isna(measured):
            continue
        sentences.append(f"{row['experiment']} ({row['GPUs']} GPU{'s' if row['GPUs'] > 1 else ''}): "
                         f"{measured:.1f} GiB allocated at the peak per GPU, {predicted:.1f} GiB predicted "
                         f"({(measured - predicted) / predicted:+.0%}); NeMo on an A100 is predicted at "
                         f"{row['NeMo on A100: predicted GiB/GPU']:.1f} GiB"
                         + ("" if row["fits 80 GB A100"] == "yes" else ", which does not fit 80 GB") + ".")
    return sentences


def show(chapter: int) -> pd.DataFrame:
    """The table with its provenance and the generated sentences, for the chapter notebooks."""
    from IPython.display import HTML, Markdown, display

    table = reference_table(chapter)
    display(Markdown(provenance_line(chapter)))
    display(HTML(table.to_html(index=False, na_rep="—")))
    sentences = memory_sentences(table)
    if sentences:
        display(Markdown("\n".join(f"- {sentence}" for sentence in sentences)))
    return table


def resolved_table(chapter: int) -> pd.DataFrame:
    """What NeMo resolved for each experiment's command (accepted or why not, and the recipe's settings)."""
    resolved = _resolved()
    rows = []
    for experiment in chapter_rows(chapter):
        record = resolved[experiment.id]
        recipe, peft = record.get("resolved") or {}, (record.get("resolved") or {}).get("peft")
        refused = record.get("refused_by_workshop")
        verdict = "accepted" if record["accepted"] else "refused: " + "; ".join(record["errors"])
        if refused:
            verdict += " by NeMo; refused by `workshop validate` on Ibex (does not fit an 80 GB A100)"
        rows.append({"experiment": experiment.id, "factory": record["factory"], "NeMo's dry run": verdict,
                     "micro-batch x tokens": f"{record['layout']['micro_batch']} x {recipe.get('seq_length')}",
                     "learning rate": recipe.get("learning_rate"), "precision": recipe.get("precision"),
                     "distributed optimizer": recipe.get("distributed_optimizer"),
                     "LoRA": (f"rank {peft['dim']}, alpha {peft['alpha']} on {', '.join(peft['target_modules'])}"
                              if peft else "none (full fine-tune)")})
    return pd.DataFrame(rows)


def dry_run_text(experiment_id: str) -> str:
    """NeMo's own "Resolved Arguments" table for the experiment's command, as stored by `make nemo-check`."""
    record = _resolved()[experiment_id]
    return (REFERENCE_DIR / "nemo" / record["dryrun"]).read_text()


def show_resolved(chapter: int, example: str) -> pd.DataFrame:
    from IPython.display import HTML, Markdown, display

    table = resolved_table(chapter)
    display(HTML(table.to_html(index=False)))
    display(Markdown(f"NeMo's dry run of `{example}` (`nemo llm finetune ... --dryrun`):"))
    display(Markdown("```text\n" + dry_run_text(example) + "\n```"))
    return table
