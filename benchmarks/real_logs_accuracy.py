"""How many of the values a careful person reads in ../shared/real-logs/ the parsers read right.

Each `.source.txt` beside a real log lists, under "Expected (read by hand)", the values a person
reads in it; CHECKS below restates them one by one (value and where it is in the parsers' output).
The script imports `workshop_lib` from wherever PYTHONPATH points, so the same checks measure any
checkout; an attribute or function a checkout lacks, or an exception, counts as a value read wrong.

    PYTHONPATH=. python benchmarks/real_logs_accuracy.py                 # this checkout
    PYTHONPATH=/path/to/other/checkout python benchmarks/real_logs_accuracy.py --json
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
from pathlib import Path

DEFAULT_LOGS = Path(__file__).resolve().parents[2] / "shared" / "real-logs"
GIB = 2**30


def _parse(module: str, function: str, text: str):
    return getattr(importlib.import_module(f"workshop_lib.results.parse.{module}"), function)(text)


def _nccl(text: str, name: str):
    """One collective: the all-reduce answer the results use, the others by name where the parser
    reports names."""
    module = importlib.import_module("workshop_lib.results.parse.nccl")
    if name == "all_reduce":
        return module.parse_nccl_allreduce(text)
    if hasattr(module, "parse_nccl"):
        return module.parse_nccl(text)[name]
    raise LookupError("this parser does not report collectives by name")


def _row_busbw(result, size: int) -> float:
    return next(row.out_of_place_busbw_gbps for row in result.rows if row.size_bytes == size)


def _sizes(result) -> list[int]:
    return sorted({row.size_bytes for row in result.rows})


def _last(items):
    return items[-1]


def _in_order(parsed: list[float], expected: list[float]) -> list[bool]:
    """For each expected value, whether the parser read it (in order, each reading used once)."""
    found, position = [], 0
    for value in expected:
        hit = next((index for index in range(position, len(parsed)) if _same(parsed[index], value)), None)
        found.append(hit is not None)
        position = hit + 1 if hit is not None else position
    return found


# (format, file, how the file is read) -> [(what a person reads, expected value, getter)]
NEMO_GMO = [
    ("4 step lines", 4, lambda log: len(log.steps)),
    ("global steps 0..3", [0, 1, 2, 3], lambda log: [step.global_step for step in log.steps]),
    ("last reduced_train_loss", 1.916, lambda log: log.last_step.reduced_train_loss),
    ("last consumed_samples", 256, lambda log: log.last_step.consumed_samples),
    ("last global_batch_size", 64, lambda log: log.last_step.global_batch_size),
    ("last lr", 7.843e-06, lambda log: log.last_step.lr),
    ("no step time printed", None, lambda log: log.last_step.train_step_timing_s),
]
NEMO_RESILIENCY = [
    ("20 global steps 0..19", list(range(20)), lambda log: [step.global_step for step in log.steps]),
    ("last epoch, iteration", (1, 0), lambda log: (log.last_step.epoch, log.last_step.iteration)),
    ("last reduced_train_loss", 11.03, lambda log: log.last_step.reduced_train_loss),
    ("last train_step_timing", 7.592, lambda log: log.last_step.train_step_timing_s),
    ("last consumed_samples", 10240, lambda log: log.last_step.consumed_samples),
    ("last global_batch_size", 512, lambda log: log.last_step.global_batch_size),
    ("trainable params", 54_700_000, lambda log: log.parameter_summaries[0].trainable_params),
    ("non-trainable params", 0, lambda log: log.parameter_summaries[0].non_trainable_params),
    ("total params", 54_700_000, lambda log: log.parameter_summaries[0].total_params),
    ("estimated size MB", 218.656, lambda log: log.parameter_summaries[0].estimated_size_mb),
]
HF_IPEX = [
    ("10 train records", 10, lambda log: len(log.train)),
    ("last loss", 2.5744, lambda log: log.train[-1].loss),
    ("last loss epoch", 0.15, lambda log: log.train[-1].epoch),
    ("no eval", 0, lambda log: len(log.evals)),
    ("train_runtime", 116.1914, lambda log: log.summary.train_runtime),
    ("train_samples_per_second", 6.885, lambda log: log.summary.train_samples_per_second),
    ("train_steps_per_second", 1.721, lambda log: log.summary.train_steps_per_second),
    ("train_loss", 2.819730052947998, lambda log: log.summary.train_loss),
    ("summary epoch", 0.15, lambda log: log.summary.epoch),
]
THAI_LOSSES = [1.863900146484375, 0.46619827270507813, 0.18838241577148437, 0.12642303466796875,
               0.1191162109375, 0.10812286376953124, 0.0573553466796875, 0.05275115966796875,
               0.05139984130859375, 0.0428802490234375, 0.037841796875]
THAI_EVALS = [0.10173556208610535, 0.08590535074472427, 0.08580297976732254]
HF_THAI = [
    *[(f"train loss #{index + 1}", True,
       lambda log, index=index: _in_order([entry.loss for entry in log.train], THAI_LOSSES)[index])
      for index in range(len(THAI_LOSSES))],
    ("last loss epoch", 5.031446540880503, lambda log: log.train[-1].epoch),
    *[(f"eval_loss #{index + 1}", True,
       lambda log, index=index: _in_order([entry.eval_loss for entry in log.evals], THAI_EVALS)[index])
      for index in range(len(THAI_EVALS))],
    ("final eval_loss", 0.08580297976732254, lambda log: log.evals[-1].eval_loss),
    ("final eval epoch", 4.716981132075472, lambda log: log.evals[-1].epoch),
    ("final eval_f1", 0.9010633379565418, lambda log: log.evals[-1].extra["eval_f1"]),
    ("no train_runtime summary", None, lambda log: log.summary),
]
HF_STATE = [
    ("global_step", 2800, lambda state: state.global_step),
    ("max_steps", 2808, lambda state: state.max_steps),
    ("num_train_epochs", 2, lambda state: state.num_train_epochs),
    ("epoch", 1.9949220489977728, lambda state: state.epoch),
    ("train_batch_size", 2, lambda state: state.train_batch_size),
    ("steps per epoch", 1404, lambda state: state.steps_per_epoch),
    ("186 loss records", 186, lambda state: len(state.log.train)),
    ("last loss", 1.025, lambda state: state.log.train[-1].loss),
    ("last loss step", 2790, lambda state: state.log.train[-1].step),
    ("14 eval records", 14, lambda state: len(state.log.evals)),
    ("last eval_loss", 1.1219322681427002, lambda state: state.log.evals[-1].eval_loss),
    ("last eval step", 2800, lambda state: state.log.evals[-1].step),
    ("eval_runtime", 311.3049, lambda state: state.log.evals[-1].eval_runtime),
    ("eval_samples_per_second", 13.434, lambda state: state.log.evals[-1].eval_samples_per_second),
    ("no summary", None, lambda state: state.log.summary),
]
NCCL_DGX2 = [
    ("all_reduce avg busbw", 42.5578, lambda text: _nccl(text, "all_reduce").avg_bus_bandwidth_gbps),
    ("all_reduce out of bounds", 0, lambda text: _nccl(text, "all_reduce").out_of_bounds),
    ("all_reduce 31 sizes", 31, lambda text: len(_sizes(_nccl(text, "all_reduce")))),
    ("all_reduce smallest size", 8, lambda text: _sizes(_nccl(text, "all_reduce"))[0]),
    ("all_reduce largest size", 8 * GIB, lambda text: _sizes(_nccl(text, "all_reduce"))[-1]),
    ("all_reduce peak busbw", 123.57, lambda text: _nccl(text, "all_reduce").peak_bus_bandwidth_gbps),
    ("all_reduce busbw at 1 GiB", 123.14, lambda text: _row_busbw(_nccl(text, "all_reduce"), GIB)),
    ("host", ["seville"], lambda text: _nccl(text, "all_reduce").hosts),
    ("all_gather avg busbw", 30.2993, lambda text: _nccl(text, "all_gather").avg_bus_bandwidth_gbps),
    ("all_gather out of bounds", 4, lambda text: _nccl(text, "all_gather").out_of_bounds),
    ("broadcast avg busbw", 41.2456, lambda text: _nccl(text, "broadcast").avg_bus_bandwidth_gbps),
    ("reduce avg busbw", 41.3386, lambda text: _nccl(text, "reduce").avg_bus_bandwidth_gbps),
    ("reduce_scatter avg busbw", 20.3609, lambda text: _nccl(text, "reduce_scatter").avg_bus_bandwidth_gbps),
]
NCCL_P5 = [
    ("32 sizes", 32, lambda text: len(_sizes(_nccl(text, "all_reduce")))),
    ("smallest size", 8, lambda text: _sizes(_nccl(text, "all_reduce"))[0]),
    ("largest size", 16 * GIB, lambda text: _sizes(_nccl(text, "all_reduce"))[-1]),
    ("out of bounds", 0, lambda text: _nccl(text, "all_reduce").out_of_bounds),
    ("avg busbw", 156.742, lambda text: _nccl(text, "all_reduce").avg_bus_bandwidth_gbps),
    ("peak busbw", 483.35, lambda text: _nccl(text, "all_reduce").peak_bus_bandwidth_gbps),
]
NVIDIA_SMI = [
    ("one GPU, index 0", [0], lambda log: log.gpu_indices),
    ("224 samples", 224, lambda log: len(log.used_mib(0))),
    ("memory.used peak", 890, lambda log: max(log.used_mib(0))),
    ("memory.used min", 557, lambda log: min(log.used_mib(0))),
    ("memory.used mean", 644.36, lambda log: round(sum(log.used_mib(0)) / len(log.used_mib(0)), 2)),
    ("memory.total", 8192, lambda log: log.samples[0].total_mib),
]
PSRECORD = [
    ("4 samples", 4, lambda log: len(log.samples)),
    ("Real peak MB", 5.0, lambda log: max(sample.real_mib for sample in log.samples)),
    ("Virtual MB", 399461.438, lambda log: log.samples[0].virtual_mib),
    ("CPU peak %", 96.3, lambda log: max(sample.cpu_percent for sample in log.samples)),
]

FILES = [
    ("nemo", "nemo/nemo2_gmo_multinode_sft_no_timing.log", lambda t: _parse("nemo", "parse_nemo_log", t), NEMO_GMO),
    ("nemo", "nemo/nemo2_resiliency_8gpu_run.log", lambda t: _parse("nemo", "parse_nemo_log", t), NEMO_RESILIENCY),
    ("hf", "hf/hf_ipex_trl_qlora.log", lambda t: _parse("hf", "parse_trainer_output", t), HF_IPEX),
    ("hf", "hf/hf_thai2transformers_ner_dataparallel.log", lambda t: _parse("hf", "parse_trainer_output", t),
     HF_THAI),
    ("hf_state", "hf_state/tinyllama_sft_trainer_state.json", lambda t: _parse("hf", "parse_trainer_state", t),
     HF_STATE),
    ("nccl", "nccl/nccl_dgx2_v100_five_collectives.txt", lambda t: t, NCCL_DGX2),
    ("nccl", "nccl/nccl_p5_2node_mpirun_tag_output.txt", lambda t: t, NCCL_P5),
    ("nvidia_smi", "nvidia_smi/gpu_memory_rtx2070_repeated_header.csv",
     lambda t: _parse("nvidia_smi", "parse_nvidia_smi", t), NVIDIA_SMI),
    ("psrecord", "psrecord/psrecord_head_macos.txt", lambda t: _parse("psrecord", "parse_psrecord", t), PSRECORD),
]


def _same(got, expected) -> bool:
    if isinstance(expected, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
        return math.isclose(got, expected, rel_tol=1e-6)
    if isinstance(expected, (list, tuple)) and isinstance(got, (list, tuple)):
        return len(got) == len(expected) and all(_same(a, b) for a, b in zip(got, expected))
    return got == expected


def measure(logs: Path) -> list[dict]:
    """One row per value: format, file, what, expected, what the parser read, right or not."""
    rows = []
    for format_name, relative, read, checks in FILES:
        path = logs / relative
        text = path.read_bytes().decode("utf-8", errors="replace")
        try:
            parsed, failure = read(text), None
        except Exception as error:  # noqa: BLE001 - a parser that raises reads nothing right
            parsed, failure = None, f"{type(error).__name__}: {error}"
        for label, expected, getter in checks:
            try:
                got = getter(parsed) if failure is None else failure
            except Exception as error:  # noqa: BLE001 - a missing attribute or entry: read wrong
                got = f"{type(error).__name__}: {error}"
            rows.append({"format": format_name, "file": relative, "value": label, "expected": repr(expected),
                         "read": repr(got), "right": failure is None and _same(got, expected)})
    return rows


def by_format(rows: list[dict]) -> dict[str, tuple[int, int]]:
    totals: dict[str, list[int]] = {}
    for row in rows:
        right_total = totals.setdefault(row["format"], [0, 0])
        right_total[0] += row["right"]
        right_total[1] += 1
    return {name: (right, total) for name, (right, total) in totals.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logs", type=Path, default=DEFAULT_LOGS, help="the real-logs folder")
    parser.add_argument("--json", action="store_true", help="print every value as JSON")
    parser.add_argument("--wrong", action="store_true", help="list the values read wrong")
    args = parser.parse_args(argv)
    if not args.logs.is_dir():
        parser.error(f"no real-logs folder at {args.logs}: pass --logs DIR")
    rows = measure(args.logs)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    totals = by_format(rows)
    for name, (right, total) in totals.items():
        print(f"{name:<11} {right:>3} / {total:<3} read right")
    right = sum(value[0] for value in totals.values())
    total = sum(value[1] for value in totals.values())
    print(f"{'all':<11} {right:>3} / {total:<3} ({100 * right / total:.0f} %)")
    if args.wrong:
        for row in rows:
            if not row["right"]:
                print(f"  {row['file']}: {row['value']}: expected {row['expected']}, read {row['read'][:100]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
