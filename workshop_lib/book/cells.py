"""The rule for one measured cell of a results table, shared by the seeds' tables (`tables`) and the
predicted-vs-measured table (`predictions`), so neither imports the other.

A run that did not complete shows its state (MISSING, FAILED, TIMEOUT, …) in every measured cell; a value a
completed run did not record shows as "n/a". Nothing is ever shown as 0.
"""

from __future__ import annotations

import pandas as pd

from workshop_lib.results import COMPLETED

NOT_RECORDED = "n/a"


def is_missing(value) -> bool:
    """True for None and NaN (a gap pandas left in a column)."""
    return value is None or (isinstance(value, float) and pd.isna(value))


def format_cell(value) -> str:
    """Numbers as a reader wants them: whole numbers without ".0", others to 5 significant digits."""
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.1f}" if abs(value) >= 1000 else f"{value:.5g}"


def completed(record: dict) -> bool:
    return record.get("state") == COMPLETED


def measured_cell(record: dict, value):
    """The value, or the run's state when it did not complete, or n/a when it was not recorded."""
    if not completed(record):
        return record.get("state")
    if is_missing(value):
        return NOT_RECORDED
    return value


__all__ = ["NOT_RECORDED", "completed", "format_cell", "is_missing", "measured_cell"]
