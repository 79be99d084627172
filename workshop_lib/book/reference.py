"""The measurements on real GPUs a chapter shows first: book/reference/*.json read with its provenance caption
(GPUs, recipe, steps, weights, data, software, date), the chapter's tables filled from it one engine at a time,
and the engine-scaling and recipe-benchmark views."""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import pandas as pd

from workshop_lib.book.cells import is_missing
from workshop_lib.book.html import as_html, display, reference_missing, table_html
from workshop_lib.book.tables import Table, drop_unrecorded, tables_from_results
from workshop_lib.core.paths import REFERENCE_DIR
from workshop_lib.sites.profiles import load_profile
from workshop_lib.results import COMPLETED


def reference_results(chapter: int | str) -> tuple[dict, pd.DataFrame] | None:
    """A chapter's results measured on real GPUs (book/reference/chapter<N>.json, or book/reference/<name>.json)."""
    import json

    name = f"chapter{chapter}" if isinstance(chapter, int) else chapter
    path = REFERENCE_DIR / f"{name}.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    # Rows from before an engine recorded its step cap (the custom GPT's) ran under the reference profile's
    # max_steps: say so, or their tables would describe the full epochs they never trained.
    cap = load_profile(data["profile"]).training.max_steps if data.get("profile") else None
    for row in data["results"]:
        settings = row.get("run_settings")
        if cap and isinstance(settings, dict) and settings and settings.get("max_steps") is None:
            row["run_settings"] = {**settings, "max_steps": cap}
    return data, pd.DataFrame(data["results"])


def reference_caption(data: dict, results: pd.DataFrame, source: str, engine: str | None = None) -> str:
    """Where and how the reference ran: GPUs, recipe, steps, weights, data, software, date and file."""
    provenance = data["provenance"] if isinstance(data["provenance"], list) else [data["provenance"]]
    first = provenance[0]
    # One machine per session of the reference driver; name each machine size once ("2 × H200 and 4 × H200").
    machines = sorted({(len(p.get("gpus") or ["?"]), (p.get("gpus") or ["unknown GPU"])[0].split(",")[0])
                       for p in provenance})
    where = " and ".join(f"{count} × {gpu}" for count, gpu in machines)
    profile = load_profile(data["profile"]) if data.get("profile") else None
    done = results[results["state"] == COMPLETED]
    recipes = sorted({_recipe_text(r) for r in done.to_dict("records")} - {""})
    steps = sorted({int(s["max_steps"]) for s in done.get("run_settings", []) if isinstance(s, dict)
                    and s.get("max_steps") is not None})
    weights = ("random-init weights (memory and speed are the real model's, the loss is not)"
               if profile is not None and profile.training.random_init else "trained weights")
    data_kind = f"{profile.training.data} data" if profile is not None else ""
    dates = sorted({p.get("date", "")[:10] for p in provenance if p.get("date")})
    steps_text = f"{' / '.join(map(str, steps))} optimizer steps" if steps else "full epochs"
    if engine and engine.startswith("NeMo"):  # NeMo's steps are its job script's trainer.max_steps (the profile's cap)
        steps_text = "the optimizer steps of its job script's trainer.max_steps"
    software = ", ".join(f"{name} {first[key]}" for key, name in
                         (("torch", "torch"), ("transformers", "transformers"), ("deepspeed", "DeepSpeed"),
                          ("nemo", "NeMo")) if _installed(first.get(key)))
    return (f"Reference, measured on real GPUs: {where} (profile {data.get('profile')}); "
            + (f"trained by {engine}; " if engine else "") +
            f"{'; '.join(recipes) or 'recipe as declared'}; {steps_text}; {weights}; {data_kind}; "
            f"{software or 'software versions not recorded'}; measured {', '.join(dates)}. Source: {source}.")


def _installed(version) -> bool:
    """A version the reference machine had; not its "unavailable (ModuleNotFoundError)" of a package that run
    did not need (chapter 1's stand-in runs without DeepSpeed)."""
    return bool(version) and not str(version).startswith("unavailable")


def _recipe_text(record: dict) -> str:
    """"seed recipe (fp16, batch 4 × accumulation 4)" for a Trainer run; the global batch for a NeMo run."""
    def known(key):
        value = record.get(key)
        return None if is_missing(value) else value

    recipe, precision = known("recipe") or "seed", known("precision") or known("run_precision") or "precision as run"
    if known("per_device_batch") and known("grad_accum"):
        return (f"{recipe} recipe ({precision}, batch {int(record['per_device_batch'])} × accumulation "
                f"{int(record['grad_accum'])})")
    if known("global_batch"):
        return f"{recipe} recipe ({precision}, global batch {int(record['global_batch'])})"
    return ""


