"""`workshop memory` (memory summary of runs or logs) and `workshop collect` (a chapter's tables)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from workshop_lib.experiments import CHAPTERS

# Every `workshop` command imports this module, `workshop setup` on a login node's plain python3 (PyYAML, no
# pandas) included: the results package needs pandas, so it is imported where a results command runs.


def register(subparsers: argparse._SubParsersAction) -> None:
    memory = subparsers.add_parser(
        "memory",
        help="peak / average / mode memory per GPU and of the CPU process, from runs or log files",
        description="Summarize GPU memory (nvidia-smi CSV, one file per node) and CPU memory (psrecord) "
        "logs, in the form the seeds' analyze_memory.py printed, plus the average over busy samples.",
    )
    memory.add_argument("paths", nargs="+", metavar="PATH",
                        help="a run directory (runs/<experiment id>/) or memory log files")
    only = memory.add_mutually_exclusive_group()
    only.add_argument("--gpu-only", action="store_true", help="print the GPU part only")
    only.add_argument("--cpu-only", action="store_true", help="print the CPU part only")
    memory.add_argument("--busy-fraction", type=float, default=None, metavar="F",
                        help="a sample is busy at or above F × that device's peak (default 0.5, "
                        "workshop_lib.results.memory.DEFAULT_BUSY_FRACTION)")
    memory.add_argument("--json", action="store_true", help="print the summary as JSON")
    memory.set_defaults(handler=run_memory)
    _register_collect(subparsers)


def run_memory(args: argparse.Namespace) -> int:
    from workshop_lib.results.memory import DEFAULT_BUSY_FRACTION, format_memory_report, memory_summary

    busy_fraction = DEFAULT_BUSY_FRACTION if args.busy_fraction is None else args.busy_fraction
    report = memory_summary(args.paths, busy_fraction=busy_fraction)
    if args.json:
        data = asdict(report)
        if args.cpu_only:
            data["gpus"] = []
        if args.gpu_only:
            data["cpus"] = []
        print(json.dumps(data, indent=2))
    else:
        print(format_memory_report(report, show_gpu=not args.cpu_only, show_cpu=not args.gpu_only))
    return 0


def _register_collect(subparsers: argparse._SubParsersAction) -> None:
    # The tables (pandas) are imported by the command, not here: every `workshop` command would pay for them.
    collect = subparsers.add_parser(
        "collect",
        help="print a chapter's tables, filled from its run directories",
        description="Read every run of a chapter and print the seeds' tables with the scaling columns computed.",
    )
    collect.add_argument("--chapter", type=int, choices=tuple(CHAPTERS), help="one chapter (default: all)")
    collect.add_argument("--format", choices=("md", "csv", "json"), default="md", help="output format")
    collect.add_argument("--runs", default=None, metavar="DIR",
                         help="the folder holding run directories (default: $WORKSHOP_RUNS_DIR or <repository>/runs)")
    collect.set_defaults(handler=run_collect)


def run_collect(args: argparse.Namespace) -> int:
    from workshop_lib.book.tables import render_tables, tables_from_results
    from workshop_lib.core.errors import WorkshopError
    from workshop_lib.core.paths import existing_runs_root
    from workshop_lib.experiments import all_experiments, chapter_experiments
    from workshop_lib.results import chapter_results, unreadable_notes
    from workshop_lib.runs import load_run, run_directory

    chapters = [args.chapter] if args.chapter else list(CHAPTERS)
    runs_dir = existing_runs_root(args.runs)
    if args.runs and not any(run_directory(experiment, runs_dir).is_dir() for experiment in all_experiments()):
        raise WorkshopError(f"{args.runs} holds no run directories (runs/<experiment id>/): give the folder you "
                            "submitted into (`workshop submit --runs-dir`, $WORKSHOP_RUNS_DIR), not a run itself")
    for chapter in chapters:
        for experiment in chapter_experiments(chapter):
            damage = load_run(experiment, runs_dir).damage
            if damage:  # its row is read from the run's other files; say why its record was not used
                print(f"workshop collect: warning: {damage}", file=sys.stderr)
        results = chapter_results(chapter, runs_dir)
        for note in unreadable_notes(results):  # the rest of the file was read; these lines were left out
            print(f"workshop collect: note: {note}", file=sys.stderr)
        print(render_tables(tables_from_results(chapter, results), args.format))
    return 0
