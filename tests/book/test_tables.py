"""Run directories → records → the seeds' tables: values come from the runs' own files, derived
columns are computed, and runs that are missing or failed show their state."""

import csv
import json
import shutil
from pathlib import Path

import pytest
from repo_paths import TESTS

from workshop_lib.book.chapter.your_runs import show_run_table
from workshop_lib.book.tables import chapter_tables, drop_unrecorded, long_form, render_tables
from workshop_lib.cli import main
from workshop_lib.experiments import get_experiment
from workshop_lib.results import chapter_results, read_run
from workshop_lib.results.memory import memory_summary
from workshop_lib.runs import load_run

SAMPLES = TESTS / "samples"
CH1_COLUMNS = ["GPUs", "Batch per GPU", "Total job time (HH:MM:SS)", "Train step time (s)", "Last reduced_train_loss",
               "GPU 0 Peak (MiB)", "GPU 0 Avg (MiB)", "GPU 0 Mode (MiB)", "Time scaling vs 1 GPU",
               "Peak memory scaling vs 1 GPU"]


def _nemo_run(folder: Path, total: str, gpu_log: str, job_id: int) -> None:
    folder.mkdir(parents=True)
    text = (SAMPLES / "nemo" / "llama_lora_2gpus.out").read_text().replace("00:09:55", total)
    (folder / f"slurm-{job_id}.out").write_text(text)
    shutil.copy(SAMPLES / "nvidia_smi" / gpu_log, folder / "gpu_memory_node1.csv")
    (folder / "job.json").write_text(json.dumps({"job_id": job_id, "experiment_id": folder.name}))


@pytest.fixture
def chapter_1_runs(tmp_path):
    runs = tmp_path / "runs"
    _nemo_run(runs / "lora/llama/1-gpu", "00:09:55", "h200x2_nounits.csv", 101)
    _nemo_run(runs / "lora/llama/2-gpus", "00:05:00", "h200x2_units.csv", 102)
    failed = runs / "lora/llama/4-gpus"
    failed.mkdir(parents=True)
    (failed / "job.json").write_text(json.dumps({"job_id": "103", "final_state": "FAILED", "exit_code": 1}))
    return runs  # 8 GPUs and every Mixtral run: never submitted


def test_chapter_1_table_from_runs(chapter_1_runs):
    table = chapter_tables(1, chapter_1_runs)[0].frame
    assert list(table.columns) == CH1_COLUMNS + ["GPU 0 Utilization (%)", "Model States per Rank (MiB)",
                                                 "Step Peak Tensors per Rank (MiB)"]
    one, two, four, eight = table.to_dict("records")
    gpu0 = memory_summary([chapter_1_runs / "lora/llama/1-gpu"]).gpu(0)
    # The mean of steps 2-10 (1.515), not the last step alone (1.608): one step is noise.
    assert one["Total job time (HH:MM:SS)"] == "00:09:55" and one["Train step time (s)"] == 1.515
    assert one["Last reduced_train_loss"] == 0.1058
    assert one["GPU 0 Peak (MiB)"] == gpu0.stats.peak == 6251
    assert one["GPU 0 Avg (MiB)"] == round(gpu0.stats.average, 2) and one["GPU 0 Mode (MiB)"] == 0
    assert one["Time scaling vs 1 GPU"] == 1.0 and one["Peak memory scaling vs 1 GPU"] == 1.0
    assert one["GPU 0 Utilization (%)"] == "n/a"  # that monitor's query had no utilization.gpu
    assert two["GPU 0 Utilization (%)"] == 0.0  # recorded, and 0 % in every sample of that log
    assert two["Batch per GPU"] == 4 and four["Batch per GPU"] == 2
    assert two["Time scaling vs 1 GPU"] == round(595 / 300, 2)
    assert two["Peak memory scaling vs 1 GPU"] == 1.0  # both logs peak at 6251 MiB on GPU 0
    assert set(list(four.values())[2:]) == {"FAILED"}
    assert set(list(eight.values())[2:]) == {"MISSING"}
    assert 0 not in list(four.values())[2:] + list(eight.values())[2:]


