"""`workshop memory` on a multi-node, multi-GPU run directory, checked against statistics computed
here from the readings the test wrote (not from the parser)."""

import random
import re
import statistics
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from repo_paths import TESTS

from workshop_lib.cli import main
from workshop_lib.core.errors import WorkshopError
from workshop_lib.results.memory import memory_stats, memory_summary
from workshop_lib.results.parse.nvidia_smi import read_nvidia_smi

SAMPLES = TESTS / "samples"
LINE = re.compile(
    r"^\[(?P<label>[^\]]+) - GPU (?P<gpu>\d+)\] Peak = (?P<peak>[\d.]+) MiB, Avg = (?P<avg>[\d.]+) MiB, "
    r"Mode = (?P<mode>[\d.]+) MiB, Busy avg = (?P<busy>[\d.]+) MiB \((?P<busy_n>\d+) of (?P<n>\d+) samples\)$"
)


def _readings(rng: random.Random, peak: int) -> list[int]:
    """Idle before loading, a training plateau with noise, idle after exit (the seeds' shape)."""
    idle_before = [0] * rng.randint(8, 14) + [1] * 3
    training = [peak - rng.choice([0, 0, 0, 64, 128, 512]) for _ in range(rng.randint(20, 30))]
    idle_after = [1] * rng.randint(10, 16)
    return idle_before + training + idle_after


def _write_node_log(path: Path, gpus: dict[int, list[int]], with_units: bool) -> None:
    start = datetime(2025, 12, 5, 10, 24, 29)
    lines = ["timestamp, index, name, memory.used [MiB], memory.total [MiB]"]
    for tick in range(len(gpus[0])):
        stamp = (start + timedelta(seconds=5 * tick)).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
        for index, values in gpus.items():
            used, total = (f"{values[tick]} MiB", "81920 MiB") if with_units else (values[tick], 81920)
            lines.append(f"{stamp}, {index}, NVIDIA A100-SXM4-80GB, {used}, {total}")
    lines.append(lines[-1][:30])  # the monitor was killed mid-line
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture
def two_node_run(tmp_path):
    rng = random.Random(7)
    expected = {}
    run = tmp_path / "runs" / "zero" / "multi-node" / "2-nodes"
    run.mkdir(parents=True)
    for node, peaks, with_units in (("node1", [16273, 15001], False), ("node2", [12000, 12800], True)):
        length = rng.randint(45, 55)
        gpus = {}
        for index, peak in enumerate(peaks):
            values = _readings(rng, peak)
            gpus[index] = (values + [1] * length)[:length]
            expected[(node, index)] = gpus[index]
        _write_node_log(run / f"gpu_memory_{node}.csv", gpus, with_units)
    (run / "train").mkdir()  # other things a run directory holds are ignored
    return run, expected


def test_workshop_memory_matches_independent_statistics(two_node_run, capsys):
    run, expected = two_node_run
    assert main(["memory", str(run)]) == 0
    printed = [LINE.match(line) for line in capsys.readouterr().out.splitlines()]
    rows = {(m["label"].removeprefix("gpu_memory_"), int(m["gpu"])): m for m in printed if m}
    assert set(rows) == set(expected)  # GPU 0 of node1 and GPU 0 of node2 are separate rows
    for key, values in expected.items():
        row = rows[key]
        peak = max(values)
        busy = [v for v in values if v >= 0.5 * peak]
        counts = Counter(values)
        mode = min(v for v, c in counts.items() if c == max(counts.values()))
        assert float(row["peak"]) == peak
        assert float(row["avg"]) == pytest.approx(statistics.mean(values), abs=0.005)
        assert float(row["mode"]) == mode
        assert float(row["busy"]) == pytest.approx(statistics.mean(busy), abs=0.005)
        assert (int(row["busy_n"]), int(row["n"])) == (len(busy), len(values))
        assert float(row["busy"]) > 1.5 * float(row["avg"])  # the busy average shows the plateau


def test_memory_report_from_python(two_node_run):
    run, expected = two_node_run
    report = memory_summary([run])
    assert report.gpu(0, node="node2").stats.peak == max(expected[("node2", 0)])
    assert report.gpu(1, node="node1").stats.samples == len(expected[("node1", 1)])
    assert report.skipped_lines == 2  # one cut line per node


