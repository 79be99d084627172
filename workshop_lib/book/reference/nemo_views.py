"""Chapters 1-2 on real GPUs: NeMo's layout, the prediction and the measurements, one row per experiment.

Each row joins four sources, all stored in the repository: the command NeMo resolved
(``book/reference/nemo/resolved.json``: data-parallel sizes, micro-batches), the memory estimate
(``workshop_lib.estimate.fit``: NeMo/Megatron on the site's A100s, and the PyTorch stand-in that ran on
the reference GPUs), the stand-in's run and NeMo's own run where one exists (``book/reference/chapter<N>.json``,
told apart by ``run_engine``). Rows that were not run say so ("not measured yet") instead of disappearing.
Where NeMo and the stand-in ran the same experiment on the same card, the two are shown side by side as one
observation with its conditions; no number of one engine is ever divided by the other's.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from workshop_lib.book.measurements.reference_files import read_reference
from workshop_lib.book.measurements.series import Series, card_name, series_provenance
from workshop_lib.book.pages.cells import is_missing
from workshop_lib.book.pages.html import scrollable
from workshop_lib.book.tables.nemo import layout_text
from workshop_lib.core.paths import REFERENCE_DIR
from workshop_lib.estimate.fit import MARGIN, check_fit
from workshop_lib.experiments import chapter_experiments, large_gpu_experiments
from workshop_lib.jobs.states import COMPLETED

A100_GIB = 80.0  # the Ibex profile's GPUs (slurm/profiles/ibex.yml, gpu_memory_gib)
MIB = 1024
NEMO_RECORD_TOKENS = 170  # a SQuAD record as NeMo's data module pads it, measured (benchmarks/NOTES.md)


def chapter_rows(chapter: int):
    rows = chapter_experiments(chapter)
    return rows + (large_gpu_experiments() if chapter == 2 else [])


from workshop_lib.core.vocabulary import NEMO  # noqa: E402  (the engine names have one home each)
from workshop_lib.scripts import STAND_IN  # noqa: E402


def packs_sequences(experiment) -> bool:
    """Whether the experiment packs SQuAD records into sequences of the recipe's length (any packing knob set)."""
    return any(value for name, value in experiment.to_dict().items() if "pack" in name)


def row_engine(row: dict) -> str:
    """What ran a stored row; rows written before the field existed were the stand-in's."""
    return row.get("run_engine") or STAND_IN


def measured_results(chapter: int, folder: Path = REFERENCE_DIR,
                     engine: str = STAND_IN) -> tuple[list[dict], dict[str, dict]]:
    """(provenance records, rows by experiment id that ``engine`` ran) of book/reference/chapter<N>.json."""
    stored = read_reference(chapter, folder)
    if stored is None:
        return [], {}
    return stored.provenance, {row["id"]: row for row in stored.results if row_engine(row) == engine}


def _completed(row: dict | None) -> bool:
    return bool(row) and row.get("state") == COMPLETED


def engine_comparisons(chapter: int, folder: Path = REFERENCE_DIR) -> list[dict]:
    """Experiments that NeMo and the stand-in both completed on the same card: each engine's mean step time,
    nvidia-smi peak and GPU busy share, side by side (never divided: the two engines did different work)."""
    _, stand_ins = measured_results(chapter, folder, STAND_IN)
    _, nemos = measured_results(chapter, folder, NEMO)
    pairs = []
    for experiment_id, nemo in nemos.items():
        stand_in = stand_ins.get(experiment_id)
        if not (_completed(nemo) and _completed(stand_in)) or card_name(nemo.get("run_gpu")) != card_name(
                stand_in.get("run_gpu")):
            continue
        step = (stand_in.get("mean_step_time_s"), nemo.get("mean_step_time_s"))
        peak = (stand_in.get("gpu_peak_max_mib"), nemo.get("gpu_peak_max_mib"))
        if None in step or None in peak:
            continue
        pairs.append({"experiment": experiment_id, "gpu": nemo["run_gpu"], "gpus": int(nemo.get("gpus") or 1),
                      "nemo_version": nemo.get("nemo_version"),
                      "nemo_step_s": step[1], "stand_in_step_s": step[0],
                      "nemo_peak_mib": peak[1], "stand_in_peak_mib": peak[0],
                      "nemo_busy_pct": nemo.get("gpu0_util_busy_avg_pct"),
                      "stand_in_busy_pct": stand_in.get("gpu0_util_busy_avg_pct"),
                      "stand_in_seq_len": stand_in.get("run_seq_len"),
                      "nemo_trainable": nemo.get("trainable_params"), "stand_in_trainable": stand_in.get("trainable_params"),
                      "nemo_modules": (stand_in.get("run_settings") or {}).get("nemo_target_modules"),
                      "stand_in_modules": (stand_in.get("run_settings") or {}).get("target_modules")})
    return pairs


