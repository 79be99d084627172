"""Tables of the measurements made on real GPUs outside the chapters' own matrices: the recipe
benchmark (seed vs tuned, ``benchmarks/results/recipe/``) and the engine weak-scaling set
(``book/reference/engine_scaling.json``). Both are computed from the stored result files."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from workshop_lib.book.measurements.reference_files import read_reference_file, reference_path
from workshop_lib.core.gpu_cards import card_of
from workshop_lib.core.paths import SOURCE_ROOT
from workshop_lib.core.vocabulary import RECIPE_FEATURES

REPOSITORY = SOURCE_ROOT
RECIPE_RESULTS = REPOSITORY / "benchmarks" / "results" / "recipe"
# The run of record of issue 19: both workloads (chapter 3's baseline, the 1,600-sample run) and a second job,
# in one run; a workload is taken from the first file that has it. Older runs stay in the folder (NOTES.md).
RECIPE_END_TO_END = (RECIPE_RESULTS / "h100-end-to-end.json",)
RECIPE_RESULT = RECIPE_END_TO_END[0]
RECIPE_LADDER = RECIPE_RESULTS / "h100-ladder-graphs.json"  # one change at a time, chapter 3's baseline
ENGINE_SCALING = reference_path("engine_scaling")
ENGINE_NAMES = {"ddp": "DDP", "zero2": "ZeRO-2", "full-shard": "FSDP FULL_SHARD"}
# Why each change of the recipe pays, by the features it adds (the figures come from the result files).
RECIPE_REASONS = {
    frozenset({"bf16", "batch", "padding", "grouping", "fused-adamw", "gc-freeze"}):
        "one batch of 16 instead of 4 accumulated batches of 4 (larger matrix products, a quarter of the kernel "
        "launches); each batch padded to its longest sample and samples of similar length batched together, so "
        "most computed tokens are real; bf16 needs no loss scaler",
    frozenset({"chunked-ce"}):
        "Liger's fused linear cross-entropy: the batch × length × 250,880 logits never exist at once "
        "(memory, not speed)",
    frozenset({"sdpa"}):
        "BLOOM's attention (two batched matmuls, the ALiBi and mask additions, an fp32 softmax) as one fused "
        "kernel each way",
    frozenset({"gelu"}):
        "BLOOM's tanh-GELU, a dozen elementwise kernels each way, as PyTorch's one kernel: the step is bound by "
        "the CPU launching kernels, so fewer launches are faster",
    frozenset({"graphs"}):
        "the 24 blocks' forward and backward replayed as CUDA graphs, one per batch length (lengths padded to a "
        "multiple of 64 so a job sees a handful): the blocks' hundreds of kernel launches a step become two graph "
        "launches, and the GPU, no longer the CPU, sets the pace",
}


def _tuned_features() -> tuple[str, ...]:
    return RECIPE_FEATURES["tuned"]


def recipe_label(variant: dict) -> str:
    """A variant named by what it is today: ``seed``, ``tuned``, or ``tuned + x`` / ``tuned − x`` (a run
    may predate the current definition of ``tuned``; its features say what ran)."""
    if variant["recipe"].split("#")[0].startswith("seed"):  # seed, or seed+… naming its features itself
        return variant["recipe"]
    features, tuned = set(variant.get("features", [])), set(_tuned_features())
    repeat = "#" + variant["recipe"].split("#")[1] if "#" in variant["recipe"] else ""
    if features == tuned:
        return "tuned" + repeat
    added, removed = sorted(features - tuned), sorted(tuned - features)
    return "tuned" + "".join(f" + {f}" for f in added) + "".join(f" − {f}" for f in removed) + repeat


def _workloads(document: dict) -> list[dict]:
    """The workloads of a result file (files before issue 19 had one, without a name)."""
    if "workloads" in document:
        return document["workloads"]
    return [{"name": "long", "what": "1,600 samples x 1 epoch", "variants": document["variants"]}]


def recipe_table(path: Path = RECIPE_RESULT) -> pd.DataFrame:
    """One row per recipe (and workload) of one benchmark run: speed steady and end to end, efficiency,
    memory and loss against the seed's of the same workload."""
    document = json.loads(Path(path).read_text())
    rows = []
    for workload in _workloads(document):
        for variant in workload["variants"]:
            if "samples_per_s" not in variant:
                rows.append({"workload": workload["name"], "recipe": variant["recipe"], "samples/s": None})
                continue
            rows.append({
                "workload": workload["name"], "recipe": recipe_label(variant), "precision": variant["precision"],
                "batch × accumulation": f"{variant['per_device_batch']} × {variant['grad_accum']}",
                "samples/s": variant["samples_per_s"], "× seed": variant.get("speedup_vs_seed"),
                "end to end samples/s": variant["end_to_end_samples_per_s"],
                "end to end × seed": variant.get("end_to_end_speedup_vs_seed"),
                "real tokens %": 100 * variant["real_token_fraction"],
                "MFU % (datasheet peak)": mfu_figures(variant, document)[0],
                "% of measured matmul peak": mfu_figures(variant, document)[1],
                "peak GiB": variant["peak_memory_mib"] / 1024, "eval loss": variant["eval_loss"],
                "Δ eval loss %": variant.get("eval_loss_change_pct")})
    return pd.DataFrame(rows)


