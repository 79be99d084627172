"""The tables both Trainer chapters (3 and 4) show: one run's baseline summary, one metric per row (seed 002's
and seed 003's layouts), and the predicted against the measured memory per GPU."""

from __future__ import annotations

from typing import Callable

import pandas as pd

from workshop_lib.book.measurements.memory_predictions import PREDICTION_NOTE, prediction_frame
from workshop_lib.book.pages.cells import measured_cell
from workshop_lib.book.tables.columns import Table, capped_steps, cuda_allocated, field, utilization


def _epoch_loss(epoch: int) -> Callable[[dict], object]:
    def read(record: dict):
        value = (record.get("eval_loss_by_epoch") or {}).get(epoch)
        return None if value is None else round(value, 4)
    return read


def _steps_row(record: dict) -> tuple[str, str, Callable[[dict], object]]:
    """(metric, where from, reader) for the steps row: "Steps per Epoch" for a run of full epochs; a run
    capped by max_steps gets its cap, labelled as such (the Trainer then reports the cap, not an epoch)."""
    cap = capped_steps(record)
    if cap is not None:
        return "Optimizer Steps (max_steps cap, not an epoch)", "the profile's max_steps", lambda r: cap
    return "Steps per Epoch", "trainer_state.json: max_steps / num_train_epochs, rounded up", field("steps_per_epoch")


def baseline_summary(record: dict, fsdp: bool = False) -> pd.DataFrame:
    """Seed 002's baseline summary (Category, Metric, Extraction Instruction, Your Value), or with
    ``fsdp`` seed 003's (Metric, Log Location & Extraction, Your Value): one metric per row."""
    if fsdp:
        rows: list[tuple[str, str, str, Callable[[dict], object]]] = [
            ("", "Train Loss (Final)", "Trainer's train_loss", field("train_loss", digits=4)),
            ("", "Eval Loss (Epoch 1)", "eval_loss at epoch 1", _epoch_loss(1)),
            ("", "Eval Loss (Epoch 2)", "eval_loss at epoch 2", _epoch_loss(2)),
            ("", "Eval Loss (Epoch 3)", "eval_loss at epoch 3", _epoch_loss(3)),
            ("", "Training Speed (samples/sec)", "train_samples_per_second", field("train_samples_per_s", digits=3)),
            ("", "Evaluation Speed (samples/sec)", "eval_samples_per_second", field("eval_samples_per_s", digits=3)),
            ("", *_steps_row(record)),
            ("", "Memory Allocated (MB)", "torch.cuda.max_memory_allocated over the training steps, max over ranks (metrics.jsonl)",
             lambda r: None if cuda_allocated(r) is None else round(cuda_allocated(r) * 2**20 / 1e6, 1)),
            ("", "Exact Match (%)", "generated answers vs SQuAD's (eval_em)", field("eval_em", scale=100, digits=1)),
            ("", "F1 (%)", "token overlap with SQuAD's answers (eval_f1)", field("eval_f1", scale=100, digits=1)),
            ("", "GPU Utilization (%)", "nvidia-smi utilization.gpu, GPU 0, mean while training", utilization),
        ]
        return pd.DataFrame([{"Metric": metric, "Log Location & Extraction": source,
                              "Your Value": measured_cell(record, read(record))} for _, metric, source, read in rows],
                            columns=["Metric", "Log Location & Extraction", "Your Value"])
    rows = [
        ("Training Metrics", "Final Train Loss", "Trainer's train_loss", field("train_loss", digits=4)),
        ("Training Metrics", "Eval Loss (Epoch 1)", "eval_loss at epoch 1", _epoch_loss(1)),
        ("Training Metrics", "Eval Loss (Epoch 2)", "eval_loss at epoch 2", _epoch_loss(2)),
        ("Training Metrics", "Eval Loss (Final)", "last eval_loss", field("eval_loss", digits=4)),
        ("Training Metrics", "Train Samples/sec", "train_samples_per_second", field("train_samples_per_s", digits=3)),
        ("Training Metrics", "Eval Samples/sec", "eval_samples_per_second (first evaluation)",
         field("eval_samples_per_s", digits=3)),
        ("Training Metrics", *_steps_row(record)),
        ("Answer Quality", "Exact Match (%)", "generated answers vs SQuAD's (metrics.jsonl eval_em)",
         field("eval_em", scale=100, digits=1)),
        ("Answer Quality", "F1 (%)", "token overlap with SQuAD's answers (metrics.jsonl eval_f1)",
         field("eval_f1", scale=100, digits=1)),
        ("GPU Memory", "Peak Usage (MiB)", "nvidia-smi, GPU 0", field("gpu0_peak_mib")),
        ("GPU Memory", "Average Usage (MiB)", "nvidia-smi, GPU 0", field("gpu0_avg_mib", digits=2)),
        ("GPU Memory", "Mode Usage (MiB)", "nvidia-smi, GPU 0", field("gpu0_mode_mib")),
        ("GPU Utilization", "Mean While Training (%)", "nvidia-smi utilization.gpu, GPU 0, samples with memory "
         "at or above half its peak", utilization),
        ("GPU Utilization", "Peak (%)", "nvidia-smi utilization.gpu, GPU 0", field("gpu0_util_peak_pct")),
        ("CPU Memory", "Peak Usage (MB)", "psrecord", field("cpu_peak_mib", digits=2)),
        ("CPU Memory", "Average Usage (MB)", "psrecord", field("cpu_avg_mib", digits=2)),
        ("CPU Memory", "Mode Usage (MB)", "psrecord", field("cpu_mode_mib")),
    ]
    return pd.DataFrame([{"Category": category, "Metric": metric, "Extraction Instruction": source,
                          "Your Value": measured_cell(record, read(record))}
                         for category, metric, source, read in rows],
                        columns=["Category", "Metric", "Extraction Instruction", "Your Value"])


def memory_prediction_table(results: pd.DataFrame, reference_id: str) -> Table:
    """The companion table of `workshop_lib.book.measurements.memory_predictions`: estimate beside the measured peak per GPU."""
    return Table("Predicted vs measured memory per GPU", prediction_frame(results, reference_id), PREDICTION_NOTE,
                 key="prediction")
