"""The measurements on real GPUs a chapter shows first: book/reference/*.json read with its provenance caption
(GPUs, recipe, steps, weights, data, software, date), the chapter's tables filled from it one series (one engine
on one kind of card, `book.measurements.series`) at a time, and the engine-scaling and recipe-benchmark views."""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import pandas as pd

from workshop_lib.book.measurements.reference_files import read_reference
from workshop_lib.book.measurements.series import (
    Series,
    SeriesChoice,
    choose_series,
    record_profile,
    row_engine,
    same_series,
    series_provenance,
)
from workshop_lib.book.pages.cells import is_missing
from workshop_lib.book.pages.html import as_html, display, reference_missing, table_html
from workshop_lib.book.tables import Table, drop_unrecorded, tables_from_results
from workshop_lib.core.vocabulary import NEMO
from workshop_lib.results import COMPLETED
from workshop_lib.sites.profiles import load_profile
from workshop_lib.sites.step_cap import step_cap


def reference_results(chapter: int | str) -> tuple[dict, pd.DataFrame] | None:
    """A chapter's results measured on real GPUs (book/reference/chapter<N>.json, or book/reference/<name>.json)."""
    stored = read_reference(chapter)
    if stored is None:
        return None
    data = stored.document
    # Rows from before an engine recorded its step cap (the custom GPT's) ran under the reference profile's
    # max_steps: say so, or their tables would describe the full epochs they never trained.
    cap = load_profile(data["profile"]).training.max_steps if data.get("profile") else None
    for row in data["results"]:
        settings = row.get("run_settings")
        if cap and isinstance(settings, dict) and settings and settings.get("max_steps") is None:
            row["run_settings"] = {**settings, "max_steps": cap}
    return data, pd.DataFrame(data["results"])


def reference_series(chapter: int | str, loaded: tuple[dict, pd.DataFrame] | None = None
                     ) -> list[tuple[SeriesChoice, pd.DataFrame]]:
    """The chapter's reference rows as the book shows them: for each table family (an experiment group) the one
    series `choose_series` picks (NeMo where it ran; one card), families of the same series joined into one frame.
    The rows of the other series stay in book/reference; each choice lists them."""
    loaded = loaded if loaded is not None else reference_results(chapter)
    if loaded is None:
        return []
    data, results = loaded
    if results.empty:
        return []
    provenance = provenance_records(data)
    by_series: dict = {}
    for _, family in results.groupby("group", sort=False):
        choice = choose_series(family.to_dict("records"), provenance)
        chosen, left_out, reasons = by_series.setdefault(choice.series, ([], [], []))
        chosen += choice.rows
        left_out += choice.left_out
        reasons += [choice.reason] if choice.reason and choice.reason not in reasons else []
    order = sorted(by_series, key=lambda series: (series.engine != NEMO, str(series.engine), str(series.card)))
    return [(SeriesChoice(series, by_series[series][0], by_series[series][1], "; ".join(by_series[series][2])),
             pd.DataFrame(by_series[series][0])) for series in order]


def reference_shown(chapter: int | str) -> tuple[dict, pd.DataFrame] | None:
    """(data, the rows the chapter's tables and plots show): `reference_series`, joined."""
    loaded = reference_results(chapter)
    if loaded is None:
        return None
    frames = [frame for _, frame in reference_series(chapter, loaded)]
    return loaded[0], (pd.concat(frames, ignore_index=True) if frames else loaded[1].iloc[0:0])


def provenance_records(data: dict) -> list[dict]:
    return data["provenance"] if isinstance(data["provenance"], list) else [data["provenance"]]