def _seed_and_tuned(paths) -> list[tuple[dict, dict, dict, Path]]:
    """(workload, seed, tuned, file) for each workload, from the first file that measured both."""
    found, seen = [], set()
    for path in paths:
        document = json.loads(Path(path).read_text())
        for workload in _workloads(document):
            variants = [v for v in workload["variants"] if "samples_per_s" in v]
            seed = next((v for v in variants if v["recipe"] == "seed"), None)
            tuned = next((v for v in variants if recipe_label(v) == "tuned"), None)
            if seed and tuned and workload["name"] not in seen:
                seen.add(workload["name"])
                found.append((workload, seed, tuned, Path(path)))
    return found


def _cache_state(variant: dict) -> str:
    """Whether a job found Triton's kernel cache filled by an earlier job (any job after a node's first)."""
    files = variant.get("kernel_cache_files_at_start")
    return "unknown" if files is None else "warm" if files else "cold"


def recipe_end_to_end_table(paths=RECIPE_END_TO_END) -> pd.DataFrame:
    """Seed and tuned side by side on each workload: steady and end-to-end samples/s and their ratios,
    MFU on real tokens, peak memory, eval loss; each row from one run (seed and tuned in the same run)."""
    rows = []
    for workload, seed, tuned, path in _seed_and_tuned(paths):
        document = json.loads(Path(path).read_text())
        (seed_mfu, seed_of), (tuned_mfu, tuned_of) = mfu_figures(seed, document), mfu_figures(tuned, document)
        rows.append({
            "workload": workload["what"],
            "seed steady samples/s": seed["samples_per_s"], "tuned steady samples/s": tuned["samples_per_s"],
            "steady × seed": tuned["samples_per_s"] / seed["samples_per_s"],
            "seed end to end samples/s": seed["end_to_end_samples_per_s"],
            "tuned end to end samples/s": tuned["end_to_end_samples_per_s"],
            "end to end × seed": tuned["end_to_end_samples_per_s"] / seed["end_to_end_samples_per_s"],
            "seed / tuned train s": f"{seed['train_runtime_s']:.1f} / {tuned['train_runtime_s']:.1f}",
            "seed / tuned MFU % (datasheet peak)": f"{_pct(seed_mfu)} / {_pct(tuned_mfu)}",
            "seed / tuned % of measured matmul peak": f"{_pct(seed_of)} / {_pct(tuned_of)}",
            "seed / tuned peak GiB": f"{seed['peak_memory_mib'] / 1024:.1f} / {tuned['peak_memory_mib'] / 1024:.1f}",
            "Δ eval loss %": 100 * (tuned["eval_loss"] - seed["eval_loss"]) / seed["eval_loss"],
            "tuned's kernel caches": _cache_state(tuned), "result file": path.name})
    return pd.DataFrame(rows)


def recipe_gains_table(path: Path = RECIPE_LADDER) -> pd.DataFrame:
    """The changes one at a time (one run, one workload): what each adds, its steady speed against the
    rung before, peak memory, and why it pays."""
    document = json.loads(Path(path).read_text())
    variants = [v for v in _workloads(document)[0]["variants"] if "samples_per_s" in v]
    rows, before = [], None
    for variant in variants:
        features = set(variant.get("features", []))
        added = features - set(before.get("features", [])) if before else set()
        rows.append({
            "recipe": recipe_label(variant), "adds": " + ".join(sorted(added)) if added else "—",
            "steady samples/s": variant["samples_per_s"],
            "× previous": variant["samples_per_s"] / before["samples_per_s"] if before else None,
            "real tokens %": 100 * variant["real_token_fraction"],
            "peak GiB": variant["peak_memory_mib"] / 1024,
            "why": RECIPE_REASONS.get(frozenset(added), "the seed's recipe" if not before else "")})
        before = variant
    return pd.DataFrame(rows)


def recipe_second_job(path: Path = RECIPE_END_TO_END[-1]) -> dict | None:
    """The same tuned job run twice on one node: what the kernel caches the first left save the second."""
    document = json.loads(Path(path).read_text())
    return document.get("second_job")


def second_job_sentence(second: dict) -> str:
    """What a second job on the same node gained, worded by whether the first found the caches empty."""
    recipe = recipe_label(second["second"]).split("#")[0]
    times = f"train time {second['first_train_runtime_s']:.1f} s, then {second['second_train_runtime_s']:.1f} s"
    if second.get("first_kernel_cache_files"):
        return (f"The same job ({recipe}) run again on the node: {times}. Both found Triton's kernel cache already "
                f"filled by earlier jobs of the run ({second['first_kernel_cache_files']} and "
                f"{second['second_kernel_cache_files']} files), and the recipe compiles nothing else, so the second "
                "job has nothing left to save.")
    return (f"The same job ({recipe}) run again on the node, the first with an empty kernel cache and the second "
            f"with what the first compiled: {times}.")


