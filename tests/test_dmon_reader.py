"""The toy dmon.csv format: read into the run's row, its bad lines noted."""

from workshop_lib.results.read import read_run

DMON = """# gpu    sm   mem   enc   dec
# Idx     %     %     %     %
    0    45    12     0     0
    1    50    14     0     0
    0    97    30     0     0
    0     -    31     0     0
"""


def test_a_run_with_a_dmon_log_gets_gpu0_peak_sm_utilisation(tmp_path):
    (tmp_path / "dmon.csv").write_text(DMON)
    result = read_run(tmp_path)
    assert result.gpu0_sm_peak_pct == 97.0  # GPU 0's peak, not GPU 1's
    assert [(lines.file, [problem.line for problem in lines.problems]) for lines in result.unreadable] \
        == [("dmon.csv", [6])]  # "-": a counter dmon could not read
    assert read_run(tmp_path.parent / "absent").gpu0_sm_peak_pct is None
