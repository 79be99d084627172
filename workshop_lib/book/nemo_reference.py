"""Chapters 1-2 on real GPUs: NeMo's layout, the prediction and the measurements, one row per experiment.

Each row joins four sources, all stored in the repository: the command NeMo resolved
(``book/reference/nemo/resolved.json``: data-parallel sizes, micro-batches), the memory estimate
(``workshop_lib.estimate.fit``: NeMo/Megatron on the site's A100s, and the PyTorch stand-in that ran on
the reference GPUs), the stand-in's run and NeMo's own run where one exists (``book/reference/chapter<N>.json``,
told apart by ``run_engine``). Rows that were not run say so ("not measured yet") instead of disappearing.
Where NeMo and the stand-in ran the same experiment on the same card, their measured ratios are the caveat
every stand-in number carries.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from workshop_lib.book.cells import is_missing
from workshop_lib.book.html import scrollable
from workshop_lib.estimate.fit import check_fit
from workshop_lib.experiments import chapter_experiments, large_gpu_experiments
from workshop_lib.core.paths import REFERENCE_DIR

A100_GIB = 80.0  # the Ibex profile's GPUs (slurm/profiles/ibex.yml, gpu_memory_gib)
MIB = 1024


def chapter_rows(chapter: int):
    rows = chapter_experiments(chapter)
    return rows + (large_gpu_experiments() if chapter == 2 else [])


from workshop_lib.core.vocabulary import NEMO  # noqa: E402  (the engine names have one home each)
from workshop_lib.scripts import STAND_IN  # noqa: E402


def row_engine(row: dict) -> str:
    """What ran a stored row; rows written before the field existed were the stand-in's."""
    return row.get("run_engine") or STAND_IN


def measured_results(chapter: int, folder: Path = REFERENCE_DIR,
                     engine: str = STAND_IN) -> tuple[list[dict], dict[str, dict]]:
    """(provenance records, rows by experiment id that ``engine`` ran) of book/reference/chapter<N>.json."""
    path = folder / f"chapter{chapter}.json"
    if not path.is_file():
        return [], {}
    data = json.loads(path.read_text())
    provenance = data["provenance"] if isinstance(data["provenance"], list) else [data["provenance"]]
    return provenance, {row["id"]: row for row in data["results"] if row_engine(row) == engine}


def _completed(row: dict | None) -> bool:
    return bool(row) and row.get("state") == "COMPLETED"


def engine_comparisons(chapter: int, folder: Path = REFERENCE_DIR) -> list[dict]:
    """Experiments that NeMo and the stand-in both completed on the same card: the stand-in's mean step
    time and nvidia-smi peak as multiples of NeMo's (the same instruments on both sides)."""
    _, stand_ins = measured_results(chapter, folder, STAND_IN)
    _, nemos = measured_results(chapter, folder, NEMO)
    pairs = []
    for experiment_id, nemo in nemos.items():
        stand_in = stand_ins.get(experiment_id)
        if not (_completed(nemo) and _completed(stand_in)) or nemo.get("run_gpu") != stand_in.get("run_gpu"):
            continue
        step = (stand_in.get("mean_step_time_s"), nemo.get("mean_step_time_s"))
        peak = (stand_in.get("gpu_peak_max_mib"), nemo.get("gpu_peak_max_mib"))
        if None in step or None in peak:
            continue
        pairs.append({"experiment": experiment_id, "gpu": nemo["run_gpu"], "nemo_version": nemo.get("nemo_version"),
                      "nemo_step_s": step[1], "stand_in_step_s": step[0], "step_ratio": step[0] / step[1],
                      "nemo_peak_mib": peak[1], "stand_in_peak_mib": peak[0], "memory_ratio": peak[0] / peak[1]})
    return pairs


def stand_in_caveat(chapter: int, folder: Path = REFERENCE_DIR) -> str:
    """The sentence every stand-in number carries: the measured stand-in ÷ NeMo ratios, or that none exist."""
    pairs = engine_comparisons(1, folder) + (engine_comparisons(chapter, folder) if chapter != 1 else [])
    if not pairs:
        return ("No experiment has been run by both NeMo and the stand-in on the same card yet: read every stand-in "
                "number as the stand-in's alone, not as NeMo's.")
    parts = [f"{pair['experiment']} on one {pair['gpu']}: the stand-in took {pair['step_ratio']:.2f}× NeMo "
             f"{pair['nemo_version'] or ''}'s step time ({pair['stand_in_step_s']:.2f} s against "
             f"{pair['nemo_step_s']:.2f} s) and {pair['memory_ratio']:.2f}× its peak memory "
             f"({pair['stand_in_peak_mib'] / MIB:.1f} GiB against {pair['nemo_peak_mib'] / MIB:.1f} GiB, nvidia-smi)"
             for pair in pairs]
    return ("Stand-in numbers are not NeMo's. Measured side by side, " + "; ".join(parts) + ". The stand-in pads "
            "every sample to the recipe's 2,048 tokens, while NeMo's SQuAD batches are padded only to their longest "
            "record, so NeMo moves far fewer tokens per step; other stand-in rows carry the same caveat.")


def _resolved():
    from workshop_lib.core.reference import load_resolved

    return load_resolved()