def test_ratios_use_the_smallest_layout_that_completed_and_the_note_says_which(tmp_path):
    runs = tmp_path / "runs"
    failed = runs / "lora/llama/1-gpu"
    failed.mkdir(parents=True)
    (failed / "job.json").write_text(json.dumps({"job_id": "100", "final_state": "FAILED", "exit_code": 1}))
    _nemo_run(runs / "lora/llama/2-gpus", "00:09:55", "h200x2_nounits.csv", 101)
    _nemo_run(runs / "lora/llama/4-gpus", "00:05:00", "h200x2_units.csv", 102)
    table = chapter_tables(1, runs)[0]
    two, four = table.frame.to_dict("records")[1:3]
    assert two["Time scaling vs 2 GPU"] == 1.0 and four["Time scaling vs 2 GPU"] == round(595 / 300, 2)
    assert "smallest layout that completed: lora/llama/2-gpus (2 GPUs)" in table.note


def test_a_dropped_column_is_named_in_the_note(chapter_1_runs):
    table = chapter_tables(1, chapter_1_runs)[0]  # NeMo logs: no tensor census
    shown = drop_unrecorded(table)
    assert "Model States per Rank (MiB)" not in shown.frame.columns
    assert "Not shown, because no completed run recorded a value: " in shown.note
    assert "Model States per Rank (MiB)" in shown.note
    assert "No run of this table has completed yet" in chapter_tables(1, chapter_1_runs)[1].note  # Mixtral


def test_mixtral_table_uses_two_gpus_as_baseline(chapter_1_runs):
    table = chapter_tables(1, chapter_1_runs)[1].frame
    assert "Time scaling vs 2 GPU" in table.columns and list(table["GPUs"]) == [2, 4, 8]


def _hf_run(folder: Path, samples_per_s: float) -> None:
    (folder / "train").mkdir(parents=True)
    metrics = (SAMPLES / "metrics" / "metrics.jsonl").read_text().replace('"samples_per_s": 22.54',
                                                                          f'"samples_per_s": {samples_per_s}')
    (folder / "train" / "metrics.jsonl").write_text(metrics)
    shutil.copy(SAMPLES / "hf" / "trainer_state.json", folder / "train" / "trainer_state.json")
    shutil.copy(SAMPLES / "psrecord" / "cpu_memory.txt", folder / "cpu_memory.txt")


def test_chapter_3_tables_from_runs(tmp_path):
    runs = tmp_path / "runs"
    _hf_run(runs / "zero/baseline", 30.0)
    _hf_run(runs / "zero/two-gpus/zero2-offload", 12.5)
    record = read_run(runs / "zero/baseline")
    assert record.state == "COMPLETED" and record.eval_loss_by_epoch == {1: 1.2965, 2: 1.581, 3: 1.779}
    tables = {table.title: table.frame for table in chapter_tables(3, runs)}
    baseline = tables["Baseline: HF Trainer without DeepSpeed"].set_index("Metric")["Your Value"]
    assert baseline["Final Train Loss"] == 0.7039 and baseline["Eval Loss (Epoch 2)"] == 1.581
    assert baseline["Train Samples/sec"] == 30.0 and baseline["Steps per Epoch"] == 32
    assert baseline["Peak Usage (MB)"] == 262.46
    assert baseline["Peak Usage (MiB)"] == "n/a"  # a CPU run has no nvidia-smi log: not 0
    offload = tables["2-GPU ZeRO stage comparison, with CPU offload"]
    assert list(offload.columns) == ["Metric", "Stage 1", "Stage 2", "Stage 3"]
    stage = offload.set_index("Metric")
    assert stage.loc["Train Samples/sec", "Stage 2"] == 12.5
    assert stage.loc["Train Samples/sec", "Stage 1"] == "MISSING"
    assert stage.loc["Submit Job", "Stage 1"] == "workshop submit zero/two-gpus/zero1-offload"
    assert list(tables["Multi-node weak scaling (250 samples per GPU)"].columns) == [
        "Metric", "2 nodes", "4 nodes", "8 nodes"]


