"""psrecord logs (samples recorded here with psrecord 1.4)."""

from pathlib import Path

from workshop_lib.core.log_text import read_text
from workshop_lib.results.parse.psrecord import parse_psrecord, read_psrecord

SAMPLES = Path(__file__).parents[1] / "samples" / "psrecord"


def test_plain_log():
    log = read_psrecord(SAMPLES / "cpu_memory.txt")
    assert len(log.samples) == 18
    assert max(log.real_mib) == 262.461
    assert log.samples[0].elapsed_s == 0.0 and log.samples[-1].virtual_mib == 118.230
    assert log.skipped_lines == 0


def test_csv_log_with_io_columns():
    log = read_psrecord(SAMPLES / "cpu_memory_io.csv")
    assert len(log.samples) == 4 and log.samples[1].real_mib == 92.484375


def test_cut_and_garbled_lines():
    lines = read_text(SAMPLES / "cpu_memory.txt").splitlines()
    text = "\n".join([*lines[:5], "Attaching to process 6258", "   1.263  19.800  16", *lines[5:], "       4.541   "])
    log = parse_psrecord(text)
    assert len(log.samples) == 18 and log.skipped_lines == 3