def reference_table(chapter: int, folder: Path = REFERENCE_DIR, reference_gpu_gib: float = 140.0) -> pd.DataFrame:
    """One row per chapter experiment: layout as NeMo resolved it, predictions, the stand-in's measurement."""
    resolved = _resolved()
    _, measured = measured_results(chapter, folder)
    _, nemo_runs = measured_results(chapter, folder, NEMO)
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
            "mean step s": round(run["mean_step_time_s"], 2) if completed and run.get("mean_step_time_s") else None,
            "state": state or f"not measured yet (needs {experiment.gpus} GPU{'s' if experiment.gpus > 1 else ''})",
            **_nemo_columns(nemo_runs.get(experiment.id)),
        })
    return pd.DataFrame(rows)


def _nemo_columns(run: dict | None) -> dict:
    """NeMo's own run of the experiment, where one completed (nvidia-smi peak: NeMo records no allocator peak)."""
    done = _completed(run)
    return {"NeMo: nvidia-smi peak GiB/GPU": round(run["gpu_peak_max_mib"] / MIB, 1)
            if done and run.get("gpu_peak_max_mib") else None,
            "NeMo: mean step s": round(run["mean_step_time_s"], 2) if done and run.get("mean_step_time_s") else None,
            "NeMo ran on": f"{run.get('run_gpu')}, NeMo {run.get('nemo_version')}" if done else None}


def nemo_run_line(chapter: int, folder: Path = REFERENCE_DIR) -> str | None:
    """What NeMo itself ran for this chapter, and how the estimator's NeMo prediction compares with it."""
    _, nemo_runs = measured_results(chapter, folder, NEMO)
    done = [(experiment, nemo_runs[experiment.id]) for experiment in chapter_rows(chapter)
            if _completed(nemo_runs.get(experiment.id))]
    if not done:
        return None
    parts = []
    for experiment, run in done:
        predicted = check_fit(experiment, A100_GIB).predicted_gib
        measured = run["gpu_peak_max_mib"] / MIB
        parts.append(f"{experiment.id} was trained by NeMo {run.get('nemo_version')} itself on one {run.get('run_gpu')}: "
                     f"{run['mean_step_time_s']:.2f} s per step, {measured:.1f} GiB at the nvidia-smi peak, against "
                     f"{predicted:.1f} GiB predicted for NeMo ({(measured - predicted) / predicted:+.0%})")
    return ("; ".join(parts) + ". The prediction assumes every micro-batch is the recipe's full 2,048 tokens; NeMo's "
            "SQuAD records are ~170 tokens, so its activations and logits are a fraction of that (the model's bf16 "
            "weights alone are 15.0 GiB). It ran the chapter's own `nemo llm finetune` words with Megatron's local "
            "layers (no Transformer Engine on that machine: the Ibex container has it and runs faster) and random "
            "weights (benchmarks/NOTES.md, \"NeMo on the lent GPU\").")


def provenance_line(chapter: int, folder: Path = REFERENCE_DIR) -> str:
    provenance, measured = measured_results(chapter, folder)
    if not provenance:
        return f"No reference run of chapter {chapter} yet (book/reference/chapter{chapter}.json)."
    # The stand-ins' sessions only: a session that ran NeMo records its NeMo (and NeMo's own transformers).
    provenance = [p for p in provenance if p.get("nemo_toolkit") in (None, "unavailable")] or provenance
    first = provenance[0]
    # One machine per session of the driver (2 and 4 GPUs of the same kind so far): name each size once.
    machines = sorted({(len(p.get("gpus") or []), (p.get("gpus") or ["unknown GPU"])[0]) for p in provenance})
    where = " and ".join(f"{count} x {gpu}" for count, gpu in machines)
    dates = sorted({p.get("date", "?")[:10] for p in provenance})
    _, nemo_runs = measured_results(chapter, folder, NEMO)
    nemo_done = [row for row in nemo_runs.values() if _completed(row)]
    nemo_text = (f" NeMo itself (run_engine nemo): {len(nemo_done)} run{'s' if len(nemo_done) != 1 else ''} completed, "
                 f"NeMo {', '.join(sorted({str(row.get('nemo_version')) for row in nemo_done}))}." if nemo_done else
                 " NeMo itself has not trained any of them on a GPU here yet.")
    return (f"Measured with the PyTorch stand-ins (not NeMo; run_engine stand-in) on {where}, torch "
            f"{first.get('torch')}, transformers {first.get('transformers')}, peft {first.get('peft')}, on "
            f"{', '.join(dates)}: {sum(1 for row in measured.values() if row.get('state') == 'COMPLETED')} runs "
            f"completed." + nemo_text)


def memory_sentences(table: pd.DataFrame) -> list[str]:
    """What the measured rows say about the prediction, generated from the table."""
    sentences = []
    for _, row in table.iterrows():
        measured, predicted = row["stand-in: measured GiB/GPU"], row["stand-in: predicted GiB/GPU"]
        if is_missing(measured):
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
    display(Markdown(provenance_line(chapter) + " " + stand_in_caveat(chapter)))
    display(HTML(scrollable(table.to_html(index=False, na_rep="—"))))
    sentences = memory_sentences(table)
    nemo_line = nemo_run_line(chapter)
    if nemo_line:
        sentences = [nemo_line] + sentences
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
    display(HTML(scrollable(table.to_html(index=False))))
    display(Markdown(f"NeMo's dry run of `{example}` (`nemo llm finetune ... --dryrun`):"))
    display(Markdown("```text\n" + dry_run_text(example) + "\n```"))
    return table
