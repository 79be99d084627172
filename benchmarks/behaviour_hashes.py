"""Hashes of what the restructuring (issue 26) must leave byte-identical.

    python benchmarks/behaviour_hashes.py --out before.json [--dump before/]
    ... restructure ...
    python benchmarks/behaviour_hashes.py --out after.json --dump after/
    python benchmarks/behaviour_hashes.py --compare before.json after.json     # exit 1 on any difference

Three kinds of items, each hashed on its own (sha256 of the exact text):
  script/<profile>/<experiment id>[@recipe]   render_script of every experiment x profile (both recipes
                                              of a Trainer experiment); import and JupyterLab scripts;
                                              a refusal is hashed as its exception class and message
  setup/<profile>                             `workshop setup --dry-run` text (describe) and every step program
  table/...                                   what the chapters show from book/reference/: the reference
                                              tables (HTML as the page gets it, per chapter and per part key
                                              the notebooks use), `workshop collect` md/csv/json of the same
                                              frames, engine scaling, recipe benchmark, NeMo tables, the
                                              generated sentences, time plans, the overview and script blocks
  findings/...                                checker messages: every experiment x profile, every lint sample
Names are looked up at their old and new homes (CANDIDATES), so one script serves before and after; a
name found nowhere is an item of its own ("MISSING"), never skipped silently. Absolute paths of the
checkout are written as <ROOT>, so two checkouts in different folders compare.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import importlib.util
import io
import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
for variable in [name for name in os.environ if name.startswith("WORKSHOP_")]:
    del os.environ[variable]  # the shared root, runs folder, poll limits... of whoever runs this
os.environ["WORKSHOP_ROOT"] = str(ROOT)
os.environ["WORKSHOP_WIDGETS"] = "0"

# name -> "module:attribute" at each home it has had (today's first). Add a home when a step moves a name.
CANDIDATES = {
    "all_experiments": ["workshop_lib.experiments:all_experiments"],
    "large_gpu_experiments": ["workshop_lib.experiments:large_gpu_experiments"],
    "engine_scaling_experiments": ["workshop_lib.experiments:engine_scaling_experiments"],
    "with_recipe": ["workshop_lib.experiments:with_recipe"],
    "available_profiles": ["workshop_lib.sites.profiles:available_profiles", "workshop_lib.sites.profiles:available_profiles"],
    "load_profile": ["workshop_lib.sites.profiles:load_profile", "workshop_lib.sites.profiles:load_profile"],
    "render_script": ["workshop_lib.scripts:render_script", "workshop_lib.scripts.render:render_script"],
    "render_import_script": ["workshop_lib.scripts:render_import_script",
                             "workshop_lib.scripts.render:render_import_script"],
    "render_lab_script": ["workshop_lib.scripts.lab:render_lab_script", "workshop_lib.scripts.lab:render_lab_script"],
    "build_plan": ["workshop_lib.sites.setup:build_plan", "workshop_lib.sites.setup_plan:build_plan"],
    "describe": ["workshop_lib.sites.setup:describe", "workshop_lib.sites.setup_run:describe"],
    "step_program": ["workshop_lib.sites.setup:step_program", "workshop_lib.sites.setup_run:step_program"],
    "validate_experiment": ["workshop_lib.validate:validate_experiment",
                            "workshop_lib.checks.experiment_rules:validate_experiment"],
    "lint_file": ["workshop_lib.validate:lint_file", "workshop_lib.checks.lint:lint_file"],
    "tables_from_results": ["workshop_lib.tables:tables_from_results", "workshop_lib.book.tables:tables_from_results"],
    "render_tables": ["workshop_lib.tables:render_tables", "workshop_lib.book.tables:render_tables"],
    "claims": ["workshop_lib.book.claims.sentences:", "workshop_lib.claims:", "workshop_lib.book.claims:"],
    "nemo_reference": ["workshop_lib.book.reference.nemo_views:", "workshop_lib.nemo_reference:",
                       "workshop_lib.book.nemo_reference:"],
}
CLAIMS = {3: ["zero_one_gpu", "zero_weak_scaling", "losses_differ", "zero_two_gpus", "model_states_versus_peak"],
          4: ["gpt_architecture", "fsdp_strategies", "fsdp_single_gpu", "fsdp_one_node", "gpt_depth"]}


# Where the chapter-facing functions may live (the facade first, then the modules it is split into).
CHAPTER_MODULES = ["workshop_lib.book.chapter.facade", "workshop_lib.book.reference.chapter_views",
                   "workshop_lib.book.chapter.your_runs",
                   "workshop_lib.notebook", "workshop_lib.book.chapter", "workshop_lib.book.reference",
                   "workshop_lib.book.your_runs", "workshop_lib.book.figures", "workshop_lib.book.claims.figures"]


class _ChapterApi:
    """`nb.<name>` wherever the name lives now (the first module of CHAPTER_MODULES that has it)."""

    def __getattr__(self, name: str):
        CANDIDATES.setdefault(f"nb.{name}", [f"{module}:{name}" for module in CHAPTER_MODULES])
        return find(f"nb.{name}")


def find(name: str):
    for candidate in CANDIDATES[name]:
        module_name, _, attribute = candidate.partition(":")
        try:
            spec = importlib.util.find_spec(module_name)
        except ModuleNotFoundError as error:
            if error.name and module_name.startswith(error.name):  # that home does not exist (yet, or any more)
                continue
            raise
        # A home that exists only in another checkout (an editable install's finder serves a module this one
        # no longer has) does not exist here: measuring it would prove nothing about this checkout.
        if spec is None or not Path(spec.origin or "").resolve().is_relative_to(ROOT):
            continue
        module = importlib.import_module(module_name)
        if not attribute:
            return module
        if hasattr(module, attribute):
            return getattr(module, attribute)
    raise LookupError(f"{name}: not at {CANDIDATES[name]}")


def normalised(text: str) -> str:
    return text.replace(str(ROOT), "<ROOT>")


def outcome(call) -> str:
    """What a call returns (str, DataFrame, list...) plus what it prints; an exception as class and message."""
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            value = call()
    except LookupError as error:
        return f"MISSING {error}"
    except Exception as error:  # a refusal is behaviour too
        return f"{printed.getvalue()}RAISED {type(error).__name__}: {error}"
    return printed.getvalue() + "\n=== returned ===\n" + shown(value)


def shown(value) -> str:
    if value is None or isinstance(value, (str, int, float, bool)):
        return repr(value) if not isinstance(value, str) else value
    if hasattr(value, "to_csv"):
        return value.to_csv(index=False)
    if isinstance(value, (list, tuple)):
        return "\n---\n".join(shown(item) for item in value)
    if hasattr(value, "frame") and hasattr(value, "title"):  # a Table
        return f"{value.title}\n{getattr(value, 'key', '')}\n{value.note}\n{shown(value.frame)}"
    if hasattr(value, "format"):  # a Finding
        return value.format()
    return repr(value)


def notebook_part_keys() -> dict[int, list[list[str]]]:
    """The key lists each chapter passes to show_results (the parts the notebooks show)."""
    keys = {}
    for path in sorted((ROOT / "notebooks").glob("0*.py")):
        chapter = int(path.name[:2])
        keys[chapter] = [re.findall(r'"([^"]+)"', found)
                         for found in re.findall(r"show_results\(selection, \[([^\]]*)\]", path.read_text())]
    return keys


def items() -> dict[str, str]:
    out: dict[str, str] = {}
    add = lambda key, call: out.__setitem__(key, normalised(outcome(call)))  # noqa: E731

    # ---- scripts --------------------------------------------------------------------------------
    experiments, seen = [], set()
    for source in ("all_experiments", "large_gpu_experiments", "engine_scaling_experiments"):
        for experiment in find(source)():
            if experiment.id not in seen:
                seen.add(experiment.id)
                experiments.append(experiment)
    profiles = find("available_profiles")()
    for name in profiles:
        profile = find("load_profile")(name)
        for experiment in experiments:
            variants = [experiment]
            if experiment.engine == "hf":
                variants += [find("with_recipe")(experiment, recipe)
                             for recipe in ("seed", "tuned") if recipe != experiment.recipe]
            for variant in variants:
                suffix = f"@{variant.recipe}" if variant is not experiment else ""
                add(f"script/{name}/{experiment.id}{suffix}", lambda v=variant: find("render_script")(v, profile))
                add(f"findings/{name}/{experiment.id}{suffix}",
                    lambda v=variant: [f.format() for f in find("validate_experiment")(v, profile)])
        for model in sorted(getattr(profile.nemo, "factories", {}) or {}):
            add(f"script/{name}/import/{model}", lambda m=model: find("render_import_script")(m, profile))
        add(f"script/{name}/lab", lambda: find("render_lab_script")(profile, Path("/checkout")))
        plan = lambda: find("build_plan")(profile, checkout=Path("/checkout"))  # noqa: E731
        add(f"setup/{name}/dry-run", lambda: find("describe")(plan(), plan().steps))
        add(f"setup/{name}/programs", lambda: [find("step_program")(p, step) for p in [plan()] for step in p.steps])

    for sample in sorted((ROOT / "tests" / "lint_samples").glob("*/*.sbatch")):
        add(f"findings/lint/{sample.parent.name}/{sample.name}",
            lambda s=sample: [f.format() for f in find("lint_file")(s)])

    # ---- what the chapters show from book/reference/ ---------------------------------------------
    nb = lambda: _ChapterApi()  # noqa: E731
    for chapter in (1, 2, 3, 4):
        add(f"table/reference/{chapter}/all", lambda c=chapter: nb().show_reference_tables(c))
        for keys in notebook_part_keys().get(chapter, []):
            add(f"table/reference/{chapter}/{'+'.join(keys)}", lambda c=chapter, k=keys: nb().show_reference_tables(c, k))

        def collect(c=chapter, fmt="md"):
            loaded = nb().reference_results(c)
            return find("render_tables")(find("tables_from_results")(c, loaded[1]), fmt) if loaded else None
        for fmt in ("md", "csv", "json"):
            add(f"table/collect/{chapter}/{fmt}", lambda c=chapter, f=fmt: collect(c, f))
        for site in ("ibex",):
            add(f"table/time-plan/{chapter}/{site}", lambda c=chapter, s=site: nb().show_time_plan(nb().select(c, "tiny"), s))
        add(f"table/overview/{chapter}", lambda c=chapter: nb().experiments_overview(nb().select(c, "tiny")))
        add(f"table/scripts-block/{chapter}", lambda c=chapter: nb().show_scripts(nb().select(c, "tiny")))
    add("table/engine-scaling", lambda: nb().show_engine_scaling())
    add("table/recipe-benchmark", lambda: nb().show_recipe_benchmark())
    for chapter in (1, 2):
        for function in ("reference_table", "measured_table", "resolved_table", "provenance_line", "nemo_run_line",
                         "stand_in_caveat"):
            add(f"table/nemo/{chapter}/{function}", lambda c=chapter, f=function: getattr(find("nemo_reference"), f)(c))
        add(f"table/nemo/{chapter}/memory_sentences", lambda c=chapter: find("nemo_reference").memory_sentences(
            find("nemo_reference").measured_table(c)))
    for chapter, names in CLAIMS.items():
        for name in names:
            add(f"table/claims/{chapter}/{name}",
                lambda c=chapter, n=name: getattr(find("claims"), n)(nb().reference_results(c)[1]))
    add("table/claims/engine_scaling",
        lambda: find("claims").engine_scaling(nb().reference_results("engine_scaling")[1]))
    return out


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write {item: sha256} as JSON here")
    parser.add_argument("--dump", type=Path, help="also write each item's text into this folder")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args(argv)
    if args.compare:
        before, after = (json.loads(path.read_text())["items"] for path in args.compare)
        changed = sorted(key for key in before.keys() & after.keys() if before[key] != after[key])
        gone, new = sorted(before.keys() - after.keys()), sorted(after.keys() - before.keys())
        for title, keys in (("changed", changed), ("only before", gone), ("only after", new)):
            for key in keys:
                print(f"{title}: {key}")
        print(f"{len(before)} items before, {len(after)} after: {len(changed)} changed, {len(gone)} gone, "
              f"{len(new)} new")
        return 1 if changed or gone or new else 0
    texts = items()
    hashes = {key: digest(text) for key, text in sorted(texts.items())}
    kinds = {}
    for key, value in hashes.items():
        kinds.setdefault(key.split("/")[0], []).append(value)
    summary = {kind: digest("".join(values)) for kind, values in sorted(kinds.items())}
    missing = sorted(key for key, text in texts.items() if text.startswith("MISSING"))
    raised = sum(text.lstrip().startswith("RAISED") or "\nRAISED " in text for text in texts.values())
    document = {"summary": summary, "counts": {k: len(v) for k, v in kinds.items()}, "missing": missing,
                "raised": raised, "items": hashes}
    if args.out:
        args.out.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    if args.dump:
        for key, text in texts.items():
            path = args.dump / (key.replace("/", "__") + ".txt")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    for kind, value in summary.items():
        print(f"{kind:9} {len(kinds[kind]):5} items  sha256 {value}")
    if missing:
        print(f"MISSING ({len(missing)}): {', '.join(missing[:5])}...", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