def test_log_files_given_directly_and_cpu_modes(capsys):
    files = [SAMPLES / "nvidia_smi" / "h200x2_units.csv", SAMPLES / "psrecord" / "cpu_memory.txt"]
    assert main(["memory", *map(str, files)]) == 0
    out = capsys.readouterr().out
    assert "[h200x2_units - GPU 1] Peak = 3389 MiB" in out
    assert "CPU Memory Usage [cpu_memory]" in out and "Peak =    262.46 MiB" in out
    assert "Mode =    162, 262 MiB" in out  # tied modes are all shown, as the seeds did


def test_gpu_only_and_json(capsys):
    assert main(["memory", "--gpu-only", str(SAMPLES / "psrecord" / "cpu_memory.txt"),
                 str(SAMPLES / "nvidia_smi" / "h200x2_nounits.csv")]) == 0
    assert "CPU Memory Usage" not in capsys.readouterr().out
    assert main(["memory", "--json", str(SAMPLES / "nvidia_smi" / "h200x2_nounits.csv")]) == 0
    assert '"peak": 6251.0' in capsys.readouterr().out


@pytest.mark.parametrize("units", [True, False], ids=["units", "nounits"])
def test_headerless_utilization_first_log_after_date_lines(tmp_path, capsys, units):
    """`date; nvidia-smi --query-gpu=utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw
    --format=csv,noheader` in a loop (issue 38): the date lines stamp the samples, the columns come from the cells."""
    readings = [(0, 3, 34, 61.2), (97, 41234, 58, 301.75), (99, 61234, 61, 322.1)]
    lines = []
    for second, (busy, used, temperature, watts) in zip((0, 5, 10), readings):
        lines.append(f"Fri Nov 27 10:00:{second:02d} UTC 2026")
        lines.append(f"{busy} %, {used} MiB, 81920 MiB, {temperature}, {watts:.2f} W" if units
                     else f"{busy}, {used}, 81920, {temperature}, {watts:.2f}")
    log = tmp_path / "gpu_util.log"
    log.write_text("\n".join(lines) + "\n")
    assert main(["memory", str(log)]) == 0
    out = capsys.readouterr().out
    assert "Peak = 61234 MiB" in out and "Utilization: Peak = 99 %" in out
    samples = read_nvidia_smi(log).samples
    assert [sample.timestamp.second for sample in samples] == [0, 5, 10]
    assert [sample.total_mib for sample in samples] == [81920.0] * 3

def test_missing_path_and_directory_without_logs(tmp_path, capsys):
    assert main(["memory", str(tmp_path / "nope")]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    assert main(["memory", str(tmp_path)]) == 2
    assert "no memory log here" in capsys.readouterr().err
    (tmp_path / "notes.txt").write_text("hello\n")
    with pytest.raises(WorkshopError, match="not a memory log"):
        memory_summary([tmp_path / "notes.txt"])
    (tmp_path / "gpu_memory_node1.csv").write_text("timestamp, index, name, memory.used [MiB]\n[N/A]\n")
    with pytest.raises(WorkshopError, match="no readable sample"):
        memory_summary([tmp_path])


def test_memory_stats_edge_cases():
    stats = memory_stats([0, 0, 0])
    assert stats.peak == 0 and stats.busy_average is None and stats.modes == (0.0,)
    with pytest.raises(ValueError):
        memory_stats([])


def test_gpu_utilization_per_gpu_while_training(capsys):
    path = SAMPLES / "nvidia_smi" / "h100_utilization_units.csv"
    rows = [line.split(", ") for line in path.read_text().splitlines()[1:]]
    memory = [float(row[4].split()[0]) for row in rows]
    percent = [float(row[3].split()[0]) for row in rows]
    busy = [p for used, p in zip(memory, percent) if used >= max(memory) / 2]  # while the model was on the GPU
    assert main(["memory", str(path)]) == 0
    out = capsys.readouterr().out
    line = (f"    Utilization: Peak = {max(percent):.0f} %, Avg = {statistics.mean(percent):.1f} %, "
            f"Busy avg = {statistics.mean(busy):.1f} %")
    assert line in out.splitlines() and "Busy avg = 63.0 %" in line


def test_the_busy_fraction_the_help_promises_is_the_summarys_default(capsys):
    from workshop_lib.results.memory import DEFAULT_BUSY_FRACTION

    with pytest.raises(SystemExit):
        main(["memory", "--help"])
    assert f"(default {DEFAULT_BUSY_FRACTION:g}," in " ".join(capsys.readouterr().out.split())
