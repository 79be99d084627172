"""The rules for one cell of what a chapter shows, shared by the seeds' tables (`tables`), the
predicted-vs-measured table (`predictions`), the page's HTML, the claims and the time plan: what counts as
missing (`is_missing`), what a measured cell holds (`measured_cell`) and how a number is written (`format_cell`).

A run that did not complete shows its state (MISSING, FAILED, TIMEOUT, …) in every measured cell; a value a
completed run did not record shows as "n/a". Nothing is ever shown as 0.
"""

from __future__ import annotations

import pandas as pd

from workshop_lib.results import COMPLETED

NOT_RECORDED = "n/a"


def is_missing(value) -> bool:
    """True for None and for a value pandas counts as missing (NaN, NaT, pd.NA: a gap it left in a column).
    The one rule every table, caption, sentence and plan of the book applies to a value a run may lack."""
    return value is None or (pd.api.types.is_scalar(value) and bool(pd.isna(value)))


def format_cell(value) -> str:
    """Numbers as a reader wants them: whole numbers without ".0", others to 5 significant digits."""
    if is_missing(value):
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
