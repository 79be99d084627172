"""nccl-tests all_reduce_perf output."""

from pathlib import Path

from workshop_lib.core.log_text import read_text
from workshop_lib.results.parse.nccl import parse_nccl_allreduce

SAMPLE = Path(__file__).parents[1] / "samples" / "nccl" / "all_reduce_2nodes.txt"


def test_average_bus_bandwidth_rows_and_hosts():
    result = parse_nccl_allreduce(read_text(SAMPLE))
    assert result.avg_bus_bandwidth_gbps == 23.2088
    assert result.hosts == ["gpu201-16-l", "gpu201-16-r"]
    row = result.rows[0]
    assert row.size_bytes == 4294967296 and row.out_of_place_busbw_gbps == 23.19 and row.in_place_time_us == 184902
    assert result.peak_bus_bandwidth_gbps == 23.23
    assert result.out_of_bounds == 0 and result.skipped_lines == 0


def test_one_test_per_node_reports_the_slowest():
    text = read_text(SAMPLE)
    result = parse_nccl_allreduce(text + text.replace("23.2088", "11.5"))
    assert result.avg_bus_bandwidths_gbps == [23.2088, 11.5]
    assert result.avg_bus_bandwidth_gbps == 11.5


def test_cut_output_has_no_average():
    text = read_text(SAMPLE)
    cut = text[: text.index("  4294967296") + 60]
    result = parse_nccl_allreduce(cut)
    assert result.avg_bus_bandwidth_gbps is None and result.rows == []
    assert result.skipped_lines == 1