def _cards(count: int, gpu: str) -> str:
    return f"one {card_name(gpu)}" if count == 1 else f"{count} {card_name(gpu)} GPUs"


def _busy(value) -> str:
    return "" if is_missing(value) else f", GPU busy {value:.0f} %"


def stand_in_caveat(chapter: int, folder: Path = REFERENCE_DIR) -> str:
    """What the stand-in's numbers are: one side-by-side observation with NeMo on the same card and its
    conditions, never a factor to convert other stand-in numbers into NeMo's."""
    pairs = engine_comparisons(1, folder) + (engine_comparisons(chapter, folder) if chapter != 1 else [])
    if not pairs:
        return ("No experiment has been run by both NeMo and the stand-in on the same card yet: read every stand-in "
                "number as the stand-in's alone, not as NeMo's.")
    parts = [f"{pair['experiment']} on {_cards(pair['gpus'], pair['gpu'])}: NeMo {pair['nemo_version'] or ''} took "
             f"{pair['nemo_step_s']:.2f} s per step at {pair['nemo_peak_mib'] / MIB:.1f} GiB (nvidia-smi peak"
             f"{_busy(pair['nemo_busy_pct'])}), the stand-in {pair['stand_in_step_s']:.2f} s at "
             f"{pair['stand_in_peak_mib'] / MIB:.1f} GiB{_busy(pair['stand_in_busy_pct'])}" for pair in pairs]
    length = next((int(p["stand_in_seq_len"]) for p in pairs if not is_missing(p["stand_in_seq_len"])), 2048)
    observed = "One side-by-side observation: " if len(pairs) == 1 else "Side-by-side observations: "
    return ("Stand-in numbers are not NeMo's. " + observed + "; ".join(parts) + ". The two did "
            f"different work: the stand-in pads every sample to the recipe's {length:,} tokens, while NeMo's SQuAD "
            f"micro-batches are one record each, padded only to its length (~{NEMO_RECORD_TOKENS} tokens, benchmarks/NOTES.md), so "
            f"the stand-in moves about {length / NEMO_RECORD_TOKENS:.0f} times the tokens; NeMo ran without Transformer Engine and kept the GPU "
            "mostly idle, waiting on the CPU to launch its many small kernels. Under other conditions (another "
            "experiment, Transformer Engine, packed sequences) the two compare differently, so this pair is no "
            "factor to read other stand-in numbers by." + "".join(_adapter_sentence(pair) for pair in pairs[:1]))


def _adapter_sentence(pair: dict) -> str:
    """Why the two engines train different numbers of LoRA parameters at the same rank (NeMo's fused QKV)."""
    nemo, stand_in = pair["nemo_trainable"], pair["stand_in_trainable"]
    if is_missing(nemo) or is_missing(stand_in) or not nemo:
        return ""
    modules = (f" ({', '.join(pair['stand_in_modules'])} against NeMo's {', '.join(pair['nemo_modules'])})"
               if pair.get("nemo_modules") and pair.get("stand_in_modules") else "")
    return (f" At the same LoRA rank the stand-in trains {stand_in / 1e6:.1f} M parameters, NeMo {nemo / 1e6:.1f} M "
            f"(as its model summary prints it), {(stand_in - nemo) / 1e6:.1f} M more: it puts separate adapters, each with its own A matrix, "
            f"on the query, key and value projections (and on Llama's gate and up projections) where NeMo adapts one "
            f"fused projection of each{modules}.")


