"""The job footer: start, end and total time."""

from datetime import datetime
from pathlib import Path

from workshop_lib.core.log_text import read_text
from workshop_lib.jobs.footer import parse_footer

SAMPLES = Path(__file__).parents[1] / "samples"


def test_footer_of_the_seed_form():
    footer = parse_footer(read_text(SAMPLES / "nemo" / "llama_lora_2gpus.out"))
    assert footer.start_time == datetime(2025, 12, 5, 10, 24, 29)
    assert footer.end_time == datetime(2025, 12, 5, 10, 34, 24)
    assert footer.total_time_s == 9 * 60 + 55
    assert footer.total_time_text == "00:09:55"
    assert footer.finished


def test_total_computed_from_start_and_end_when_its_line_is_missing():
    text = " Start time : 2025-06-14 23:59:50\n End time   : 2025-06-15 00:01:05\n"
    assert parse_footer(text).total_time_s == 75


def test_job_killed_before_its_footer():
    footer = parse_footer(" Start time : 2025-06-14 09:00:02\nTraceback (most recent call last):\n")
    assert footer.start_time is not None
    assert not footer.finished and footer.total_time_s is None


def test_garbled_footer_lines_are_counted():
    footer = parse_footer(" Total time : 00:6x:10\n End time   : 2025-13-45 99:00:00\n")
    assert footer.total_time_s is None and footer.end_time is None
    assert footer.skipped_lines == 2
    assert [problem.line for problem in footer.problems] == [1, 2]
    assert "not YYYY-MM-DD HH:MM:SS" in footer.problems[1].reason and footer.problems[0].text == "Total time : 00:6x:10"


def test_total_time_past_a_day_and_one_that_is_not_a_time():
    assert parse_footer(" Total time : 26:00:01\n").total_time_s == 26 * 3600 + 1
    assert parse_footer(" Total time : 1-02:00:00\n").total_time_text == "26:00:00"
    footer = parse_footer(" Total time : 00:61:00\n")
    assert footer.total_time_s is None and footer.skipped_lines == 1


def test_exit_status_is_the_last_attempts_and_only_a_whole_footer_line():
    requeued = (" Exit status: 3\n===\n Start time : 2025-06-14 09:00:02\n"
                "0: error: the trainer's exit status: 7\n Exit status: 0\n")
    assert parse_footer(requeued).exit_status == 0
    assert parse_footer("1: Exit status : 12\n").exit_status == 12  # a launcher prefix is not part of the line
    killed = parse_footer(" Start time : 2025-06-14 09:00:02\nExit status: unknown\n")
    assert killed.exit_status is None and killed.skipped_lines == 0