def reference_caption(data: dict, results: pd.DataFrame, source: str, choice: SeriesChoice | None = None) -> str:
    """Where and how one series ran: GPUs, engine, recipe, steps, weights, data, software and date, each read from
    the provenance records of that series' sessions only (`series_provenance`), then why this series and what
    other series the file holds. ``results`` must be one series (`same_series` refuses two)."""
    records = results.to_dict("records")
    series = choice.series if choice else (same_series(*records) or Series(None, None))
    if choice and "group" in results:  # what this table left out, not what the chapter's other tables did
        groups = set(results["group"])
        choice = replace(choice, left_out=[row for row in choice.left_out if row.get("group") in groups])
    ids = {str(row.get("id")) for row in records}
    provenance = series_provenance(provenance_records(data), series, ids)
    # One machine per session of the reference driver; name each machine size once ("2 × H200 and 4 × H200").
    machines = sorted({(len(p.get("gpus") or ["?"]), (p.get("gpus") or ["unknown GPU"])[0].split(",")[0])
                       for p in provenance})
    where = " and ".join(f"{count} × {gpu}" for count, gpu in machines)
    profiles = sorted({record_profile(p) or data.get("profile") for p in provenance} - {None})
    profile = load_profile(profiles[0]) if profiles else None
    done = results[results["state"] == COMPLETED] if "state" in results else results
    recipes = sorted({_recipe_text(r) for r in done.to_dict("records")} - {""})
    steps = sorted({steps for steps in (_steps_run(row, profile) for row in done.to_dict("records")) if steps})
    weights = ("random-init weights (memory and speed are the real model's, the loss is not)"
               if profile is not None and profile.training.random_init else "trained weights")
    data_kind = f"{profile.training.data} data" if profile is not None else ""
    dates = sorted({p.get("date", "")[:10] for p in provenance if p.get("date")})
    steps_text = f"{' / '.join(map(str, steps))} optimizer steps" if steps else "full epochs"
    software = _software(provenance, done, series)
    nodes = _emulated_nodes(provenance, done)
    why = " ".join(part for part in ((f"Series: {choice.reason}." if choice and choice.reason else ""),
                                     choice.left_out_text(source) if choice else "") if part)
    return (f"Reference, measured on real GPUs: {where} (profile {', '.join(profiles) or 'not recorded'}){nodes}; "
            f"trained by {engine_text(done if not done.empty else results)}; "
            f"{'; '.join(recipes) or 'recipe as declared'}; {steps_text}; {weights}; {data_kind}; "
            f"{software or 'software versions not recorded'}; measured {', '.join(dates)}. "
            + (why + " " if why else "") + f"Source: {source}.")


def _emulated_nodes(provenance: list[dict], rows: pd.DataFrame) -> str:
    """How rows of several nodes ran where the reference machine was one: said in the caption, since their
    "nodes" talked over the machine's NVLink, not a network."""
    if not any(p.get("nodes") for p in provenance) or "nodes" not in rows:
        return ""
    several = rows[rows["nodes"].fillna(1) > 1]
    if several.empty:
        return ""
    first = several.iloc[0]
    return (f"; its {int(first['nodes'])}-node rows ran as {int(first['nodes'])} nodes × {int(first['gpus_per_node'])} "
            "GPUs inside that one machine, each group of GPUs one node (NCCL between them over NVLink, not a "
            "network)")


def _steps_run(row: dict, profile) -> int | None:
    """The optimizer steps a row trained: what the run recorded, else its experiment's steps capped by the
    profile its session ran under (NeMo records no settings; its job script's trainer.max_steps is that cap)."""
    settings = row.get("run_settings")
    if isinstance(settings, dict) and settings.get("max_steps") is not None:
        return int(settings["max_steps"])
    cap = profile.training.max_steps if profile is not None else None
    declared = row.get("max_steps")
    return step_cap(cap, None if is_missing(declared) else declared)


def _software(provenance: list[dict], rows: pd.DataFrame, series: Series) -> str:
    """The versions of the packages that series used, from its own sessions (NeMo's rows: NeMo's version and
    the torch and transformers NeMo ran with; the others: what their sessions had installed)."""
    first = provenance[0] if provenance else {}
    keys = [("torch", "torch"), ("transformers", "transformers")]
    if series.engine == NEMO:
        versions = sorted({str(v) for v in rows.get("nemo_version", pd.Series(dtype=object)).dropna()}) or (
            [first["nemo_toolkit"]] if _installed(first.get("nemo_toolkit")) else [])
        head = [f"NeMo {', '.join(versions)}"] if versions else []
    else:
        head = []
        stages = rows.get("zero_stage", pd.Series(dtype=object)).dropna()
        keys += ([("deepspeed", "DeepSpeed")] if not stages.empty else []) + (
            [("peft", "peft")] if series.engine == "stand-in" else [])
    return ", ".join(head + [f"{name} {first[key]}" for key, name in keys if _installed(first.get(key))])


