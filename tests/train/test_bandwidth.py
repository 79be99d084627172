"""The inter-node bandwidth check: nccl-tests' bus bandwidth, measured with torch.distributed for real."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from workshop_lib.results.parse.nccl import parse_nccl_allreduce
from workshop_lib.train.bandwidth import bus_bandwidth_gbps

ROOT = Path(__file__).resolve().parents[2]  # this checkout, whatever the environment has installed


def test_bus_bandwidth_is_nccl_tests_definition():
    # 1 GB in 0.1 s: algbw 10 GB/s; busbw = algbw * 2 (n - 1) / n
    assert bus_bandwidth_gbps(10**9, 0.1, 2) == pytest.approx((10.0, 10.0))
    assert bus_bandwidth_gbps(10**9, 0.1, 8) == pytest.approx((10.0, 17.5))
    assert bus_bandwidth_gbps(10**9, 0.1, 1)[1] == 0  # one rank moves nothing: a check must not pass on it


@pytest.mark.train
def test_two_processes_report_in_the_layout_the_nccl_parser_reads(tmp_path):
    torchrun = shutil.which("torchrun") or pytest.skip("torchrun is not installed")
    result = subprocess.run([torchrun, "--standalone", "--nproc_per_node=2", "-m", "workshop_lib.train.bandwidth",
                             "--size-mb", "2", "--iterations", "3"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=180, env={"PATH": f"{sys.prefix}/bin:/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "",
                                 "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})  # the gloo check, also on a GPU machine
    assert result.returncode == 0, result.stderr[-2000:]
    report = parse_nccl_allreduce(result.stdout)
    assert len(report.rows) == 1 and report.rows[0].size_bytes == 2 * 2**20 and report.out_of_bounds == 0
    assert report.avg_bus_bandwidth_gbps > 0 and report.skipped_lines == 0
    assert "over 2 ranks" in result.stdout and "backend gloo" in result.stdout
