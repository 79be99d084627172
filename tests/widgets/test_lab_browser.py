"""A participant's path in a real JupyterLab, driven by headless Chromium (DevTools protocol).

JupyterLab opens chapter 1's jupytext .py as a notebook (the jupytext viewer `make setup` registers), the
participant sets the parameters cell to two experiments, runs every cell, and the jobs run on the tiny profile
against the local SLURM cluster. The test sees what the participant sees: the job monitor widget rendered by
the submit cell (live, fed by the waiter) and then the chapter's table of their own runs filled with numbers.
Screenshots of both land in _build/screenshots/ (CI keeps them).
"""

from __future__ import annotations

import json
import re
import shutil

import pytest
from book_fixtures import ROOT, SCREENSHOT_DIR

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

CHAPTER = ROOT / "notebooks" / "01_data_parallel_lora.py"
EXPERIMENTS = ["lora/llama/1-gpu", "lora/llama/2-gpus"]
PARAMETERS = (f'profile = "tiny"\nexperiments = {json.dumps(EXPERIMENTS)}\nwait_timeout_s = 600\nruns_dir = None\n')
MONITOR = ".workshop-job-monitor"
YOUR_TABLE = ".workshop-participant table.workshop-table"
STATES = {"MISSING", "FAILED", "TIMEOUT", "CANCELLED", "INCOMPLETE", "NOT SUBMITTED", "UNKNOWN", "PENDING", "RUNNING"}


def _set_parameters(page, source: str) -> int:
    """Replace the parameters cell's text in the open notebook, as a participant edits it; returns its index."""
    from workshop_lib.widgets.screenshot import NOTEBOOK_PANEL

    return page.evaluate(f"""(() => {{
        const cells = {NOTEBOOK_PANEL}.content.model.cells;
        for (let index = 0; index < cells.length; index++) {{
            const cell = cells.get(index);
            if ((cell.getMetadata('tags') || []).includes('parameters')) {{
                cell.sharedModel.setSource({json.dumps(source)});
                return index;
            }}
        }}
        return -1;
    }})()""")


def test_a_participant_runs_chapter_1_in_jupyterlab(local_cluster, tmp_path):
    from workshop_lib.widgets.screenshot import KERNEL_IDLE, capture, find_chromium, lab_page, open_notebook

    if find_chromium() is None:
        pytest.skip("no Chromium (Debian: apt-get install chromium)")
    shutil.copyfile(CHAPTER, tmp_path / CHAPTER.name)  # JupyterLab serves a copy: the checkout stays untouched
    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
    with lab_page(tmp_path, width=1400, height=1000, timeout=180) as (page, port):
        open_notebook(page, port, CHAPTER.name, timeout=180)
        assert page.evaluate("document.querySelector('.jp-NotebookPanel').innerText.includes('Chapter 1')")
        assert _set_parameters(page, PARAMETERS) >= 0, "the chapter has no parameters cell"
        page.evaluate("window.jupyterapp.shell.collapseLeft(); "
                      "window.jupyterapp.commands.execute('notebook:run-all-cells')")

        page.wait_for(f"!!document.querySelector('{MONITOR}')", 300, "the job monitor widget to render")
        page.wait_for(f"document.querySelector('{MONITOR}').innerText.includes('{EXPERIMENTS[-1]}')", 120,
                      "the job monitor to list the submitted jobs")
        capture(page, SCREENSHOT_DIR / "lab_job_monitor.png", MONITOR)

        page.wait_for(f"document.querySelectorAll('{YOUR_TABLE}').length > 0", 600,
                      "the chapter's table of the participant's runs")
        page.wait_for(KERNEL_IDLE, 300, "every cell to finish")
        monitor = page.evaluate(f"document.querySelector('{MONITOR}').innerText")
        assert monitor.count("COMPLETED") >= len(EXPERIMENTS), f"the monitor does not show both jobs ended:\n{monitor}"
        assert "updated at each poll of the waiting cell" in monitor, monitor  # fed by the waiter, no poller of its own
        cells = page.evaluate(f"Array.from(document.querySelector('{YOUR_TABLE}').querySelectorAll('td'))"
                              ".map(cell => cell.innerText.trim())")
        errors = page.evaluate("Array.from(document.querySelectorAll('.jp-OutputArea-output[data-mime-type="
                               "\"application/vnd.jupyter.error\"]')).map(output => output.innerText)")
        capture(page, SCREENSHOT_DIR / "lab_chapter_table.png", ".workshop-participant")
    assert not errors, f"a cell failed in JupyterLab:\n{errors[0][:3000]}"
    numbers = [cell for cell in cells if re.fullmatch(r"-?\d+(\.\d+)?|\d{2}:\d{2}:\d{2}", cell)]
    assert len(numbers) >= 2 * len(EXPERIMENTS), f"the table of your runs is not filled: {cells}"
    assert not STATES & set(cells), f"the table shows run states instead of numbers: {cells}"
    for name in ("lab_job_monitor.png", "lab_chapter_table.png"):
        image = SCREENSHOT_DIR / name
        assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and image.stat().st_size > 20_000, f"{name} looks blank"