def _installed(version) -> bool:
    """A version the reference machine had; not its "unavailable (ModuleNotFoundError)" of a package that run
    did not need (chapter 1's stand-in runs without DeepSpeed)."""
    return bool(version) and not str(version).startswith("unavailable")


def _recipe_text(record: dict) -> str:
    """"seed recipe (fp16, batch 4 × accumulation 4)" for a Trainer run; the global batch for a NeMo run."""
    def known(key):
        value = record.get(key)
        return None if is_missing(value) else value

    declared = known("precision") if known("precision") != "auto" else None  # "auto": the recipe's own choice
    precision = known("run_precision") or declared or "the recipe's precision"
    if record.get("engine") == "nemo" and known("global_batch"):  # NeMo's recipe with the workshop's overrides
        if not known("run_precision") and not declared:
            precision = _resolved_precision(record.get("id")) or precision
        return f"NeMo's recipe ({precision}, global batch {int(record['global_batch'])})"
    recipe = known("recipe") or "seed"
    if known("per_device_batch") and known("grad_accum"):
        return (f"{recipe} recipe ({precision}, batch {int(record['per_device_batch'])} × accumulation "
                f"{int(record['grad_accum'])})")
    if known("global_batch"):
        return f"{recipe} recipe ({precision}, global batch {int(record['global_batch'])})"
    return ""


def _resolved_precision(experiment_id) -> str | None:
    """The precision NeMo resolved for an experiment (book/reference/nemo/resolved.json), where stored."""
    from workshop_lib.core.reference import MissingResolvedRecipes, load_resolved

    try:
        record = load_resolved().get(str(experiment_id)) or {}
    except MissingResolvedRecipes:
        return None
    return (record.get("resolved") or {}).get("precision")


def show_reference_tables(chapter: int, keys: Sequence[str] | None = None,
                          missing: str = "needs more than the one 4-GPU machine the references ran on") -> list[Table]:
    """The chapter's tables (those of part ``keys``, or all) filled from the runs on real GPUs, one series (engine
    and card) per table with that series' provenance; a note saying so where the part has no reference."""
    loaded = reference_results(chapter)
    if loaded is None:
        reference_missing(f"No reference measurement for chapter {chapter} yet "
                          f"(book/reference/chapter{chapter}.json).")
        return []
    data = loaded[0]
    shown = []
    source = f"book/reference/chapter{chapter}.json"
    for choice, frame in reference_series(chapter, loaded):
        tables = [drop_unrecorded(table)
                  for table in tables_from_results(chapter, frame)
                  if keys is None or table.key in keys]
        tables = [table for table in tables if not table.frame.empty and len(table.frame.columns) > 1]
        if not tables:
            continue
        for table in tables:
            # Each table's caption reads its own rows' sessions, recipes and steps (all of them where the
            # table gathers several groups or none of its own, as the memory prediction does).
            rows = frame[frame["group"] == table.key] if "group" in frame else frame
            caption = reference_caption(data, rows if not rows.empty else frame, source, choice)
            titled = replace(table, title=f"{table.title} — on real GPUs, {series_title(choice.series)}")
            display(as_html(table_html(titled, kind="reference", caption=caption, profile=data.get("profile", ""))))
        shown += tables
    if not shown:
        reference_missing(f"No reference measurement for this part: it {missing}. Your runs below are the only "
                          "numbers for this part.")
    return shown


