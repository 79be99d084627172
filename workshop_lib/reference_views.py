"""Tables of the measurements made on real GPUs outside the chapters' own matrices: the recipe
benchmark (seed vs tuned, ``benchmarks/results/recipe/``) and the engine weak-scaling set
(``book/reference/engine_scaling.json``). Both are computed from the stored result files."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from .paths import SOURCE_ROOT

REPOSITORY = SOURCE_ROOT
RECIPE_RESULT = REPOSITORY / "benchmarks" / "results" / "recipe" / "h200.json"
RECIPE_LADDER = REPOSITORY / "benchmarks" / "results" / "recipe" / "h200-ladder.json"
ENGINE_SCALING = REPOSITORY / "book" / "reference" / "engine_scaling.json"
ENGINE_NAMES = {"ddp": "DDP", "zero2": "ZeRO-2", "full-shard": "FSDP FULL_SHARD"}


def recipe_table(path: Path = RECIPE_RESULT) -> pd.DataFrame:
    """One row per recipe of one benchmark run: speed, efficiency, memory and loss against the seed's."""
    document = json.loads(Path(path).read_text())
    rows = []
    for variant in document["variants"]:
        if "samples_per_s" not in variant:
            rows.append({"recipe": variant["recipe"], "samples/s": None})
            continue
        rows.append({
            "recipe": variant["recipe"], "precision": variant["precision"],
            "batch × accumulation": f"{variant['per_device_batch']} × {variant['grad_accum']}",
            "samples/s": variant["samples_per_s"], "× seed": variant.get("speedup_vs_seed"),
            "real tokens %": 100 * variant["real_token_fraction"],
            "MFU %": 100 * variant["mfu"] if variant.get("mfu") is not None else None,
            "peak GiB": variant["peak_memory_mib"] / 1024, "eval loss": variant["eval_loss"],
            "Δ eval loss %": variant.get("eval_loss_change_pct")})
    return pd.DataFrame(rows)


def recipe_provenance(path: Path = RECIPE_RESULT) -> str:
    document = json.loads(Path(path).read_text())
    prov, peak = document["provenance"], document.get("matmul_peak") or {}
    return (f"{prov.get('gpu')}, torch {prov.get('torch')}, transformers {prov.get('transformers')}, "
            f"{prov.get('date', '')[:10]}; bf16 matmul peak measured in the same run: "
            f"{peak.get('tflops', float('nan')):.0f} TFLOP/s")


def engine_scaling_table(path: Path = ENGINE_SCALING) -> pd.DataFrame:
    """Engine × GPUs: steady step time, samples/s, weak-scaling efficiency T1/TN, memory per GPU."""
    results = pd.DataFrame(json.loads(Path(path).read_text())["results"])
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
