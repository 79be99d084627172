"""nvidia-smi memory CSVs (samples recorded on a 2×H200 machine, and on an H100 with the job scripts'
query), with and without units."""

import csv
from datetime import datetime
from pathlib import Path

import pytest

from workshop_lib.core.log_text import read_text
from workshop_lib.core.run_directory import GPU_QUERY
from workshop_lib.results.parse.nvidia_smi import node_from_filename, parse_nvidia_smi, read_nvidia_smi

SAMPLES = Path(__file__).parents[1] / "samples" / "nvidia_smi"


def test_without_units():
    log = read_nvidia_smi(SAMPLES / "h200x2_nounits.csv", node="gpu201-02")
    assert log.node == "gpu201-02" and log.gpu_indices == [0, 1]
    assert len(log.used_mib(0)) == len(log.used_mib(1)) == 27
    assert max(log.used_mib(0)) == 6251 and max(log.used_mib(1)) == 3389
    assert log.samples[0].timestamp == datetime(2026, 11, 21, 15, 14, 6, 104000)
    assert log.samples[0].name == "NVIDIA H200" and log.samples[0].total_mib == 143771
    assert log.skipped_lines == 0


def test_with_units_and_other_columns():
    log = read_nvidia_smi(SAMPLES / "h200x2_units.csv")
    assert log.gpu_indices == [0, 1]
    assert max(log.used_mib(0)) == 6251 and log.samples[0].total_mib == 143771
    assert log.samples[0].name is None  # that query had utilization.gpu instead of name


def test_unavailable_values_a_cut_line_and_mixed_lines_are_skipped():
    lines = read_text(SAMPLES / "h200x2_nounits.csv").splitlines()
    damaged = [
        *lines[:5],
        "2026/11/21 15:14:08.105, 0, NVIDIA H200, [N/A], 143771",
        lines[5] + lines[6],  # two loggers wrote into one line
        "timestamp, index, name, memory.used [MiB], memory.total [MiB]",  # the file was appended to
        *lines[7:],
        "2026/11/21 15:14:19.661, 0, NVIDIA H2",  # the job was killed mid-line
    ]
    log = parse_nvidia_smi("\n".join(damaged))
    assert len(log.samples) == len(lines) - 3  # header, and the two lines merged into one
    assert log.skipped_lines == 3


def test_file_without_header_uses_the_job_scripts_columns():
    log = parse_nvidia_smi("2026/11/21 15:14:14.137, 0, NVIDIA H200, 6251, 143771\n")
    assert log.samples[0].used_mib == 6251


def test_node_names_from_file_names():
    assert node_from_filename("runs/x/gpu_memory_node1.csv") == "node1"
    assert node_from_filename("gpu_memory_log_gpu201-02.csv") == "gpu201-02"
    assert node_from_filename("gpu_memory_log.csv") == "gpu_memory_log"


def _column(path: Path, header: str) -> list[str]:
    """One column of an nvidia-smi CSV as text, read with the csv module (apart from the parser)."""
    with open(path, newline="") as handle:
        return [row[header] for row in csv.DictReader(handle, skipinitialspace=True)]


# Recorded on one H100 with the job scripts' query at 1 s: idle, 12 s of bf16 matrix products, 8 s of a
# GPU mostly waiting for its host (a product, then 50 ms of sleep), idle; tests/samples/nvidia_smi/README.md.
@pytest.mark.parametrize("name", ["h100_utilization_nounits.csv", "h100_utilization_units.csv"])
def test_utilization_from_the_job_scripts_query(name):
    path = SAMPLES / name
    header = read_text(path).splitlines()[0]
    assert [cell.split("[")[0].strip() for cell in header.split(",")] == GPU_QUERY.split(",")  # what jobs write
    log = read_nvidia_smi(path)
    expected = [float(cell.removesuffix(" %")) for cell in _column(path, "utilization.gpu [%]")]
    assert [sample.utilization_pct for sample in log.samples] == expected
    assert expected.count(100.0) == 13 and log.skipped_lines == 0
    assert max(log.used_mib(0)) == 1011 and log.samples[0].name == "NVIDIA H100 80GB HBM3"


def test_utilization_not_reported_keeps_the_memory_and_a_damaged_one_is_reported():
    text = ("timestamp, index, name, utilization.gpu [%], memory.used [MiB], memory.total [MiB]\n"
            "2026/11/22 17:18:34.437, 0, NVIDIA A100-SXM4-40GB MIG 1g.5gb, [N/A], 1011, 4864\n"
            "2026/11/22 17:18:35.437, 0, NVIDIA H100 80GB HBM3, 1O0, 1011, 81559\n")
    log = parse_nvidia_smi(text)
    assert [(sample.used_mib, sample.utilization_pct) for sample in log.samples] == [(1011.0, None)]
    (problem,) = log.problems
    assert problem.line == 3 and "utilization.gpu is '1O0', not a percentage" in problem.reason


def test_a_query_without_utilization_leaves_it_empty():
    assert {sample.utilization_pct for sample in read_nvidia_smi(SAMPLES / "h200x2_nounits.csv").samples} == {None}