def recipe_headline(paths=RECIPE_END_TO_END) -> str:
    """One sentence per workload, every figure read from the result files."""
    sentences = []
    for workload, seed, tuned, path in _seed_and_tuned(paths):
        mfu, of_measured = mfu_figures(tuned, json.loads(Path(path).read_text()))
        sentences.append(
            f"On the {workload['name']} workload ({workload['what']}), the tuned recipe trained in {tuned['train_runtime_s']:.1f} s against the seed's "
            f"{seed['train_runtime_s']:.1f} s, {tuned['end_to_end_samples_per_s'] / seed['end_to_end_samples_per_s']:.1f}× "
            f"end to end and {tuned['samples_per_s'] / seed['samples_per_s']:.1f}× in its steady steps, at "
            f"{_pct(mfu, 0)} MFU against the datasheet peak ({_pct(of_measured, 0)} of the matmul rate measured in "
            f"the run), {tuned['peak_memory_mib'] / 1024:.1f} GiB peak, eval loss "
            f"{100 * (tuned['eval_loss'] - seed['eval_loss']) / seed['eval_loss']:+.1f} % ({path.name}; "
            f"kernel caches {_cache_state(tuned)} at its start"
            + (f"; {tuned['graph_captures']} CUDA graphs recorded in {tuned['graph_capture_s']:.2f} s in all"
               if tuned.get("graph_captures") else "") + ").")
    return " ".join(sentences)


def _pct(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f} %"


def recipe_benchmark_tables() -> list[tuple[str, pd.DataFrame, str, list[Path]]]:
    """What chapter 3's section on the tuned recipe shows, as (title, table, note, source files): seed and tuned side by
    side, steady and end to end, on each workload; then the changes one at a time with why each pays."""
    files = [path for path in RECIPE_END_TO_END if path.is_file()]
    tables = []
    if files:
        second = recipe_second_job(files[-1])
        note = recipe_headline(files) + " Measured on " + recipe_provenance(files[0]) + "."
        if second and second.get("second_train_runtime_s"):
            note += " " + second_job_sentence(second)
        tables.append(("The tuned recipe against the seed's, steady and end to end", recipe_end_to_end_table(files),
                       note, files))
    if RECIPE_LADDER.is_file():
        tables.append(("What each change adds, and why (one run, chapter 3's baseline workload)",
                       recipe_gains_table(), "Steady samples/s; measured on " + recipe_provenance(RECIPE_LADDER)
                       + ".", [RECIPE_LADDER]))
    return tables


def recipe_provenance(path: Path = RECIPE_RESULT) -> str:
    document = json.loads(Path(path).read_text())
    prov, peak = document["provenance"], document.get("matmul_peak") or {}
    card = card_of(prov.get("gpu"))
    datasheet = (f"; MFU is against the {card.name} datasheet's {card.dense_tflops:.0f} TFLOP/s (bf16, dense)"
                 if card else "")
    return (f"{prov.get('gpu')}, torch {prov.get('torch')}, transformers {prov.get('transformers')}, "
            f"{prov.get('date', '')[:10]}; bf16 matmul peak measured in the same run: "
            f"{peak.get('tflops', float('nan')):.0f} TFLOP/s" + datasheet)


def mfu_figures(variant: dict, document: dict) -> tuple[float | None, float | None]:
    """(MFU against the card's datasheet peak, fraction of the matmul peak measured in the run), both in %.

    The benchmark stores model FLOP/s divided by the matmul rate it measured that day (``variant["mfu"]``);
    MFU as PaLM defines it, and as everyone quotes it, divides by the datasheet peak (989 TFLOP/s bf16 dense on
    an H100 SXM), which a measured matmul never reaches, so the stored figure reads ~1.26× too high."""
    stored, measured = variant.get("mfu"), (document.get("matmul_peak") or {}).get("tflops")
    card = card_of((document.get("provenance") or {}).get("gpu"))
    if stored is None:
        return None, None
    of_measured = 100 * stored
    if not measured or card is None:
        return None, of_measured
    return 100 * stored * measured / card.dense_tflops, of_measured


def engine_scaling_table(path: Path = ENGINE_SCALING) -> pd.DataFrame:
    """Engine × GPUs: steady step time, samples/s, weak-scaling efficiency T1/TN, memory per GPU."""
    results = pd.DataFrame(read_reference_file(path).results)
    results["engine"] = results["id"].str.split("/").str[1].map(ENGINE_NAMES)
    rows = []
    for engine, group in results.groupby("engine", sort=False):
        group = group.sort_values("gpus")
        single = group[group["gpus"] == 1]["median_step_time_s"]
        one = float(single.iloc[0]) if len(single) else None
        for _, row in group.iterrows():
            rows.append({
                "engine": engine, "GPUs": int(row["gpus"]), "state": row["state"],
                "median step s": row["median_step_time_s"], "samples/s (steady)": row["steady_samples_per_s"],
                "weak-scaling efficiency %": 100 * one / row["median_step_time_s"] if one else None,
                "peak allocated MiB/GPU": row.get("allocated_peak_mib"),
                "model states MiB/GPU": row.get("rank0_model_state_mib")})
    return pd.DataFrame(rows)
