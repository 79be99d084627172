"""The one ``metrics.jsonl`` writer every entry point uses (rank 0 writes).

The records and their fields are stated once in :mod:`workshop_lib.core.metrics_schema`, which the
results side (:mod:`workshop_lib.results.parse.metrics`) reads them through; every record written here is
checked against it first.
"""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path

from workshop_lib.core.metrics_schema import validate_record


def read_metrics(path: Path | str) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


# ---------------------------------------------------------------- memory

def peak_memory_mib(device_kind: str) -> tuple[float, str]:
    """This process's peak memory: CUDA allocations on a GPU, resident set size on a CPU."""
    if device_kind == "cuda":
        import torch

        from workshop_lib.train.tensor_census import cuda_peak_before_reset

        peak = max(torch.cuda.max_memory_allocated(), cuda_peak_before_reset())  # a probe resets the counter
        return peak / 2**20, "cuda_max_allocated"
    max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    divisor = 2**20 if sys.platform == "darwin" else 2**10  # bytes on macOS, KiB on Linux
    return max_rss / divisor, "cpu_max_rss"


# ---------------------------------------------------------------- the writer

def keep_earlier_attempt(path: Path) -> Path | None:
    """A job SLURM requeued (``SLURM_RESTART_COUNT`` > 0) starts its entry point again in the same folder:
    keep what the attempt before wrote as ``<name>.attempt<N><suffix>`` (N counted from 0) instead of
    overwriting it. Returns where it went, None when there was nothing to keep."""
    import os

    restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
    if not restarts.isdigit() or int(restarts) == 0 or not path.is_file() or path.stat().st_size == 0:
        return None
    kept = path.with_name(f"{path.stem}.attempt{int(restarts) - 1}{path.suffix}")
    path.replace(kept)
    return kept


class MetricsWriter:
    """Appends records to ``<output_dir>/metrics.jsonl``. On ranks other than 0 it does nothing."""

    def __init__(self, output_dir: Path | str, enabled: bool):
        self.path = Path(output_dir) / "metrics.jsonl"
        self.enabled = enabled
        self.step_times: list[float] = []
        self.last_loss: float | None = None
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            keep_earlier_attempt(self.path)
            self.path.write_text("")  # a rerun into the same folder starts a fresh file

    def _write(self, record: dict) -> None:
        validate_record(record)
        if self.enabled:
            with self.path.open("a", encoding="utf-8") as stream:
                stream.write(json.dumps(record) + "\n")

    def step(self, step: int, loss: float, lr: float, step_time_s: float, samples: int, epoch: float) -> None:
        """One optimizer step; ``samples`` is the global batch (all ranks, all accumulation steps)."""
        self.step_times.append(step_time_s)
        self.last_loss = float(loss)
        self._write({"kind": "step", "step": int(step), "loss": float(loss), "lr": float(lr),
                     "step_time_s": float(step_time_s),
                     "samples_per_s": samples / step_time_s if step_time_s > 0 else 0.0,
                     "epoch": float(epoch)})

    def evaluation(self, step: int, eval_loss: float, eval_em: float | None = None,
                   eval_f1: float | None = None) -> None:
        self._write({"kind": "eval", "step": int(step), "eval_loss": float(eval_loss),
                     "eval_em": None if eval_em is None else float(eval_em),
                     "eval_f1": None if eval_f1 is None else float(eval_f1)})

    def summary(self, **fields) -> dict:
        record = {"kind": "summary", **fields}
        self._write(record)
        return record


def summary_fields(*, runtime, engine: str, settings: dict, model: str, precision: str, samples: int,
                   train_runtime_s: float, final_loss: float, trainable_params: int, total_params: int,
                   local_params: int, step_times: list[float], samples_processed: int, eval_loss=None,
                   eval_em=None, eval_f1=None, model_state_bytes: int | None = None,
                   model_state_parts: dict | None = None, step_peak_bytes: int | None = None,
                   training_peak_bytes: int | None = None) -> dict:
    """Collect the summary. Collective: every rank must call it (it gathers per-rank values).

    ``samples`` is the size of the training subset, ``samples_processed`` how many samples the
    optimizer steps consumed in ``train_runtime_s`` (epochs × subset, or fewer with --max-steps).
    ``model_state_*``, ``step_peak_bytes`` and ``training_peak_bytes`` are this rank's :class:`~workshop_lib.train.tensor_census.MemoryProbe`
    outcome.
    """
    from workshop_lib.train.runtime import gather_from_ranks

    peak, kind = peak_memory_mib(runtime.device_kind)
    per_rank = gather_from_ranks((int(local_params), float(peak), model_state_bytes, model_state_parts,
                                  step_peak_bytes, training_peak_bytes))
    # The first step carries one-off costs (allocation, compilation, NCCL setup): leave it out
    # of the mean when there are others.
    timed = step_times[1:] if len(step_times) > 1 else step_times
    return {"engine": engine, "settings": settings, "model": model,
            "world_size": runtime.world_size, "nodes": runtime.nodes, "precision": precision,
            "device": runtime.device_kind, "samples": int(samples),
            "train_runtime_s": float(train_runtime_s),
            "samples_per_s": samples_processed / train_runtime_s if train_runtime_s > 0 else 0.0,
            "mean_step_time_s": float(sum(timed) / len(timed)) if timed else 0.0,
            "final_loss": float(final_loss),
            "eval_loss": None if eval_loss is None else float(eval_loss),
            "eval_em": None if eval_em is None else float(eval_em),
            "eval_f1": None if eval_f1 is None else float(eval_f1),
            "trainable_params": int(trainable_params), "total_params": int(total_params),
            "local_params_per_rank": [rank[0] for rank in per_rank],
            "peak_memory_mib_per_rank": [rank[1] for rank in per_rank], "peak_memory_kind": kind,
            "model_state_bytes_per_rank": [rank[2] for rank in per_rank],
            "model_state_parts_per_rank": [rank[3] for rank in per_rank],
            "step_peak_bytes_per_rank": [rank[4] for rank in per_rank],
            "training_peak_bytes_per_rank": [rank[5] for rank in per_rank]}
