"""The book's cell rules (workshop_lib.book.pages.cells): one rule for a missing value, one way to write a number."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from workshop_lib.book.pages.cells import is_missing


@pytest.mark.parametrize("value", [None, math.nan, np.float32("nan"), np.float64("nan"), pd.NA, pd.NaT])
def test_every_gap_pandas_leaves_is_missing(value):
    assert is_missing(value)


@pytest.mark.parametrize("value", [0, 0.0, "", "n/a", "FAILED", False, np.int64(0), {"max_steps": None}, [None]])
def test_a_value_a_run_recorded_is_not_missing(value):
    assert not is_missing(value)


def test_workshop_collect_writes_numbers_as_the_chapter_page_does():
    """One formatter: the markdown of `workshop collect` and the page's HTML table show the same cell texts."""
    import re

    from workshop_lib.book.pages.html import table_html
    from workshop_lib.book.tables import Table, render_tables

    frame = pd.DataFrame({"Peak (MiB)": [6251.0, 8532.94, None], "Loss": [0.1234567, -0.0, 12.0],
                          "State": ["n/a", "FAILED", "COMPLETED"]})
    markdown = render_tables([Table("t", frame)], "md").splitlines()[-3:]
    page = [re.findall(r"<td>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", table_html(Table("t", frame)),
                                                                      re.S)]
    assert [line[2:-2].split(" | ") for line in markdown] == [
        ["6251", "0.12346", "n/a"], ["8532.9", "0", "FAILED"], ["", "12", "COMPLETED"]] == page
