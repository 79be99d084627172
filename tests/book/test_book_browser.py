"""The built book as a reader sees it: headless Chromium opens each chapter page after the chapters ran.

Each chapter page must show its result tables filled with numbers and at least one plot image, and the
sidebar must list every chapter. A screenshot of each chapter page is kept in _build/screenshots/ (CI
keeps it as an artifact).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import pytest
from book_fixtures import SCREENSHOT_DIR, built_book, executed_chapters  # noqa: F401  (session fixtures)

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

CHAPTERS = ("01_data_parallel_lora", "02_model_parallel", "03_deepspeed_zero", "04_fsdp")
NUMBER = re.compile(r"^-?\d+(\.\d+)?(e-?\d+)?$|^\d{2}:\d{2}:\d{2}$")
# What a cell shows instead of a number when its run did not complete (workshop_lib.book.tables).
STATES = {"MISSING", "FAILED", "TIMEOUT", "CANCELLED", "INCOMPLETE", "NOT SUBMITTED", "UNKNOWN", "OUT_OF_MEMORY",
          "NODE_FAIL", "PENDING", "RUNNING"}
# Tall enough for a whole chapter page, tables and plots included.
WINDOW = "--window-size=1280,16000"


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("no Chromium on PATH (Debian: apt-get install chromium)")


def _browser(*arguments: str, timeout: int = 120) -> subprocess.CompletedProcess:
    profile = tempfile.mkdtemp(prefix="workshop-chromium-")
    try:
        command = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                   "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
                   *arguments]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    finally:
        shutil.rmtree(profile, ignore_errors=True)


class PageParser(HTMLParser):
    """Collects the cells of each result table, the images of the main content and the sidebar links."""

    def __init__(self):
        super().__init__()
        self.tables: list[list[str]] = []
        self.images: list[str] = []
        self.sidebar_links: list[str] = []
        self._in_table = False
        self._in_cell = False
        self._cell = ""
        self._nav_depth = 0

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        classes = (attributes.get("class") or "").split()
        if tag == "table" and "workshop-table" in classes:
            self._in_table = True
            self.tables.append([])
        elif tag == "td" and self._in_table:
            self._in_cell, self._cell = True, ""
        elif tag == "img":
            self.images.append(attributes.get("src") or "")
        elif tag == "nav" and ("bd-docs-nav" in classes or self._nav_depth):
            self._nav_depth += 1
        elif tag == "a" and self._nav_depth:
            self.sidebar_links.append(attributes.get("href") or "")

    def handle_endtag(self, tag):
        if tag == "td" and self._in_cell:
            self.tables[-1].append(self._cell.strip())
            self._in_cell = False
        elif tag == "table" and self._in_table:
            self._in_table = False
        elif tag == "nav" and self._nav_depth:
            self._nav_depth -= 1

    def handle_data(self, data):
        if self._in_cell:
            self._cell += data


def _page(stem: str, html_dir: Path) -> Path:
    page = html_dir / "notebooks" / f"{stem}.html"
    assert page.is_file(), f"the book has no page for {stem}"
    return page


def test_chapter_pages_show_filled_tables_plots_and_the_sidebar(built_book):
    for stem in CHAPTERS:
        page = _page(stem, built_book.html_dir)
        result = _browser("--dump-dom", page.as_uri())
        assert result.returncode == 0, f"chromium failed on {page}: {result.stderr[-2000:]}"
        parsed = PageParser()
        parsed.feed(result.stdout)
        assert parsed.tables, f"{stem}: no result table on the page"
        for cells in parsed.tables:
            numbers = [cell for cell in cells if NUMBER.match(cell)]
            assert numbers, f"{stem}: a result table without a single number: {cells[:20]}"
            states = sorted({cell for cell in cells if cell in STATES})
            assert not states, f"{stem}: a result table shows runs that did not complete: {states}"
        plots = [src for src in parsed.images if src.endswith(".png") or src.startswith("data:image/png")]
        assert plots, f"{stem}: no plot image on the page"
        for src in plots:
            if not src.startswith("data:"):
                image = (page.parent / src).resolve()
                assert image.is_file() and image.stat().st_size > 1000, f"{stem}: plot {src} is missing or empty"
        linked = {Path(href.split("#")[0]).stem for href in parsed.sidebar_links}
        # The current page is in the sidebar too (Sphinx links it as "#" or its own file name).
        missing = [other for other in CHAPTERS if other not in linked and other != stem]
        assert not missing, f"{stem}: the sidebar does not list {missing}"


def test_screenshot_of_each_chapter_page(built_book):
    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
    for stem in CHAPTERS:
        page = _page(stem, built_book.html_dir)
        target = SCREENSHOT_DIR / f"{stem}.png"
        target.unlink(missing_ok=True)
        result = _browser(f"--screenshot={target}", WINDOW, "--hide-scrollbars",
                          page.as_uri())
        assert result.returncode == 0, f"chromium failed on {page}: {result.stderr[-2000:]}"
        assert target.is_file() and target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"no screenshot of {stem}"
        assert target.stat().st_size > 20_000, f"the screenshot of {stem} looks blank"
