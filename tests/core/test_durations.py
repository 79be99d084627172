"""The one duration parser: --time, sacct/scontrol times and a job's `Total time` line."""

import pytest

from workshop_lib.core.durations import format_duration, parse_duration


@pytest.mark.parametrize("raw, seconds", [
    ("30", 1800), ("00:02", 2), ("01:00:00", 3600), ("1-00", 86400), ("1-02:03", 93780), ("2-00:00:01", 172801),
    ("26:00:01", 26 * 3600 + 1), ("UNLIMITED", None), ("infinite", None), ("", None), (None, None),
])
def test_slurm_time_limits(raw, seconds):
    assert parse_duration(raw) == seconds


@pytest.mark.parametrize("raw, seconds", [("42", 42), ("05:09", 309), ("00:00:07", 7), ("1-02:03:04", 93784)])
def test_a_bare_number_is_seconds_where_sacct_prints_seconds(raw, seconds):
    assert parse_duration(raw, bare_unit="seconds") == seconds


@pytest.mark.parametrize("raw", ["00:61:00", "1:2:3:4", "ten", "INVALID", "-5", "1-"])
def test_what_is_not_a_duration_is_refused_with_the_forms(raw):
    with pytest.raises(ValueError, match=f"{raw!r} is not a duration"):
        parse_duration(raw)


def test_format_duration_lets_hours_pass_a_day():
    assert format_duration(26 * 3600 + 61) == "26:01:01" and format_duration(59.6) == "00:01:00"