def _resolved():
    from workshop_lib.core.reference import load_resolved

    return load_resolved()


def reference_table(chapter: int, folder: Path = REFERENCE_DIR, reference_gpu_gib: float = 140.0) -> pd.DataFrame:
    """One row per chapter experiment: its layout as NeMo resolved it and the memory predicted for NeMo on an A100
    and for the stand-in (what was measured is `measured_table`)."""
    resolved = _resolved()
    rows = []
    for experiment in chapter_rows(chapter):
        layout = resolved[experiment.id]["layout"]
        nemo = check_fit(experiment, A100_GIB)
        stand_in = check_fit(experiment, reference_gpu_gib, stand_in=True)
        rows.append({
            "experiment": experiment.id, "GPUs": experiment.gpus,
            "layout": layout_text(layout["tp"], layout["pp"], layout["ep"], layout["dp"], bool(layout["sp"])),
            "DP (attention)": layout["dp"], "DP (experts)": layout["expert_dp"] if layout["ep"] > 1 else "—",
            "batch per DP rank": layout["global_batch"] // layout["dp"],
            "micro-batches per step": layout["micro_batches_per_step"],
            "NeMo on A100: predicted GiB/GPU": round(nemo.predicted_gib, 1),
            "fits 80 GB A100": "yes" if nemo.fits else "no",
            "stand-in: predicted GiB/GPU": round(stand_in.predicted_gib, 1),
        })
    return pd.DataFrame(rows)


def measured_table(chapter: int, folder: Path = REFERENCE_DIR, reference_gpu_gib: float = 140.0) -> pd.DataFrame:
    """One row per stored run of a chapter experiment, by engine and card, beside that engine's prediction; an
    experiment nothing ran says "not measured yet". Rows are never divided by one another here."""
    _, stand_ins = measured_results(chapter, folder, STAND_IN)
    _, nemos = measured_results(chapter, folder, NEMO)
    rows = []
    for experiment in chapter_rows(chapter):
        runs = [(NEMO, nemos.get(experiment.id)), (STAND_IN, stand_ins.get(experiment.id))]
        runs = [(engine, run) for engine, run in runs if run
                and (engine == NEMO or run.get("run_model") in (None, experiment.model))]  # a tiny model says nothing
        for engine, run in runs or [(None, None)]:
            done = _completed(run)
            predicted = (check_fit(experiment, A100_GIB) if engine == NEMO
                         else check_fit(experiment, reference_gpu_gib, stand_in=True)).predicted_gib
            allocated = run.get("allocated_peak_mib") if done else None
            rows.append({
                "experiment": experiment.id, "GPUs": experiment.gpus,
                "engine": (f"NeMo {run.get('nemo_version') or ''}".strip() if engine == NEMO else
                           "stand-in" if engine == STAND_IN else "—"),
                "card": card_name(run.get("run_gpu")) if run else "—",
                "predicted GiB/GPU": round(predicted, 1) if engine else "—",
                "allocated GiB/GPU": round(allocated / MIB, 1) if allocated else "—",
                "nvidia-smi peak GiB/GPU": round(run["gpu_peak_max_mib"] / MIB, 1)
                if done and run.get("gpu_peak_max_mib") else "—",
                "mean step s": round(run["mean_step_time_s"], 2) if done and run.get("mean_step_time_s") else "—",
                "state": run["state"] if run else
                f"not measured yet (needs {experiment.gpus} GPU{'s' if experiment.gpus > 1 else ''})"})
    return pd.DataFrame(rows)


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
        parts.append(f"{experiment.id} was trained by NeMo {run.get('nemo_version')} itself on "
                     f"{_cards(experiment.gpus, run.get('run_gpu'))}: {run['mean_step_time_s']:.2f} s per "
                     f"step, {measured:.1f} GiB at the nvidia-smi peak, against {predicted:.1f} GiB predicted for "
                     f"NeMo ({(measured - predicted) / predicted:+.0%})")
    unpacked = [experiment.id for experiment, _ in done if not packs_sequences(experiment)]
    lengths = ((f" The prediction assumes every micro-batch is the recipe's full 2,048 tokens; without packing "
                f"({', '.join(unpacked)}) NeMo's micro-batch is one SQuAD record of ~{NEMO_RECORD_TOKENS} tokens, so "
                "its activations and logits are a fraction of that: there the prediction is an upper bound at the "
                "recipe's maximum length, not an estimate of the run.") if unpacked else "")
    return ("; ".join(parts) + "." + lengths + " These runs used the chapter's own `nemo llm finetune` words "
            "with Megatron's local layers (no Transformer Engine on the measuring machine; the Ibex container has "
            "it, and NeMo's step time there has not been measured) and random weights (benchmarks/NOTES.md).")


