"""Real tiny runs through the local SLURM cluster → results → the seeds' tables.

Five chapter-3 experiments run on the tiny profile (HF Trainer baseline, ZeRO-0 / ZeRO-2 / ZeRO-2 +
offload on one "GPU", stage-0 weak scaling on two). Every number the tables show is checked against the
runs' own files, read here independently with `json` (metrics.jsonl, trainer_state.json) and by hand
(psrecord's log); derived columns are recomputed by hand; experiments that never ran show MISSING. In a full
run the five are the executed chapters' own runs, copied (see `_copied_from_the_executed_chapters`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from workshop_lib.book.tables import chapter_tables, render_tables
from workshop_lib.cli import main
from workshop_lib.experiments import get_experiment
from workshop_lib.runs import submit_experiments, wait_for_runs

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.train]

RAN = ["zero/baseline", "zero/single-gpu/zero0", "zero/single-gpu/zero2", "zero/single-gpu/zero2-offload",
       "zero/multi-gpu/2-gpus"]


@pytest.fixture(scope="module")
def runs_dir(local_cluster, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    if _copied_from_the_executed_chapters(root):
        return root
    runs = submit_experiments([get_experiment(i) for i in RAN], "tiny", root=root, backend="slurm")
    infos = wait_for_runs(runs, timeout=900, progress=False)
    failed = {run.experiment.id: (info.state, _tail(run.stdout_path)) for run, info in zip(runs, infos)
              if info.state != "COMPLETED"}
    assert not failed, failed
    return root


def _copied_from_the_executed_chapters(root: Path) -> bool:
    """In a full run the session has already run these five on the same cluster and profile (book_fixtures'
    executed chapters): their folders are copied as they are (a run folder is self-contained), so the suite does
    not train them twice. Run alone, the module submits its own."""
    from book_fixtures import executed_so_far

    executed = executed_so_far()
    if executed is None:
        return False
    sources = [executed.runs_dir / experiment_id for experiment_id in RAN]
    if not all((source / "train" / "metrics.jsonl").is_file() for source in sources):
        return False
    for experiment_id, source in zip(RAN, sources):
        shutil.copytree(source, root / experiment_id, symlinks=True)
    return True


def _tail(path: Path | None) -> str:
    return path.read_text()[-2000:] if path and path.exists() else "(no stdout)"


def _summary(runs_dir: Path, experiment_id: str) -> dict:
    lines = (runs_dir / experiment_id / "train" / "metrics.jsonl").read_text().splitlines()
    [summary] = [json.loads(line) for line in lines if '"summary"' in line]
    return summary


def _trainer_train_loss(runs_dir: Path, experiment_id: str) -> float:
    state = json.loads((runs_dir / experiment_id / "train" / "trainer_state.json").read_text())
    return [entry["train_loss"] for entry in state["log_history"] if "train_loss" in entry][-1]


def _psrecord_peak(runs_dir: Path, experiment_id: str) -> float:
    """Max of psrecord's 'Real (MB)' column, parsed by hand."""
    values = []
    for line in (runs_dir / experiment_id / "cpu_memory.txt").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 4 and not line.lstrip().startswith("#"):
            try:
                values.append(float(parts[2]))
            except ValueError:
                continue
    return max(values)


def _tables(runs_dir: Path) -> dict:
    return {table.title: table.frame for table in chapter_tables(3, runs_dir)}


def test_baseline_summary_matches_the_run(runs_dir):
    baseline = _tables(runs_dir)["Baseline: HF Trainer without DeepSpeed"]
    assert list(baseline.columns) == ["Category", "Metric", "Extraction Instruction", "Your Value"]
    value = baseline.set_index("Metric")["Your Value"]
    summary = _summary(runs_dir, "zero/baseline")
    assert value["Train Samples/sec"] == round(summary["samples_per_s"], 3)
    assert value["Final Train Loss"] == round(_trainer_train_loss(runs_dir, "zero/baseline"), 4)
    assert value["Eval Loss (Final)"] == round(summary["eval_loss"], 4)
    assert value["Peak Usage (MB)"] == round(_psrecord_peak(runs_dir, "zero/baseline"), 2)
    assert value["Peak Usage (MiB)"] == "n/a"  # no nvidia-smi on a CPU: not recorded, never 0


def test_single_gpu_table_matches_the_runs_and_shows_missing_ones(runs_dir):
    table = _tables(runs_dir)["ZeRO stages on one GPU (with and without CPU offload)"]
    rows = {row["Submit Training Job"].split()[-1]: row for row in table.to_dict("records")}
    for experiment_id in ("zero/single-gpu/zero2", "zero/single-gpu/zero2-offload"):
        row = rows[experiment_id]
        assert row["Train Samples/Second"] == round(_summary(runs_dir, experiment_id)["samples_per_s"], 3)
        assert row["Peak CPU Memory Used (MiB)"] == round(_psrecord_peak(runs_dir, experiment_id), 2)
    for experiment_id in ("zero/single-gpu/zero1", "zero/single-gpu/zero3-offload"):
        measured = [v for k, v in rows[experiment_id].items() if k not in ("DeepSpeed Config", "Submit Training Job")]
        assert set(measured) == {"MISSING"}


