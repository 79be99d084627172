"""The parsers on real logs written elsewhere (../shared/real-logs/, read in place, skipped when
absent), and the general cases those logs stand for, on small logs written here."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import pytest

from workshop_lib.core.log_text import UnreadableLog, read_text, strip_launcher_prefix
from workshop_lib.results.memory import memory_summary
from workshop_lib.results.parse.hf import parse_trainer_output
from workshop_lib.results.parse.nccl import parse_nccl, read_nccl
from workshop_lib.results.parse.nemo import parse_nemo_log
from workshop_lib.results.parse.nvidia_smi import parse_nvidia_smi, read_nvidia_smi
from workshop_lib.results.parse.psrecord import parse_psrecord

ROOT = Path(__file__).resolve().parents[2]
REAL_LOGS = ROOT.parent / "shared" / "real-logs"
SPIKE = ROOT.parent / "shared" / "nemo-validate" / "SPIKE.md"
DRYRUN_SAMPLE = Path(__file__).parents[1] / "samples" / "nemo" / "dryrun_resolved_arguments.txt"
needs_real_logs = pytest.mark.skipif(not REAL_LOGS.is_dir(), reason="../shared/real-logs is not here")


def _benchmark():
    spec = importlib.util.spec_from_file_location("real_logs_accuracy", ROOT / "benchmarks" / "real_logs_accuracy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@needs_real_logs
def test_every_value_a_person_reads_in_the_real_logs_is_read_right():
    rows = _benchmark().measure(REAL_LOGS)
    wrong = [f"{row['file']}: {row['value']}: expected {row['expected']}, read {row['read']}"
             for row in rows if not row["right"]]
    assert len(rows) >= 80 and wrong == []


@needs_real_logs
def test_nemo_run_prefixes_and_a_log_without_step_timing():
    log = parse_nemo_log(read_text(REAL_LOGS / "nemo" / "nemo2_resiliency_8gpu_run.log"))
    assert [summary.total_params for summary in log.parameter_summaries] == [54_700_000]
    assert log.last_step.global_step == 19 and log.problems == []
    untimed = parse_nemo_log(read_text(REAL_LOGS / "nemo" / "nemo2_gmo_multinode_sft_no_timing.log"))
    assert [step.train_step_timing_s for step in untimed.steps] == [None] * 4
    assert untimed.steps[0].reduced_train_loss == 2.064  # a note appended after the value


@pytest.mark.parametrize("prefix", ["finetune/0 [default0]:", "ining-demo/0 [default3]:", "[default1]:",
                                    "[rank0]:", "0: ", "  3: ", "[1,0]<stdout>:", "1: [default0]:"])
def test_launcher_prefixes_on_every_kind_of_nemo_line(prefix):
    lines = ["8.0 B     Trainable params", "0         Non-trainable params", "8.0 B     Total params",
             "Training epoch 0, iteration 0/1 | global_step: 0 | reduced_train_loss: 2.5 | train_step_timing in s: 3",
             "Training epoch 0, iteration 1/1 | global_step: 1 | reduced_train_loss: 2.0"]
    log = parse_nemo_log("\n".join(prefix + line for line in lines))
    assert log.before_lora.trainable_params == 8_000_000_000 and log.before_lora.non_trainable_params == 0
    assert [(step.global_step, step.train_step_timing_s) for step in log.steps] == [(0, 3.0), (1, None)]


def test_a_prefix_is_only_taken_where_a_launcher_puts_one():
    assert strip_launcher_prefix("12:30:01 started") == "12:30:01 started"
    assert strip_launcher_prefix("0 | module | DDP  | 54.7 M | train") == "0 | module | DDP  | 54.7 M | train"
    assert strip_launcher_prefix("logs/0 written") == "logs/0 written"


def test_after_a_restart_the_last_run_of_a_step_wins():
    step = "Training epoch 0, iteration {0}/9 | global_step: {0} | reduced_train_loss: {1} | train_step_timing in s: 1.5"
    text = "\n".join([step.format(3, 2.0), step.format(4, 1.9), "Restoring states from the checkpoint of step 3",
                      step.format(4, 1.7), step.format(5, 1.6)])
    log = parse_nemo_log(text)
    assert [(s.global_step, s.reduced_train_loss) for s in log.steps] == [(3, 2.0), (4, 1.7), (5, 1.6)]


def test_dry_run_resolved_arguments_sample():
    arguments = parse_nemo_log(read_text(DRYRUN_SAMPLE)).resolved_arguments
    assert arguments["data"] == "SquadDataModule(seq_length=2048, micro_batch_size=1, global_batch_size=8)"
    assert arguments["peft"] == "None"
    assert "expert_model_parallel_size=2, ...), devices='4'" in arguments["trainer"]
    assert arguments["optim"].endswith("lr_scheduler=CosineAnnealingScheduler(warmup_steps=50, constant_steps=0, min_lr=0))")
    assert list(arguments) == ["data", "model", "optim", "peft", "resume", "tokenizer", "trainer"]


@pytest.mark.skipif(not SPIKE.is_file(), reason="../shared/nemo-validate/SPIKE.md is not here")
def test_dry_run_captured_in_the_spike():
    text = read_text(SPIKE)
    arguments = parse_nemo_log(text[text.index("Dry run, `model-parallel/mixtral"):]).resolved_arguments
    assert "sequence_parallel=True" in arguments["trainer"] and arguments["tokenizer"] == "'model'"


def test_several_evaluation_sets_and_string_values():
    text = ("{'eval_squad_loss': '1.25', 'eval_squad_runtime': '2.0', 'epoch': '1.0'}\n"
            "{'eval_loss': '1.5', 'epoch': '1.0'}\n"
            "{'eval_trivia_loss': '2.5', 'eval_trivia_f1': '0.3', 'epoch': '1.0'}\n")
    log = parse_trainer_output(text)
    assert log.datasets == ["squad", "", "trivia"]
    assert [(entry.dataset, entry.eval_loss) for entry in log.evals] == [("squad", 1.25), ("", 1.5), ("trivia", 2.5)]
    assert log.evals[0].eval_runtime == 2.0 and log.evals[2].extra == {"eval_trivia_f1": 0.3}
    assert log.final_eval.eval_loss == 1.5


def test_a_record_cut_by_another_rank_keeps_what_was_printed_whole():
    log = parse_trainer_output("{'loss': 0.5, 'learning_rate': 1e-05, 'epo[rank1]: {'loss': 0.4, 'epoch': 2.0}\n")
    assert [(entry.loss, entry.learning_rate, entry.epoch) for entry in log.train] == [(0.5, 1e-05, None), (0.4, None, 2.0)]
    assert [problem.line for problem in log.problems] == [1]


def test_nccl_older_layout_and_several_collectives_by_name():
    header = "#       size         count    type     time   algbw   busbw  error     time   algbw   busbw  error\n"
    text = ("Running: ./build/all_gather_perf -b 8 -e 16 -g 2\n" + header
            + "           8             1   float    50.00    0.00    0.00  0e+00    51.00    0.00    0.00  0e+00\n"
            + "...\n# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 1.5\n"
            + "Running: ./build/broadcast_perf -b 8 -e 16 -g 2\n"
            + "           8             2   float       0    59.75    0.00    0.10  0e+00    59.96    0.00    0.20  0e+00\n"
            + "# Avg bus bandwidth    : 2.5\n")
    log = parse_nccl(text)
    assert list(log.collectives) == ["all_gather_perf", "broadcast_perf"]
    assert log["all_gather"].avg_bus_bandwidth_gbps == 1.5 and log["all_gather"].rows[0].in_place_time_us == 51.0
    assert log["broadcast"].peak_bus_bandwidth_gbps == 0.2 and log["broadcast"].problems == []


def test_an_nccl_file_with_nothing_readable_names_file_line_and_expectation(tmp_path):
    path = tmp_path / "nccl.txt"
    path.write_text("# nThread 1\n  8  2  float  sum  -1  12.9  0.00\n")
    with pytest.raises(UnreadableLog) as raised:
        read_nccl(path)
    message = str(raised.value)
    assert f"{path}:2" in message and "Avg bus bandwidth" in message and "12.9" in message


def test_nvidia_smi_without_a_header_says_which_columns_it_assumed():
    # Nothing in these cells can be memory.total (no column that stays the same and is the largest)
    log = parse_nvidia_smi("2026/11/21 15:14:14.137, 0, NVIDIA H200, 00000000:01:00.0, 6251, 4\n"
                           "2026/11/21 15:14:19.137, 0, NVIDIA H200, 00000000:01:00.0, 6300, 5\n")
    assert log.samples == []
    problem = log.problems[0]
    assert problem.line == 1 and "no header line" in problem.reason and "memory.used" in problem.reason


def test_nvidia_smi_without_a_header_reads_the_seed_query_with_a_bus_id():
    (sample,) = parse_nvidia_smi("2026/11/21 15:14:14.137, 0, NVIDIA H200, 00000000:01:00.0, 6251, 143771\n").samples
    assert (sample.gpu_index, sample.name, sample.used_mib, sample.total_mib) == (0, "NVIDIA H200", 6251.0, 143771.0)


def test_nvidia_smi_header_names_the_columns_every_time_it_repeats():
    text = ("memory.used [MiB], index\n100 MiB, 1\n"
            "timestamp, index, memory.used [MiB]\n2026/11/21 15:14:14.137, 0, 200 MiB\n"
            "index, name\n0, H200\n")
    log = parse_nvidia_smi(text)
    assert [(s.gpu_index, s.used_mib) for s in log.samples] == [(1, 100.0), (0, 200.0)]
    assert [problem.line for problem in log.problems] == [6] and "no memory.used" in log.problems[0].reason


@needs_real_logs
def test_nvidia_smi_utilization_of_a_real_log_with_repeated_headers():
    path = REAL_LOGS / "nvidia_smi" / "gpu_memory_rtx2070_repeated_header.csv"
    # Read here with the csv module, apart from the parser: every data row's `utilization.gpu [%]` cell ("22 %").
    rows = [row for row in csv.DictReader(read_text(path).splitlines(), skipinitialspace=True)
            if row["timestamp"] != "timestamp"]  # the header repeats before every row
    expected = [float(row["utilization.gpu [%]"].removesuffix(" %")) for row in rows]
    log = read_nvidia_smi(path)
    assert [sample.utilization_pct for sample in log.samples] == expected
    assert (len(expected), max(expected), min(expected)) == (224, 42, 1)  # peak and floor, read with awk too
    gpu = memory_summary([path]).gpu(0)
    assert gpu.utilization.peak == 42 and gpu.utilization.average == pytest.approx(sum(expected) / 224)


def test_psrecord_with_fewer_columns_follows_its_header():
    log = parse_psrecord("# Elapsed time   CPU (%)     Real (MB)\n       0.000       93.700        5.000\n")
    (sample,) = log.samples
    assert (sample.cpu_percent, sample.real_mib, sample.virtual_mib) == (93.7, 5.0, None)


@needs_real_logs
def test_nemo_run_prefix_without_a_rank_label_on_a_real_summary():
    """NeMo-Run started one process (no torchrun): its task prefix stands alone before the summary
    (`i.finetune/0 335 M Trainable params`). The real log read in place, its rank labels dropped."""
    text = read_text(REAL_LOGS / "nemo" / "nemo2_resiliency_8gpu_run.log").replace("[default0]:", "")
    assert "ining-demo/0 54.7 M    Trainable params" in text
    log = parse_nemo_log(text)
    assert [(s.trainable_params, s.total_params, s.estimated_size_mb) for s in log.parameter_summaries] == [
        (54_700_000, 54_700_000, 218.656)]
    assert log.problems == []


@pytest.mark.parametrize("prefix", ["i.finetune/0 ", "finetune/0 ", "ining-demo/1 "])
def test_nemo_run_prefix_alone_on_summary_and_step_lines(prefix):
    lines = ["335 M     Trainable params", "0         Non-trainable params", "335 M     Total params",
             "1,340.000 Total estimated model params size (MB)",
             "Training epoch 0, iteration 0/9 | global_step: 0 | reduced_train_loss: 2.5"]
    log = parse_nemo_log("\n".join(prefix + line for line in lines))
    assert (log.before_lora.trainable_params, log.before_lora.total_params) == (335_000_000, 335_000_000)
    assert log.before_lora.estimated_size_mb == 1340.0 and log.problems == []
    assert [step.global_step for step in log.steps] == [0]


def _headerless(path: Path, columns: tuple[str, ...], units: bool) -> tuple[str, list[dict]]:
    """A real header-repeating log rewritten in memory as `--format=csv,noheader[,nounits]` with these columns."""
    rows = [row for row in csv.DictReader(read_text(path).splitlines(), skipinitialspace=True)
            if row["timestamp"] != "timestamp"]
    keys = {key.split(" [")[0]: key for key in rows[0]}
    cells = [[row[keys[column]] if units else row[keys[column]].split(" ")[0] for column in columns] for row in rows]
    return "\n".join(", ".join(line) for line in cells) + "\n", rows


@needs_real_logs
@pytest.mark.parametrize("units", [True, False], ids=["units", "nounits"])
def test_nvidia_smi_without_a_header_real_values(units):
    path = REAL_LOGS / "nvidia_smi" / "gpu_memory_rtx2070_repeated_header.csv"
    text, rows = _headerless(path, ("utilization.gpu", "memory.used", "memory.total"), units)
    log = parse_nvidia_smi(text)
    assert log.problems == [] and len(log.samples) == len(rows) == 224
    assert [s.used_mib for s in log.samples] == [float(row["memory.used [MiB]"].split()[0]) for row in rows]
    assert {s.total_mib for s in log.samples} == {8192.0}
    assert [s.utilization_pct for s in log.samples] == [float(row["utilization.gpu [%]"].split()[0]) for row in rows]


@pytest.mark.parametrize("text", [
    "45 %, 30512 MiB, 81559 MiB, 41, 210.52 W\n97 %, 64000 MiB, 81559 MiB, 63, 689.10 W\n",
    "45, 30512, 81559, 41, 210.52\n97, 64000, 81559, 63, 689.10\n",
], ids=["units", "nounits"])
def test_nvidia_smi_snapshot_of_utilization_used_total_temperature_power(text, tmp_path, capsys):
    log = parse_nvidia_smi(text)
    assert [(s.utilization_pct, s.used_mib, s.total_mib) for s in log.samples] == [
        (45.0, 30512.0, 81559.0), (97.0, 64000.0, 81559.0)]
    assert log.problems == []
    path = tmp_path / "snapshot.txt"  # a name that says nothing: the lines themselves must be recognised
    path.write_text(text)
    from workshop_lib.cli import main

    assert main(["memory", str(path)]) == 0
    assert "Peak = 64000 MiB" in capsys.readouterr().out


def test_nvidia_smi_headerless_lines_that_name_no_memory_are_still_refused():
    log = parse_nvidia_smi("45, 12, 7\n46, 13, 7\n")
    assert log.samples == [] and log.problems and "no header line" in log.problems[0].reason


@pytest.mark.parametrize("text, expected", [
    ("0, 45, 30512, 81559, 41, 210.52\n1, 97, 64000, 81559, 63, 689.10\n",
     [(0, 45.0, 30512.0, 81559.0, None), (1, 97.0, 64000.0, 81559.0, None)]),
    ("2026/11/21 15:14:14.137, 0, NVIDIA H100, 12, 900, 81559\n2026/11/21 15:14:19.140, 1, NVIDIA H100, 88, 70000, 81559\n",
     [(0, 12.0, 900.0, 81559.0, "NVIDIA H100"), (1, 88.0, 70000.0, 81559.0, "NVIDIA H100")]),
    ("0, NVIDIA H100 80GB HBM3, 45 %, 30512 MiB, 81559 MiB, 41, 210.52 W\n",
     [(0, 45.0, 30512.0, 81559.0, "NVIDIA H100 80GB HBM3")]),
], ids=["index-first-nounits", "timestamp-index-name-nounits", "index-name-units"])
def test_nvidia_smi_headerless_queries_with_index_name_and_timestamp(text, expected):
    log = parse_nvidia_smi(text)
    assert log.problems == []
    assert [(s.gpu_index, s.utilization_pct, s.used_mib, s.total_mib, s.name) for s in log.samples] == expected