def provenance_line(chapter: int, folder: Path = REFERENCE_DIR) -> str:
    """Who measured the chapter's rows, on which cards and when: each engine from its own sessions' records."""
    provenance, stand_ins = measured_results(chapter, folder)
    if not provenance:
        return f"No reference run of chapter {chapter} yet (book/reference/chapter{chapter}.json)."
    _, nemo_runs = measured_results(chapter, folder, NEMO)
    sentences = []
    for engine, runs in ((NEMO, nemo_runs), (STAND_IN, stand_ins)):
        done = [row for row in runs.values() if _completed(row)]
        if not done:
            continue
        cards = sorted({card_name(row.get("run_gpu")) or "an unrecorded card" for row in done})
        records = [record for card in cards
                   for record in series_provenance(provenance, Series(engine, card), {row["id"] for row in done})]
        first = records[0] if records else {}
        dates = sorted({str(p.get("date", ""))[:10] for p in records if p.get("date")})
        if engine == NEMO:
            what = (f"NeMo {', '.join(sorted({str(row.get('nemo_version')) for row in done}))} itself "
                    f"(transformers {first.get('transformers')})")
        else:
            what = (f"the PyTorch stand-in, not NeMo (torch {first.get('torch')}, transformers "
                    f"{first.get('transformers')}, peft {first.get('peft')})")
        sentences.append(f"{len(done)} run{'s' if len(done) != 1 else ''} by {what} on {' and '.join(cards)}, "
                         f"measured {', '.join(dates)}")
    if not sentences:
        return f"No run of chapter {chapter} has completed on a real GPU yet."
    return "Measured on real GPUs: " + "; ".join(sentences) + "."


def memory_sentences(table: pd.DataFrame) -> list[str]:
    """What the measured rows say about each engine's prediction, generated from `measured_table`."""
    sentences = []
    for _, row in table.iterrows():
        if row["engine"] == "stand-in" and row["allocated GiB/GPU"] != "—":
            measured, what = row["allocated GiB/GPU"], "allocated at the peak per GPU by the stand-in"
        elif str(row["engine"]).startswith("NeMo") and row["nvidia-smi peak GiB/GPU"] != "—":
            measured, what = row["nvidia-smi peak GiB/GPU"], "at NeMo's nvidia-smi peak per GPU"
        else:
            continue
        predicted = row["predicted GiB/GPU"]
        sentences.append(f"{row['experiment']} ({row['GPUs']} GPU{'s' if row['GPUs'] > 1 else ''}, {row['card']}): "
                         f"{measured:.1f} GiB {what}, {predicted:.1f} GiB predicted ({(measured - predicted) / predicted:+.0%}).")
    return sentences


def show(chapter: int) -> pd.DataFrame:
    """The layouts and predictions, then what each engine measured, with provenance and generated sentences."""
    from IPython.display import HTML, Markdown, display

    table = reference_table(chapter)
    display(HTML(scrollable(table.to_html(index=False, na_rep="—"))))
    measured = measured_table(chapter)
    display(Markdown(provenance_line(chapter) + " " + stand_in_caveat(chapter)))
    display(HTML(scrollable(measured.to_html(index=False, na_rep="—"))))
    sentences = memory_sentences(measured)
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
            verdict += (" by NeMo; refused by `workshop validate` on Ibex (at the recipe's maximum length its "
                        f"estimate exceeds an 80 GB A100 less the {MARGIN:.0%} margin)")
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