def show_reference_tables(chapter: int, keys: Sequence[str] | None = None,
                          missing: str = "needs more than the one 4-GPU machine the references ran on") -> list[Table]:
    """The chapter's tables (those of part ``keys``, or all) filled from the runs on real GPUs, each with
    its provenance; a note saying so where the part has no reference measurement."""
    loaded = reference_results(chapter)
    if loaded is None:
        reference_missing(f"No reference measurement for chapter {chapter} yet "
                          f"(book/reference/chapter{chapter}.json).")
        return []
    data, results = loaded
    shown = []
    # One set of tables per engine that ran (NeMo itself, the stand-in, the HF/GPT engines): a row is never
    # read as another engine's, and the same experiment by two engines does not collide in one table.
    for engine, engine_results in _by_engine(results):
        caption = reference_caption(data, engine_results, f"book/reference/chapter{chapter}.json",
                                    engine=engine_text(engine_results))
        tables = [drop_unrecorded(table)
                  for table in tables_from_results(chapter, engine_results)
                  if keys is None or table.key in keys]
        tables = [table for table in tables if not table.frame.empty and len(table.frame.columns) > 1]
        for table in tables:
            titled = replace(table, title=f"{table.title} — on real GPUs, {engine_title(engine)}")
            display(as_html(table_html(titled, kind="reference", caption=caption, profile=data.get("profile", ""))))
        shown += tables
    if not shown:
        reference_missing(f"No reference measurement for this part: it {missing}. Your runs below are the only "
                          "numbers here.")
    return shown


def _by_engine(results: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The reference rows split by `run_engine` (rows from before the field: the engine they declare)."""
    if results.empty:
        return []
    declared = results["engine"] if "engine" in results else pd.Series(["?"] * len(results), index=results.index)
    engines = results["run_engine"].fillna(declared) if "run_engine" in results else declared
    # Only NeMo and its stand-in must never share a table; the Trainer and GPT engines of chapters 3-4 do.
    engines = engines.where(engines.isin(["nemo", "stand-in"]), "engines")
    order = {"nemo": 0, "stand-in": 1}
    return [(engine, results[engines == engine].reset_index(drop=True))
            for engine in sorted(engines.unique(), key=lambda name: (order.get(name, 2), name))]


def engine_title(engine: str) -> str:
    return {"nemo": "NeMo itself", "stand-in": "PyTorch stand-in (not NeMo)"}.get(engine, "the chapter's engines")


def engine_text(results: pd.DataFrame) -> str:
    """"NeMo 2.4.1 on NVIDIA H100 …" / "the PyTorch stand-in (not NeMo)" / "hf", for a caption."""
    engines = set(results["run_engine"].dropna()) if "run_engine" in results else set()
    if engines == {"nemo"}:
        versions = sorted({str(v) for v in results.get("nemo_version", pd.Series(dtype=object)).dropna()})
        return f"NeMo {', '.join(versions) or '(version not recorded)'} itself (run_engine nemo)"
    if engines == {"stand-in"}:
        return ("the PyTorch stand-in at the real model's shape (run_engine stand-in), not NeMo: "
                "book/reference/nemo and the chapter's reference table give its measured ratio to NeMo")
    names = {"hf": "Hugging Face Trainer (DeepSpeed / FSDP as each row says)", "gpt": "the custom GPT's FSDP loop"}
    return "; ".join(names.get(engine, engine) for engine in sorted(engines)) or "as declared by each experiment"


def show_recipe_benchmark() -> list[Table]:
    """The seed recipe against the tuned one on one GPU (benchmarks/recipe_benchmark.py), steady and end to
    end, then the changes one at a time with why each pays; every figure from the stored result files."""
    from workshop_lib.book import reference_views

    tables = reference_views.recipe_benchmark_tables()
    if not tables:
        reference_missing("No recipe benchmark result yet (benchmarks/results/recipe/).")
    shown = []
    for title, frame, note, sources in tables:
        table = Table(title, frame)
        first, *others = [path.relative_to(reference_views.REPOSITORY).as_posix() for path in sources]
        also = f" (also {', '.join(others)})" if others else ""
        caption = (f"Reference, measured on real GPUs: random-init BLOOM-560m shape, synthetic SQuAD. {note}{also} "
                   f"Source: {first}.")
        display(as_html(table_html(table, kind="reference", caption=caption, profile="recipe-benchmark")))
        shown.append(table)
    return shown


def show_engine_scaling() -> Table | None:
    """DDP vs ZeRO-2 vs FSDP FULL_SHARD weak scaling on real GPUs (book/reference/engine_scaling.json)."""
    from workshop_lib.book import reference_views

    loaded = reference_results("engine_scaling")
    if loaded is None:
        reference_missing("No engine-scaling reference results yet (book/reference/engine_scaling.json).")
        return None
    data, results = loaded
    table = Table("Weak scaling of the data-parallel engines",
                  reference_views.engine_scaling_table(),
                  "Efficiency = T1/TN from the median step time (steps 4-30): each GPU does the same work, so "
                  "100 % means no time lost to communication or waiting. Blank model states: measured before "
                  "the engines recorded them.")
    caption = reference_caption(data, results, "book/reference/engine_scaling.json")
    display(as_html(table_html(table, kind="reference", caption=caption, profile=data.get("profile", ""))))
    return table
