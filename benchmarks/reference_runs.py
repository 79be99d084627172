"""Reference results on real GPUs: the chapters' own job scripts, run through the local executor.

On a multi-GPU machine without SLURM (the device machine, a workstation):

    WORKSHOP_BACKEND=local python3 benchmarks/reference_runs.py --chapter 3 --runs RUNS --out book/reference
    WORKSHOP_BACKEND=local python3 benchmarks/reference_runs.py --chapter 1 --chapter 2 --max-gpus 2   # 2 GPUs
    WORKSHOP_BACKEND=local python3 benchmarks/reference_runs.py --chapter 1 --chapter 2 --max-gpus 4 --merge \
        --only lora/llama/4-gpus lora/mixtral/4-gpus model-parallel/llama/tp2-dp2 model-parallel/llama/tp4
                                                 # the 4-GPU rows, added to the 2-GPU ones (one 4-GPU host)

Chapters 1-2 run the PyTorch stand-ins at the real models' shapes (random weights, synthetic data) with
the recipe NeMo resolved for each experiment (book/reference/nemo/resolved.json); the chapters show each
row next to its memory prediction (workshop_lib/book/reference/nemo_views.py), and rows not run as "not measured yet".

renders every experiment of the chapter that fits the `gpu-workstation` profile (one node, up to 4 GPUs,
and no more GPUs than the machine has: --max-gpus, default the GPUs nvidia-smi lists),
submits the scripts — the local executor queues them until enough GPUs are free, so 1-GPU jobs run
side by side — waits, and writes the tidy results with provenance (GPU, driver, library versions,
date) to OUT/chapter<N>.json, which the chapters show next to their tables as "measured on real GPUs".
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def portable_command(argv: list[str]) -> str:
    """The command line without the machine's own folders (they mean nothing elsewhere)."""
    return " ".join(Path(arg).name if os.path.isabs(arg) else arg for arg in argv)


def provenance() -> dict:
    """What the numbers were measured on."""
    info = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "host_python": platform.python_version(), "command": portable_command(sys.argv)}
    try:
        query = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        info["gpus"] = [line.strip() for line in query.stdout.splitlines() if line.strip()]
    except (FileNotFoundError, subprocess.TimeoutExpired):
        info["gpus"] = []
    for package in ("torch", "transformers", "deepspeed", "accelerate", "peft", "datasets"):
        try:
            module = __import__(package)
            info[package] = getattr(module, "__version__", "?")
        except Exception as error:  # a missing package is part of the record, not a failure
            info[package] = f"unavailable ({type(error).__name__})"
    info["nemo_toolkit"] = nemo_version() or "unavailable"
    try:
        import torch

        info["cuda"] = torch.version.cuda
    except Exception:
        pass
    return info


def nemo_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("nemo_toolkit")
    except metadata.PackageNotFoundError:
        return None


def engine_fields(row: dict, engine: str, gpu: str, date: str | None = None) -> dict:
    """What ran the row, on which card and when: `run_engine` (nemo, stand-in, hf, gpt), `nemo_version` where
    NeMo ran, `run_gpu` (the card's name as nvidia-smi gives it), `run_date` (its provenance record's date)."""
    row["run_engine"] = engine
    row["nemo_version"] = nemo_version() if engine == "nemo" else None
    row["run_gpu"] = gpu
    row["run_date"] = date
    return row


def row_key(row: dict) -> tuple[str, str]:
    return row.get("id"), row.get("run_engine") or "stand-in"


