"""The book's cell rules (workshop_lib.book.cells): one rule for a missing value, one way to write a number."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from workshop_lib.book.cells import is_missing


@pytest.mark.parametrize("value", [None, math.nan, np.float32("nan"), np.float64("nan"), pd.NA, pd.NaT])
def test_every_gap_pandas_leaves_is_missing(value):
    assert is_missing(value)


@pytest.mark.parametrize("value", [0, 0.0, "", "n/a", "FAILED", False, np.int64(0), {"max_steps": None}, [None]])
def test_a_value_a_run_recorded_is_not_missing(value):
    assert not is_missing(value)