def test_weak_scaling_columns_are_recomputed_by_hand(runs_dir):
    table = _tables(runs_dir)["Multi-GPU weak scaling (500 samples per GPU)"].set_index("Metric")
    two = _summary(runs_dir, "zero/multi-gpu/2-gpus")
    one = _summary(runs_dir, "zero/single-gpu/zero0")  # the same recipe on one GPU: equal work per GPU
    assert table.loc["Train Samples/sec", "2 GPUs"] == round(two["samples_per_s"], 3)
    assert table.loc["Train Loss", "2 GPUs"] == round(_trainer_train_loss(runs_dir, "zero/multi-gpu/2-gpus"), 4)
    assert table.loc["Train Runtime (s)", "2 GPUs"] == round(two["train_runtime_s"], 2)
    # Efficiency from the per-step time (start-up and evaluation dominate a short run's total runtime).
    key = "median_step_time_s" if one.get("median_step_time_s") and two.get("median_step_time_s") \
        else "mean_step_time_s"
    efficiency = round(100 * round(one[key] / two[key], 4), 1)
    assert table.loc["Weak Scaling Efficiency vs 1 GPU (%)", "2 GPUs"] == efficiency
    assert table.loc["Throughput Scaling vs 1 GPU", "2 GPUs"] == round(two["samples_per_s"] / one["samples_per_s"], 2)
    for column in ("4 GPUs", "8 GPUs"):
        assert set(table[column].drop("Submit Job")) == {"MISSING"}


def test_missing_experiments_show_their_state_never_zero(runs_dir):
    tables = _tables(runs_dir)
    for title in ("2-GPU ZeRO stage comparison, without CPU offload",
                  "2-GPU ZeRO stage comparison, with CPU offload", "Multi-node weak scaling (250 samples per GPU)"):
        frame = tables[title].set_index("Metric").drop("Submit Job")
        assert set(frame.to_numpy().ravel()) == {"MISSING"}, title
    for frame in tables.values():
        assert not (frame.astype(str) == "0").any().any()


def test_predicted_memory_beside_the_measured_peak(runs_dir):
    frame = _tables(runs_dir)["Predicted vs measured memory per GPU"].set_index("Run")
    row = frame.loc["zero/single-gpu/zero2"]
    summary = _summary(runs_dir, "zero/single-gpu/zero2")
    assert row["Model as run"] == summary["model"] == "tiny-bloom"
    # fp32 (the tiny profile trains in fp32), one rank shares nothing: fp32 weights 4 + gradients 4 + the fp32
    # master ZeRO clones even of fp32 weights and Adam's moments 12 bytes per parameter.
    assert row["Predicted model states (MiB)"] == round(20 * summary["total_params"] / 2**20, 2)
    # Measured: tensor bytes of the engine's second step (the census), not the process RSS.
    assert row["Measured model states (MiB)"] == round(summary["model_state_bytes_per_rank"][0] / 2**20, 2)
    assert abs(row["Model-state error (%)"]) <= 15
    assert row["Measured peak (MiB)"] == round(summary["step_peak_bytes_per_rank"][0] / 2**20, 2)
    assert row["Measured as"] == "tensor_step_peak"
    assert abs(row["Peak error (%)"]) <= 25
    base = _summary(runs_dir, "zero/baseline")["step_peak_bytes_per_rank"][0]
    assert row["Measured Δ vs reference (MiB)"] == round((summary["step_peak_bytes_per_rank"][0] - base) / 2**20, 2)
    assert frame.loc["zero/single-gpu/zero1", "Measured peak (MiB)"] == "MISSING"


def _as_printed(value: float) -> str:
    # The markdown table prints a whole-number float without ".0" (a run can measure exactly 48 samples/s).
    return str(int(value)) if float(value).is_integer() and abs(value) >= 1 else str(value)


def test_collect_prints_the_same_numbers(runs_dir, capsys):
    assert main(["collect", "--chapter", "3", "--runs", str(runs_dir)]) == 0
    out = capsys.readouterr().out
    for experiment_id in RAN:
        summary = _summary(runs_dir, experiment_id)
        assert _as_printed(round(summary["samples_per_s"], 3)) in out, experiment_id
    assert _as_printed(round(_summary(runs_dir, "zero/multi-gpu/2-gpus")["train_runtime_s"], 2)) in out
    assert out == render_tables(chapter_tables(3, runs_dir), "md") + "\n"