def series_title(series: Series) -> str:
    """"NeMo itself on H100" / "PyTorch stand-in (not NeMo) on H200" / "H200", for a table's title."""
    engine = {NEMO: "NeMo itself", "stand-in": "PyTorch stand-in (not NeMo)"}.get(series.engine, "")
    return " on ".join(part for part in (engine, series.card) if part)


def engine_text(results: pd.DataFrame) -> str:
    """"NeMo 2.4.1 itself" / "the PyTorch stand-in …, not NeMo" / the Trainer and GPT engines, for a caption."""
    engines = {row_engine(row) for row in results.to_dict("records")} - {None}
    if engines == {NEMO}:
        versions = sorted({str(v) for v in results.get("nemo_version", pd.Series(dtype=object)).dropna()})
        return f"NeMo {', '.join(versions) or '(version not recorded)'} itself"
    if engines == {"stand-in"}:
        return ("the PyTorch stand-in at the real model's shape, not NeMo (the chapter's 'Predict, then run' "
                "section puts it beside NeMo's own run)")
    names = {"hf": "the Hugging Face Trainer", "gpt": "the custom GPT's own training loop"}
    text = "; ".join(names.get(engine, engine) for engine in sorted(engines)) or "as declared by each experiment"
    return text + _fsdp_text(results)


def _fsdp_text(results: pd.DataFrame) -> str:
    """Which FSDP the rows ran: the Trainer's FULL_SHARD and SHARD_GRAD_OP are FSDP2 (Transformers 5's default),
    its HYBRID_SHARD FSDP1 (FSDP2 has none); the custom GPT wraps itself with FSDP1."""
    found = set()
    for row in results.to_dict("records"):
        strategy = row.get("fsdp")
        if is_missing(strategy) or not strategy:
            continue
        implementation = "FSDP1" if row_engine(row) == "gpt" or strategy == "HYBRID_SHARD" else "FSDP2"
        found.add((implementation, str(strategy)))
    if not found:
        return ""
    parts = [f"{name} ({', '.join(sorted(s for i, s in found if i == name))})"
             for name in ("FSDP2", "FSDP1") if any(i == name for i, _ in found)]
    return ", with PyTorch's " + " and ".join(parts)


def show_recipe_benchmark() -> list[Table]:
    """The seed recipe against the tuned one on one GPU (benchmarks/recipe_benchmark.py), steady and end to
    end, then the changes one at a time with why each pays; every figure from the stored result files."""
    from workshop_lib.book.reference import benchmark_views

    tables = benchmark_views.recipe_benchmark_tables()
    if not tables:
        reference_missing("No recipe benchmark result yet (benchmarks/results/recipe/).")
    shown = []
    for title, frame, note, sources in tables:
        table = Table(title, frame)
        first, *others = [path.relative_to(benchmark_views.REPOSITORY).as_posix() for path in sources]
        also = f" (also {', '.join(others)})" if others else ""
        caption = (f"Reference, measured on real GPUs: random-init BLOOM-560m shape, synthetic SQuAD. {note}{also} "
                   f"Source: {first}.")
        display(as_html(table_html(table, kind="reference", caption=caption, profile="recipe-benchmark")))
        shown.append(table)
    return shown


def show_engine_scaling() -> Table | None:
    """DDP vs ZeRO-2 vs FSDP FULL_SHARD weak scaling on real GPUs (book/reference/engine_scaling.json)."""
    from workshop_lib.book.reference import benchmark_views

    loaded = reference_results("engine_scaling")
    if loaded is None:
        reference_missing("No engine-scaling reference results yet (book/reference/engine_scaling.json).")
        return None
    data, results = loaded
    table = Table("Weak scaling of the data-parallel engines",
                  benchmark_views.engine_scaling_table(),
                  "Efficiency = T1/TN from the median step time (steps 4-30): each GPU does the same work, so "
                  "100 % means no time lost to communication or waiting. Blank model states: measured before "
                  "the engines recorded them.")
    caption = reference_caption(data, results, "book/reference/engine_scaling.json")
    display(as_html(table_html(table, kind="reference", caption=caption, profile=data.get("profile", ""))))
    return table