def main(argv: list[str] | None = None) -> int:
    import pandas as pd

    from workshop_lib.experiments import (
        chapter_experiments,
        engine_scaling_experiments,
        large_gpu_experiments,
        nemo_lesson_experiments,
        with_recipe,
    )
    from workshop_lib.results import run_record
    from workshop_lib.runs import submit_experiments, wait_for_runs
    from workshop_lib.scripts import run_engine
    from workshop_lib.sites.profiles import load_profile

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chapter", type=int, action="append", default=[], help="3 and/or 4")
    parser.add_argument("--engine-scaling", action="store_true",
                        help="also the DDP / ZeRO-2 / FULL_SHARD weak-scaling set (scaling/*)")
    parser.add_argument("--runs", type=Path, default=ROOT / "runs-reference")
    parser.add_argument("--out", type=Path, default=ROOT / "book" / "reference")
    parser.add_argument("--profile", default="gpu-workstation")
    parser.add_argument("--only", nargs="*", default=None, help="experiment ids (default: all that fit)")
    parser.add_argument("--recipe", default="seed", help="run the selected experiments with this recipe "
                        "(seed: as the chapters do; tuned: the workshop's faster one, ids get -tuned)")
    parser.add_argument("--timeout", type=float, default=540.0, help="seconds to wait for the jobs")
    parser.add_argument("--max-gpus", type=int, default=None,
                        help="skip experiments that need more GPUs (default: the GPUs of this machine)")
    parser.add_argument("--merge", action="store_true",
                        help="keep the rows of OUT/chapter<N>.json that this call does not run (e.g. add the "
                             "4-GPU rows to the 2-GPU ones)")
    args = parser.parse_args(argv)
    if not args.chapter and not args.engine_scaling:
        parser.error("give --chapter N and/or --engine-scaling")

    os.environ.setdefault("WORKSHOP_BACKEND", "local")
    profile = load_profile(args.profile)
    sets = {f"chapter{chapter}": chapter_experiments(chapter) for chapter in args.chapter}
    if 2 in args.chapter:  # the layout that needs more than 80 GB per GPU: measured where it fits
        sets["chapter2"] += large_gpu_experiments()
    for chapter in args.chapter:  # NeMo's own lessons (packing, reduced depth): profiles with NeMo only
        sets[f"chapter{chapter}"] += [e for e in nemo_lesson_experiments() if e.chapter == chapter]
    max_gpus = args.max_gpus if args.max_gpus is not None else len(provenance()["gpus"]) or None
    if args.engine_scaling:
        sets["engine_scaling"] = engine_scaling_experiments()
    sets = {name: [with_recipe(e, args.recipe) for e in rows
                   if profile.supports(e) and (args.only is None or e.id in args.only)
                   and (max_gpus is None or e.gpus <= max_gpus)]
            for name, rows in sets.items()}
    if args.recipe != "seed":
        sets = {f"{name}_{args.recipe}": rows for name, rows in sets.items()}
    experiments = [e for rows in sets.values() for e in rows]
    # Biggest jobs first: the 1-GPU jobs then fill the gaps the multi-GPU ones leave.
    experiments.sort(key=lambda e: -e.gpus)
    print(f"{len(experiments)} experiments on profile {profile.name}: " + ", ".join(e.id for e in experiments))
    started = time.monotonic()
    runs = submit_experiments(experiments, profile, root=args.runs)
    infos = wait_for_runs(runs, timeout=args.timeout)
    print(f"all jobs ended after {time.monotonic() - started:.0f} s")
    for info in infos:
        print("  " + info.describe())

    args.out.mkdir(parents=True, exist_ok=True)
    record = provenance()
    for name, rows in sets.items():
        if not rows:  # nothing of this set ran now: its file stays as it is
            continue
        gpu = (record.get("gpus") or ["unknown GPU"])[0].split(",")[0].strip()
        measured = pd.DataFrame([engine_fields(run_record(e, args.runs), run_engine(e, profile), gpu, record["date"]) for e in rows])
        if "run_dir" in measured:  # relative to --runs: this machine's folders mean nothing elsewhere
            measured["run_dir"] = [os.path.relpath(path, args.runs) if isinstance(path, str) and os.path.isabs(path)
                                   else path for path in measured["run_dir"]]
        target = args.out / f"{name}.json"
        results = json.loads(measured.to_json(orient="records"))
        provenance_list = [record]
        if args.merge and target.exists():  # rows of experiments not run now stay, with their provenance
            earlier = json.loads(target.read_text())
            ran = {row_key(row) for row in results}  # the same experiment by another engine stays beside it
            results = [row for row in earlier["results"] if row_key(row) not in ran] + results
            previous = earlier["provenance"]
            provenance_list = (previous if isinstance(previous, list) else [previous]) + [record]
        target.write_text(json.dumps({"provenance": provenance_list if len(provenance_list) > 1 else record,
                                      "profile": profile.name, "results": results},
                                     indent=1, default=str) + "\n")
        print(f"wrote {target} ({len(measured)} runs)")
    return 0 if all(info.state == "COMPLETED" for info in infos) else 1


if __name__ == "__main__":
    sys.exit(main())