def _busy_utilization(path: Path) -> float:
    """GPU 0's mean utilization.gpu over the samples at or above half the memory peak, read here with the
    csv module from the log itself."""
    with open(path, newline="") as handle:
        rows = [(float(r["memory.used [MiB]"].split()[0]), float(r["utilization.gpu [%]"].split()[0]))
                for r in csv.DictReader(handle, skipinitialspace=True) if r["index"] == "0"]
    peak = max(used for used, _ in rows)
    busy = [percent for used, percent in rows if used >= peak / 2]
    return sum(busy) / len(busy)


def test_gpu_utilization_reaches_the_tables_where_gpu_memory_is(tmp_path):
    runs = tmp_path / "runs"
    log = SAMPLES / "nvidia_smi" / "h100_utilization_units.csv"
    for experiment_id in ("zero/single-gpu/zero2-offload", "zero/multi-gpu/2-gpus", "fsdp/gpt/1-gpu"):
        _hf_run(runs / experiment_id, 20.0)
        shutil.copy(log, runs / experiment_id / "gpu_memory_node1.csv")
    _hf_run(runs / "zero/single-gpu/zero0", 25.0)  # a CPU run: no GPU log
    expected = round(_busy_utilization(log), 1)
    assert expected == 63.0  # 13 samples at 100 % and 8 of a starved GPU (2-3 %) while memory was held
    record = read_run(runs / "zero/single-gpu/zero2-offload")
    assert record.gpu0_util_peak_pct == 100 and record.gpu0_util_busy_avg_pct == pytest.approx(_busy_utilization(log))
    three = {table.title: table for table in chapter_tables(3, runs)}
    single = three["ZeRO stages on one GPU (with and without CPU offload)"]
    by_config = single.frame.set_index("DeepSpeed Config")["GPU Utilization (%)"]
    assert by_config["ZeRO stage 2 + CPU offload, 1 GPU"] == expected and by_config["ZeRO stage 0, 1 GPU"] == "n/a"
    assert "utilization.gpu" in single.note
    multi = three["Multi-GPU weak scaling (500 samples per GPU)"].frame.set_index("Metric")
    assert multi.loc["GPU Utilization (%)", "2 GPUs"] == expected
    gpt = {t.title: t.frame for t in chapter_tables(4, runs)}["Custom GPT, FSDP on one node"]
    assert list(gpt["GPU Utilization (%)"])[0] == expected
    # A CPU run alone records none: the column is dropped, as every all-n/a column is.
    cpu_only = tmp_path / "cpu"
    _hf_run(cpu_only / "zero/single-gpu/zero0", 25.0)
    table = next(t for t in chapter_tables(3, cpu_only) if t.key == "single-gpu")
    assert "GPU Utilization (%)" not in drop_unrecorded(table).frame.columns and "utilization" not in table.note


def test_weak_scaling_efficiency_and_long_form(tmp_path):
    runs = tmp_path / "runs"
    # Efficiency comes from the per-step time, not the runtime (start-up dominates a short run's runtime).
    for gpus, runtime, step in ((2, 10.0, 0.10), (4, 9.0, 0.125)):
        folder = runs / f"fsdp/weak-scaling/{gpus}-gpus/train"
        folder.mkdir(parents=True)
        summary = {"kind": "summary", "engine": "gpt", "train_runtime_s": runtime, "mean_step_time_s": step,
                   "samples_per_s": 8.0,
                   "final_loss": 2.0, "total_params": 1000 * gpus, "world_size": gpus}
        (folder / "metrics.jsonl").write_text(json.dumps(summary) + "\n")
    table = {t.title: t.frame for t in chapter_tables(4, runs)}["Custom GPT weak scaling by depth"]
    assert list(table["Efficiency (%)"])[:2] == [100.0, 80.0]
    assert list(table["Num Layers"]) == [3, 6, 12, 24] and list(table["Per-GPU Batch"]) == [8, 4, 2, 1]
    assert list(table["Efficiency (%)"])[2:] == ["MISSING", "MISSING"]
    tidy = long_form(chapter_results(4, runs))
    assert set(tidy["id"]) == {"fsdp/weak-scaling/2-gpus", "fsdp/weak-scaling/4-gpus"}


