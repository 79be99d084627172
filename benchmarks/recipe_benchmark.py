"""The seed's training recipe against the workshop's tuned one, on one GPU, in one run.

Same model (BLOOM-560m shape, random weights), same data (synthetic SQuAD, 512-token prompts, or
``--data`` where real data is present), same samples in the same global batch, same learning-rate
schedule. Each variant is the real chapter 3/4 entry point (``torchrun -m workshop_lib.train.hf
--recipe ...``) in its own process, so its peak memory and compile state are its own.

Workloads (each runs every variant): ``baseline`` is what chapter 3's baseline job does (500 samples
× 3 epochs, evaluation on 100 held-out samples after each epoch); ``long`` is 1,600 samples × 1 epoch
(128 held out). ``--second-job RECIPE`` runs that variant of the first workload once more with the
kernel caches (Triton's, inductor's) that the first jobs left, as a second job on the same node would.

Measured per variant: samples/s and tokens/s (padded and real) over the steady steps (the first
``--warmup-steps`` excluded) and end to end (the Trainer's train_runtime: compile, evaluation and
everything else the participant waits for inside ``trainer.train()``); model TFLOP/s and MFU against a
bf16 matmul peak measured in the same run; peak memory; losses (last step, mean of the last 10 % of
steps, held-out eval loss on the same validation samples).

    # on one GPU (from the repo root):
    python3 benchmarks/recipe_benchmark.py --variants seed,tuned --second-job tuned --out benchmarks/results/recipe/h100-end-to-end.json
    # the ladder, one change at a time, on one workload:
    python3 benchmarks/recipe_benchmark.py --workloads long --out /tmp/ladder.json
    # CPU check of the whole path with a tiny model (minutes on 2 cores):
    python3 benchmarks/recipe_benchmark.py --tiny --variants seed,tuned --out /tmp/recipe_tiny.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

# One GPU, even on a box with several: HF Trainer under plain python would use DataParallel.
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "0")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

LADDER = ["seed", "seed+bf16", "seed+bf16+batch", "seed+bf16+batch+padding",
          "seed+bf16+batch+padding+grouping", "seed+bf16+batch+padding+grouping+chunked-ce",
          "seed+bf16+batch+padding+grouping+chunked-ce+fused-adamw",
          "seed+bf16+batch+padding+grouping+chunked-ce+fused-adamw+sdpa",
          "seed+bf16+batch+padding+grouping+chunked-ce+fused-adamw+sdpa+gelu",
          "seed+bf16+batch+padding+grouping+chunked-ce+fused-adamw+sdpa+gelu+gc-freeze", "tuned"]
SEED_RECIPE = ["--per-device-batch", "4", "--grad-accum", "4"]  # seeds 002/003, global batch 16
GLOBAL_BATCH = 16
# name -> (training samples, epochs, held-out samples); tiny: the CPU check's sizes
WORKLOADS = {"baseline": {"samples": 500, "epochs": 3, "eval_samples": 100,
                          "what": "chapter 3's baseline: 500 samples x 3 epochs, evaluation after each epoch"},
             "long": {"samples": 1600, "epochs": 1, "eval_samples": 128,
                      "what": "1,600 samples x 1 epoch, evaluation at the end"}}
TINY_WORKLOADS = {"baseline": {"samples": 48, "epochs": 3, "eval_samples": 16, "what": "tiny: 48 x 3"},
                  "long": {"samples": 64, "epochs": 1, "eval_samples": 16, "what": "tiny: 64 x 1"}}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--out", required=True, help="result JSON (e.g. benchmarks/results/recipe/h200.json)")
    parser.add_argument("--variants", default="ladder",
                        help="'ladder' (default), or comma-separated recipes, e.g. seed,tuned; a variant may "
                             "add entry-point flags after a space: 'tuned --learning-rate 1e-4'")
    parser.add_argument("--profile-steps", default=None, metavar="FIRST:LAST",
                        help="profile these optimizer steps of every variant (profile.txt in its run folder)")
    parser.add_argument("--workloads", default="baseline,long",
                        help=f"comma-separated, in order: {', '.join(WORKLOADS)} (default: both)")
    parser.add_argument("--second-job", default=None, metavar="RECIPE",
                        help="run this variant of the first workload again at the end, with the kernel caches "
                             "the earlier jobs left (as a second job on the same node)")
    parser.add_argument("--warmup-steps", type=int, default=None,
                        help="first optimizer steps left out of the steady rates (default: 10 %%, at least 2)")
    parser.add_argument("--data", default="synthetic", help="as --data of workshop_lib.train.hf")
    parser.add_argument("--model", default=None, help="registry name (default bloom-560m; tiny-bloom with --tiny)")
    parser.add_argument("--tiny", action="store_true", help="CPU check: tiny-bloom, fp32, a few steps")
    parser.add_argument("--work-dir", default=None, help="run folders and logs (default: next to --out)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per variant before it is stopped")
    parser.add_argument("--source-commit", default=None,
                        help="the commit a copied tree (not a git checkout) was taken from, for the provenance")
    parser.add_argument("--skip-peak", action="store_true", help="do not measure the matmul peak")
    args = parser.parse_args(argv)
    args.model = args.model or ("tiny-bloom" if args.tiny else "bloom-560m")
    known = TINY_WORKLOADS if args.tiny else WORKLOADS
    names = [name.strip() for name in args.workloads.split(",") if name.strip()]
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        parser.error(f"--workloads {args.workloads!r}: choose from {', '.join(known)}")
    args.workloads = {name: known[name] for name in names}
    args.variants = LADDER if args.variants == "ladder" else [v.strip() for v in args.variants.split(",") if v.strip()]
    return args


# ---------------------------------------------------------------- provenance and peak

def provenance(argv, source_commit: str | None = None) -> dict:
    import importlib.metadata as metadata

    import torch

    def version(name):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    record = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *argv]),
              "host": platform.node(), "python": platform.python_version(),
              "torch": torch.__version__, "cuda_runtime": torch.version.cuda,
              "transformers": version("transformers"), "deepspeed": version("deepspeed"),
              "accelerate": version("accelerate"), "gpu": None, "driver": None, "gpu_memory_mib": None,
              "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    if torch.cuda.is_available():
        record["gpu"] = torch.cuda.get_device_name(0)
        record["gpu_memory_mib"] = torch.cuda.get_device_properties(0).total_memory / 2**20
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", "-i", "0"],
                                 capture_output=True, text=True, timeout=30)
            record["driver"] = smi.stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            pass
    if source_commit:  # the caller knows which commit this tree is (a copy's own .git may lag behind it)
        record["git_commit"], record["git_note"] = source_commit, "as given by --source-commit"
        return record
    try:
        top = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                             timeout=10)
        if not top.stdout.strip() or Path(top.stdout.strip()).resolve() != REPO:
            # A copy of the tree inside another checkout (or none): its HEAD is not this code's.
            record["git_commit"], record["git_note"] = None, "a copied tree: give --source-commit"
            return record
        git = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        record["git_commit"] = git.stdout.strip() or None
        status = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10)
        # A run from a working tree with edits is not that commit: say which files differed.
        record["git_modified"] = [line[3:] for line in status.stdout.splitlines()]
    except (OSError, subprocess.SubprocessError):
        record["git_commit"] = None
    return record


def matmul_peak(tiny: bool) -> dict:
    """Best sustained rate of a square bf16 matmul (8192³ on a GPU), timed with CUDA events."""
    import torch

    if not torch.cuda.is_available():
        size, dtype = (256 if tiny else 2048), torch.float32
        a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
        a @ b
        started = time.perf_counter()
        for _ in range(5):
            a @ b
        seconds = (time.perf_counter() - started) / 5
        return {"device": "cpu", "dtype": "fp32", "size": size, "tflops": 2 * size**3 / seconds / 1e12}
    size = 8192
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    for _ in range(10):
        a @ b
    best = 0.0
    for _ in range(5):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            a @ b
        stop.record()
        stop.synchronize()
        seconds = start.elapsed_time(stop) / 1000 / 20
        best = max(best, 2 * size**3 / seconds / 1e12)
    del a, b
    torch.cuda.empty_cache()
    return {"device": "cuda", "dtype": "bf16", "size": size, "tflops": best}


def prepare_shared_data(data: str) -> None:
    """Generate the synthetic data and the local tokenizer once, outside every timed run."""
    import torch

    from workshop_lib.train.data import load_squad, local_tokenizer
    from workshop_lib.train.runtime import Runtime

    runtime = Runtime(0, 0, 1, 1, torch.device("cpu"))
    local_tokenizer(runtime)
    if data == "synthetic":
        load_squad(data, runtime)


def model_shape(model: str) -> dict:
    from workshop_lib.train.models import build_config, model_spec

    config = build_config(model_spec(model))
    return {"layers": config.num_hidden_layers, "hidden": config.hidden_size, "vocab": config.vocab_size}


# ---------------------------------------------------------------- one variant

def variant_command(args, variant: str, output_dir: Path, workload: dict) -> list[str]:
    recipe, *extra = shlex.split(variant)
    precision = "fp32" if args.tiny else "fp16"  # the seed's fp16; +bf16 switches on a GPU
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
            "-m", "workshop_lib.train.hf", "--output-dir", str(output_dir), "--model", args.model,
            "--random-init", "--data", args.data, "--precision", precision, *SEED_RECIPE,
            "--samples-per-gpu", str(workload["samples"]), "--epochs", str(workload["epochs"]),
            "--eval-samples", str(workload["eval_samples"]), "--generation-samples", "0", "--recipe", recipe, *extra]


def run_variant(args, recipe: str, folder: Path, workload: dict, caches: Path, label: str | None = None) -> dict:
    label = label or recipe
    folder.mkdir(parents=True, exist_ok=True)
    name = "".join(c if c.isalnum() or c in "-." else "_" for c in label)
    output_dir = folder / name
    command = variant_command(args, recipe, output_dir, workload)
    # Kernel caches in the run's own folder: the first job of a benchmark run starts cold (as on a fresh
    # node), later ones find what earlier ones compiled (as a second job on the same node does).
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
                   "TOKENIZERS_PARALLELISM": "false", "TRITON_CACHE_DIR": str(caches / "triton"),
                   "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor")}
    if args.profile_steps:
        environment["WORKSHOP_PROFILE_STEPS"] = args.profile_steps
    log = folder / f"{name}.log"
    cached = sum(1 for path in caches.rglob("*") if path.is_file()) if caches.is_dir() else 0
    print(f"--- {label} ({cached} files in the kernel caches)", flush=True)
    started = time.perf_counter()
    try:
        with log.open("w") as stream:
            completed = subprocess.run(command, cwd=REPO, env=environment, stdout=stream, stderr=subprocess.STDOUT,
                                       timeout=args.timeout)
        returncode = completed.returncode
    except subprocess.TimeoutExpired:
        returncode = "timeout"
    wall = time.perf_counter() - started
    record = {"recipe": label, "returncode": returncode, "process_wall_s": wall, "kernel_cache_files_at_start": cached, "log": str(log.relative_to(folder.parent)),
              "command": " ".join(shlex.quote(c) for c in command)}
    if returncode != 0:
        record["log_tail"] = log.read_text(errors="replace")[-3000:]
        print(f"    FAILED ({returncode}); log {log}\n{record['log_tail'][-1500:]}", flush=True)
        return record
    from workshop_lib.train.metrics import read_metrics

    records = read_metrics(output_dir / "metrics.jsonl")
    record["steps"] = [r for r in records if r["kind"] == "step"]
    record["summary"] = next(r for r in records if r["kind"] == "summary")
    record["throughput"] = json.loads((output_dir / "throughput.json").read_text())
    if (output_dir / "profile.txt").exists():
        record["profile"] = (output_dir / "profile.txt").read_text()
    return record


def measure(record: dict, shape: dict, peak_tflops: float | None, warmup: int | None, epochs: float) -> dict:
    """The figures of one finished variant."""
    steps, summary, tokens = record["steps"], record["summary"], record["throughput"]
    count = min(len(steps), len(tokens["rows"]))
    skip = warmup if warmup is not None else max(2, math.ceil(0.1 * count))
    skip = min(skip, count - 1)
    timed = range(skip, count)
    seconds = sum(steps[i]["step_time_s"] for i in timed)
    params, layers, hidden = summary["total_params"], shape["layers"], shape["hidden"]

    def total(key):
        return sum(tokens[key][i] for i in timed)

    # 6·N per token (forward + backward of every weight, the tied output layer included) plus the
    # attention scores and values, 12·L·h·s² per sequence of length s (causal half not discounted).
    useful_flops = 6 * params * total("real_tokens") + 12 * layers * hidden * total("real_length_squared")
    padded_flops = 6 * params * total("padded_tokens") + 12 * layers * hidden * total("padded_length_squared")
    tail = [s["loss"] for s in steps[-max(1, count // 10):]]
    trained = min(summary["samples_per_s"] * summary["train_runtime_s"], summary["samples"] * epochs)
    out = {
        "recipe": record["recipe"], "precision": summary["precision"],
        "features": tokens["recipe"].get("recipe_features", []) if record["recipe"] != "seed" else [],
        "skipped": tokens["recipe"].get("recipe_skipped", {}),
        "loss_kernel": tokens["recipe"].get("recipe_loss_kernel"),
        "per_device_batch": summary["settings"]["per_device_batch"], "grad_accum": summary["settings"]["grad_accum"],
        "optimizer_steps": count, "timed_steps": len(timed), "samples_seen": sum(tokens["rows"][:count]),
        "samples_per_s": total("rows") / seconds,
        "padded_tokens_per_s": total("padded_tokens") / seconds,
        "real_tokens_per_s": total("real_tokens") / seconds,
        "real_token_fraction": total("real_tokens") / total("padded_tokens"),
        "model_tflops": useful_flops / seconds / 1e12,
        "padded_tflops": padded_flops / seconds / 1e12,
        "mfu": useful_flops / seconds / 1e12 / peak_tflops if peak_tflops else None,
        # Samples really trained: the Trainer counts a last partial accumulation as a whole step of 16.
        "samples_trained": trained, "end_to_end_samples_per_s": trained / summary["train_runtime_s"],
        "train_runtime_s": summary["train_runtime_s"],
        "process_wall_s": record["process_wall_s"],
        "peak_memory_mib": max(summary["peak_memory_mib_per_rank"]), "peak_memory_kind": summary["peak_memory_kind"],
        "peak_reserved_mib": tokens.get("cuda_max_reserved_mib"),
        "final_loss": summary["final_loss"], "tail_mean_loss": sum(tail) / len(tail), "eval_loss": summary["eval_loss"],
        "loss_curve": [[sum(tokens["rows"][:i + 1]), steps[i]["loss"]] for i in range(count)],
        # Fixed costs end to end: the first step (CUDA and library set-up) and the untimed steps after it.
        "first_step_s": steps[0]["step_time_s"] if steps else None,
        "warmup_steps_s": sum(steps[i]["step_time_s"] for i in range(skip)),
        "median_step_s": sorted(steps[i]["step_time_s"] for i in timed)[len(timed) // 2],
        "pad_multiple": tokens["recipe"].get("recipe_pad_multiple"),
    }
    out.update({key: tokens[key] for key in ("graph_captures", "graph_capture_s", "graph_replays", "graph_eager_calls", "graph_shapes")
                if key in tokens})
    return out


# ---------------------------------------------------------------- report

def compare(results: list[dict]) -> dict:
    """Each variant against the seed of the same workload; the verdict on the tuned recipe (issue 19's goals)."""
    seed = next((r for r in results if r["recipe"] == "seed"), None)
    tuned = next((r for r in results if r["recipe"] == "tuned"), None)
    for r in results:
        if seed:
            r["speedup_vs_seed"] = r["samples_per_s"] / seed["samples_per_s"]
            r["end_to_end_speedup_vs_seed"] = r["end_to_end_samples_per_s"] / seed["end_to_end_samples_per_s"]
            if seed["eval_loss"] and r["eval_loss"] is not None:
                r["eval_loss_change_pct"] = 100 * (r["eval_loss"] - seed["eval_loss"]) / seed["eval_loss"]
            r["tail_loss_change_pct"] = 100 * (r["tail_mean_loss"] - seed["tail_mean_loss"]) / seed["tail_mean_loss"]
    if not (seed and tuned):
        return {}
    loss_change = tuned.get("eval_loss_change_pct")
    return {"speedup": tuned["speedup_vs_seed"], "end_to_end_speedup_vs_seed": tuned["end_to_end_speedup_vs_seed"],
            "eval_loss_change_pct": loss_change, "tail_loss_change_pct": tuned["tail_loss_change_pct"],
            "tuned_mfu": tuned["mfu"], "seed_mfu": seed["mfu"],
            "tuned_peak_memory_mib": tuned["peak_memory_mib"], "seed_peak_memory_mib": seed["peak_memory_mib"],
            "goal_end_to_end_5x": tuned["end_to_end_speedup_vs_seed"] >= 5.0,
            "goal_steady_8x": tuned["speedup_vs_seed"] >= 8.0,
            "goal_mfu_35pct": tuned["mfu"] >= 0.35 if tuned["mfu"] is not None else None,
            "goal_loss_within_2pct": abs(loss_change) <= 2.0 if loss_change is not None else None}


def table(results: list[dict], peak: dict | None) -> str:
    header = (f"{'recipe':<48} {'prec':>4} {'b×acc':>6} {'samp/s':>7} {'×seed':>6} {'e2e/s':>7} "
              f"{'realtok/s':>9} {'padtok/s':>9} {'real%':>5} {'TFLOP/s':>7} {'MFU':>6} {'peakGiB':>7} "
              f"{'loss':>7} {'tail':>7} {'eval':>7} {'Δeval%':>6}")
    lines = [header, "-" * len(header)]
    for r in results:
        if "samples_per_s" not in r:
            lines.append(f"{r['recipe']:<48} FAILED ({r.get('returncode')})")
            continue
        mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "-"
        lines.append(
            f"{r['recipe'][-48:]:<48} {r['precision']:>4} {r['per_device_batch']:>3}×{r['grad_accum']:<2} "
            f"{r['samples_per_s']:>7.1f} {r.get('speedup_vs_seed', float('nan')):>6.2f} "
            f"{r['end_to_end_samples_per_s']:>7.1f} {r['real_tokens_per_s']:>9.0f} {r['padded_tokens_per_s']:>9.0f} "
            f"{100 * r['real_token_fraction']:>5.1f} {r['model_tflops']:>7.1f} {mfu:>6} "
            f"{r['peak_memory_mib'] / 1024:>7.2f} {r['final_loss']:>7.3f} {r['tail_mean_loss']:>7.3f} "
            f"{(r['eval_loss'] or float('nan')):>7.3f} {r.get('eval_loss_change_pct', float('nan')):>6.2f}")
    if peak:
        lines.append(f"matmul peak: {peak['tflops']:.1f} TFLOP/s ({peak['dtype']} {peak['size']}³ on {peak['device']}); "
                     "MFU = model FLOPs of real tokens / time / that peak")
    return "\n".join(lines)


def run_workload(args, name: str, workload: dict, variants: list[str], folder: Path, caches: Path,
                 shape: dict, peak: dict | None, labels: list[str] | None = None) -> dict:
    """Every variant on one workload, in order; the figures of each and the verdict."""
    results = []
    for recipe, label in zip(variants, labels or variants):
        record = run_variant(args, recipe, folder / name, workload, caches, label)
        if record["returncode"] != 0:
            results.append({"recipe": label, "returncode": record["returncode"], "log_tail": record.get("log_tail")})
            continue
        result = measure(record, shape, peak["tflops"] if peak else None, args.warmup_steps, workload["epochs"])
        result["log"], result["kernel_cache_files_at_start"] = record["log"], record["kernel_cache_files_at_start"]
        results.append(result)
        print(f"    {result['samples_per_s']:.1f} samples/s steady, {result['end_to_end_samples_per_s']:.1f} end to end "
              f"({result['train_runtime_s']:.1f} s), eval loss {result['eval_loss']}, "
              f"peak {result['peak_memory_mib'] / 1024:.2f} GiB, process {record['process_wall_s']:.0f} s", flush=True)
        if "profile" in record:
            print("    profile: " + " | ".join(record["profile"].splitlines()[:2]), flush=True)
            result["profile"] = record["profile"]
    verdict = compare([r for r in results if "samples_per_s" in r])
    return {"name": name, "what": workload["what"], "samples": workload["samples"], "epochs": workload["epochs"],
            "eval_samples": workload["eval_samples"], "variants": results, "verdict": verdict}


def write_document(out: Path, args, prov: dict, peak: dict | None, shape: dict, workloads: list[dict],
                   second_job: dict | None) -> None:
    head = workloads[0]["verdict"] if workloads else {}
    document = {"benchmark": "recipe seed vs tuned, end to end", "provenance": prov, "matmul_peak": peak,
                "setup": {"model": args.model, "random_init": True, "data": args.data, "max_length": 512,
                          "global_batch": GLOBAL_BATCH, "learning_rate": 5e-5, "schedule": "linear to 0, no warmup",
                          "warmup_steps_excluded": args.warmup_steps, "shape": shape, "tiny": args.tiny,
                          "end_to_end": "the Trainer's train_runtime (compile and evaluation included)"},
                # The headline: the first workload (chapter 3's baseline by default), tuned against seed.
                "end_to_end_speedup_vs_seed": head.get("end_to_end_speedup_vs_seed"),
                "steady_speedup_vs_seed": head.get("speedup"),
                "workloads": workloads, "second_job": second_job}
    out.write_text(json.dumps(document, indent=1))


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    folder = Path(args.work_dir) if args.work_dir else out.parent / (out.stem + "-runs")
    folder.mkdir(parents=True, exist_ok=True)
    caches = folder / "caches"
    shutil.rmtree(caches, ignore_errors=True)  # the first job starts as on a fresh node
    import torch

    if not args.tiny and not torch.cuda.is_available():
        print("error: no GPU visible; use --tiny for the CPU check", file=sys.stderr)
        return 2
    prov = provenance(sys.argv if argv is None else ["benchmarks/recipe_benchmark.py", *argv], args.source_commit)
    peak = None if args.skip_peak else matmul_peak(args.tiny)
    if peak:
        print(f"matmul peak {peak['tflops']:.1f} TFLOP/s ({peak['dtype']}, {peak['size']}³)", flush=True)
    prepare_shared_data(args.data)
    shape = model_shape(args.model)
    workloads, second_job = [], None
    for name, workload in args.workloads.items():
        workloads.append(run_workload(args, name, workload, args.variants, folder, caches, shape, peak))
        write_document(out, args, prov, peak, shape, workloads, None)  # what has run so far, if stopped later
    if args.second_job:
        name, workload = next(iter(args.workloads.items()))
        repeat = run_workload(args, name, workload, [args.second_job], folder, caches, shape, peak,
                              labels=[f"{args.second_job}#2"])["variants"][0]
        first = next((r for r in workloads[0]["variants"] if r["recipe"] == args.second_job), None)
        second_job = {"workload": name, "recipe": args.second_job, "second": repeat,
                      "first_kernel_cache_files": first.get("kernel_cache_files_at_start") if first else None,
                      "second_kernel_cache_files": repeat.get("kernel_cache_files_at_start"),
                      "first_train_runtime_s": first.get("train_runtime_s") if first else None,
                      "second_train_runtime_s": repeat.get("train_runtime_s"),
                      "first_process_wall_s": first.get("process_wall_s") if first else None,
                      "second_process_wall_s": repeat.get("process_wall_s")}
    write_document(out, args, prov, peak, shape, workloads, second_job)
    for workload in workloads:
        print(f"\n== {workload['name']}: {workload['what']}")
        print(table(workload["variants"], peak))
        verdict = workload["verdict"]
        if verdict:
            print(f"tuned vs seed: {verdict['speedup']:.2f}× steady, {verdict['end_to_end_speedup_vs_seed']:.2f}× end to end, "
                  f"MFU {100 * (verdict['tuned_mfu'] or 0):.1f} %, eval loss {verdict['eval_loss_change_pct']:+.2f} %")
    if second_job:
        print(f"\nsecond job ({second_job['recipe']}, {second_job['workload']}): train_runtime "
              f"{second_job['first_train_runtime_s']} → {second_job['second_train_runtime_s']} s")
    print(f"result: {out}")
    failed = [r for w in workloads for r in w["variants"] if "samples_per_s" not in r]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
