"""Reading log files the way the parsers need them: never failing on bad bytes or progress bars."""

from __future__ import annotations

import math
import re
from pathlib import Path

# tqdm redraws its bar with carriage returns; each redraw is a line of its own for us.
_LINE_BREAKS = re.compile(r"\r\n|\r|\n")


def read_text(path: str | Path) -> str:
    """The file's text; undecodable bytes (a log cut mid-character, binary junk) become U+FFFD."""
    return Path(path).read_bytes().decode("utf-8", errors="replace")


def split_lines(text: str) -> list[str]:
    """Lines of a log, treating the carriage returns of progress bars as line breaks."""
    return _LINE_BREAKS.split(text)


def to_float(value: object) -> float | None:
    """A finite or infinite float from a number or numeric string; None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return None
        return number
    return None


def is_number(value: float | None) -> bool:
    """True for a real, finite number."""
    return value is not None and math.isfinite(value)