def test_collect_command_formats(chapter_1_runs, capsys):
    assert main(["collect", "--chapter", "1", "--runs", str(chapter_1_runs)]) == 0
    out = capsys.readouterr().out
    assert "| 1 | 8 | 00:09:55 | 1.515 | 0.1058 | 6251 |" in out
    assert main(["collect", "--chapter", "2", "--format", "json", "--runs", str(chapter_1_runs)]) == 0
    assert json.loads(capsys.readouterr().out)[0]["rows"][0]["Total job time (HH:MM:SS)"] == "MISSING"
    text = render_tables(chapter_tables(1, chapter_1_runs), "csv")
    assert text.startswith("# Llama 3.1 8B + LoRA, data parallel\nGPUs,Batch per GPU")


def _damage(path: Path, line: int, text: str) -> None:
    """Put `text` in as line `line` (1-based) of the file."""
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:line - 1] + [text] + lines[line - 1:]) + "\n")


def test_unreadable_lines_are_named_with_their_reason_once_per_run(chapter_1_runs, capsys):
    run = chapter_1_runs / "lora/llama/2-gpus"
    gpu_log = run / "gpu_memory_node1.csv"
    _damage(gpu_log, 4, "2026/11/21 15:14:07.108, 1, 0 %, 0 MiB, 1437")  # another writer cut this one short
    _damage(gpu_log, 9, "2026/11/21 15:14:08.611, 0, 0 %, [N/A], 143771 MiB")
    _damage(gpu_log, 12, "2026/11/21 15:14:09.105, 0, 0 %, 0 MiB, 143771 MiB2026/11/21 15:14:09.105, 1, 0 %, 0 MiB, "
                         "143771 MiB")  # two writers on one line
    _damage(gpu_log, 15, "2026/11/21 15:14:10.105, 0, garbage, 0 MiB, 143771 MiB")
    stdout = run / "slurm-102.out"
    _damage(stdout, 3, " Total time : 00:6x:10")
    result = read_run(run)
    by_file = {lines.file: lines for lines in result.unreadable}
    assert set(by_file) == {"gpu_memory_node1.csv", "slurm-102.out"} and result.skipped_lines == 4
    assert [problem.line for problem in by_file["gpu_memory_node1.csv"].problems] == [9, 12, 15]
    assert "utilization.gpu is 'garbage'" in by_file["gpu_memory_node1.csv"].problems[2].reason
    assert by_file["slurm-102.out"].note() == ("1 line of slurm-102.out could not be read: line 3: a footer line "
                                               "whose time is not YYYY-MM-DD HH:MM:SS or a duration HH:MM:SS.")
    # Line 4 was cut but still read as a sample (its total is wrong, its memory is not): nothing lost there.
    assert by_file["gpu_memory_node1.csv"].note().startswith(
        "3 lines of gpu_memory_node1.csv could not be read: line 9: memory.used is '[N/A]', not a number of MiB; "
        "line 12: 9 fields where the header names 5; line 15: utilization.gpu is 'garbage', not a percentage.")

    assert main(["collect", "--chapter", "1", "--runs", str(chapter_1_runs)]) == 0
    captured = capsys.readouterr()
    [note] = [line for line in captured.err.splitlines() if "could not be read" in line]
    assert note == (f"workshop collect: note: lora/llama/2-gpus: {by_file['slurm-102.out'].note()} "
                    f"{by_file['gpu_memory_node1.csv'].note()}")
    assert "| 2 | 4 | 00:05:00 |" in captured.out  # the run's other lines still fill its row


