"""The one reading and writing of durations: SLURM's time format (`--time`, sacct's Elapsed,
scontrol's RunTime) and the `Total time : HH:MM:SS` line a job prints about itself."""

from __future__ import annotations

import re

NO_LIMIT = ("UNLIMITED", "INFINITE")
# [D-]H[:M[:S]] with every part a number; which parts a form has decides what a bare number means.
_FORM = re.compile(r"^(?:(?P<days>\d+)-)?(?P<parts>\d+(?::\d+){0,2})$")


def parse_duration(text: str | None, bare_unit: str = "minutes") -> float | None:
    """Seconds in a SLURM duration; None for no value or no limit (`UNLIMITED`, `INFINITE`).

    The forms are sbatch's: `M`, `M:S`, `H:M:S`, `D-H`, `D-H:M`, `D-H:M:S` (hours may pass 24, as in
    `Total time : 26:00:01`). A bare number is minutes for `--time` and seconds for sacct's ElapsedRaw
    (`bare_unit="seconds"`). Raises ValueError, naming the text and the forms, for anything else.
    """
    if text is None or not text.strip() or text.strip().upper() in NO_LIMIT:
        return None
    match = _FORM.match(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a duration: use M, M:S, H:M:S, D-H, D-H:M or D-H:M:S")
    parts = [int(part) for part in match["parts"].split(":")]
    if match["days"] is not None:
        hours, minutes, seconds = (parts + [0, 0])[:3]
    elif len(parts) == 1:
        hours, minutes, seconds = (0, parts[0], 0) if bare_unit == "minutes" else (0, 0, parts[0])
    elif len(parts) == 2:
        hours, (minutes, seconds) = 0, parts
    else:
        hours, minutes, seconds = parts
    if len(parts) > 1 and (minutes > 59 or seconds > 59):
        raise ValueError(f"{text!r} is not a duration: minutes and seconds run from 00 to 59")
    return float((int(match["days"] or 0) * 24 + hours) * 3600 + minutes * 60 + seconds)


def format_duration(seconds: float) -> str:
    """`HH:MM:SS` (hours may pass 24), the form the seeds' tables use."""
    whole = int(round(seconds))
    return f"{whole // 3600:02d}:{whole % 3600 // 60:02d}:{whole % 60:02d}"