def test_many_unreadable_lines_make_one_short_note(chapter_1_runs, capsys):
    gpu_log = chapter_1_runs / "lora/llama/1-gpu" / "gpu_memory_node1.csv"
    for line in range(3, 23, 2):  # ten lines where the GPU answered [N/A]
        _damage(gpu_log, line, "2026/11/21 15:14:08.611, 0, NVIDIA H200, [N/A], 143771")
    runs = [load_run(get_experiment(i), chapter_1_runs) for i in ("lora/llama/1-gpu", "lora/llama/2-gpus")]
    show_run_table(runs, read_only=True)
    shown = [line for line in capsys.readouterr().out.splitlines() if "could not be read" in line]
    assert len(shown) == 1  # the undamaged run says nothing
    assert "lora/llama/1-gpu: 10 lines of gpu_memory_node1.csv could not be read: line 3: " in shown[0]
    assert shown[0].count("line ") == 3 and shown[0].endswith("; and 7 more.</div>")  # three named, the rest counted


def test_chapter_2_rows_name_their_layouts():
    from workshop_lib.book.tables import layout_name
    from workshop_lib.experiments import chapter_experiments

    names = [layout_name({**e.to_dict(), "gpus": e.gpus}) for e in chapter_experiments(2)]
    # EP is carved out of DP, not multiplied in: TP 2 x PP 4 x DP 2 is the 16 GPUs.
    assert names == ["TP 2 x DP 2", "TP 4", "TP 8", "TP 2 x PP 4 x DP 2 (EP 2 within DP) + SP",
                     "TP 4 x PP 2 x DP 2 (EP 2 within DP) + SP"]


def test_time_scaling_above_the_gpu_ratio_is_called_warm_up(tmp_path):
    runs = tmp_path / "runs"
    _nemo_run(runs / "lora/llama/1-gpu", "00:09:55", "h200x2_nounits.csv", 101)
    _nemo_run(runs / "lora/llama/2-gpus", "00:02:00", "h200x2_units.csv", 102)  # 4.96x on 2x the GPUs
    note = chapter_tables(1, runs)[0].note
    assert "Time scaling above the GPU ratio: lora/llama/2-gpus (4.96 on 2x the GPUs)" in note
    assert "measures warm-up, not scaling" in note
    _nemo_run(tmp_path / "even" / "lora/llama/1-gpu", "00:09:55", "h200x2_nounits.csv", 103)
    _nemo_run(tmp_path / "even" / "lora/llama/2-gpus", "00:05:00", "h200x2_units.csv", 104)  # 1.98x: below ideal
    assert "above the GPU ratio" not in chapter_tables(1, tmp_path / "even")[0].note


def test_a_job_shorter_than_the_footers_second_leaves_the_table_whole(tmp_path):
    # The footer counts whole seconds: a rehearsal job of 0.7 s reads 00:00:00 (a class rehearsal's notebook
    # failed on the division by it). Its ratio cells stay empty; nothing divides by zero.
    runs = tmp_path / "runs"
    _nemo_run(runs / "lora/llama/1-gpu", "00:00:02", "h200x2_nounits.csv", 101)
    _nemo_run(runs / "lora/llama/2-gpus", "00:00:00", "h200x2_units.csv", 102)
    table = chapter_tables(1, runs)[0]
    two = table.frame.to_dict("records")[1]
    assert two["Total job time (HH:MM:SS)"] == "00:00:00" and two["Time scaling vs 1 GPU"] == "n/a"
    assert "above the GPU ratio" not in table.note
    _nemo_run(tmp_path / "base" / "lora/llama/1-gpu", "00:00:00", "h200x2_nounits.csv", 103)
    _nemo_run(tmp_path / "base" / "lora/llama/2-gpus", "00:00:01", "h200x2_units.csv", 104)
    assert "above the GPU ratio" not in chapter_tables(1, tmp_path / "base")[0].note
