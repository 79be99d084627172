"""The memory calculator as a reader meets it: the built page in headless Chromium, driven over CDP.

Only what the page needs is built: a Jupyter Book build of the calculator page alone (the project's own
_config.yml and its Sphinx hook, a one-page table of contents; a few seconds), served on 127.0.0.1. The test
waits for Pyodide to load the workshop's modules, changes inputs as a reader would, and reads back the numbers,
the fit verdicts, the closest measured run and the linter's messages; each must be what the same Python
(CPython here) computes for the same form values. Screenshots land in _build/screenshots/.
"""

from __future__ import annotations

import functools
import http.server
import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from browser_cdp import Browser
from repo_paths import REPO

from workshop_lib.book.calculator.measured_runs import page_data
from workshop_lib.book.calculator.page import Calculator

pytestmark = pytest.mark.slow

ROOT = REPO
SCREENSHOT_DIR = ROOT / "_build" / "screenshots"
CALCULATOR = "_static/memory-calculator/calculator.html"
IFRAME_DOC = "document.querySelector('iframe.memory-calculator').contentDocument"
READY = "(%s) && ['ready', 'refused', 'failed'].includes((%s).getElementById('calculator')?.dataset.state)"


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    pytest.skip("no Chromium on PATH (Debian: apt-get install chromium)")


class Site(str):
    """The served book's address (a str, for f-strings), with the folder it is served from."""

    def __new__(cls, url: str, html_dir: Path):
        site = super().__new__(cls, url)
        site.html_dir = html_dir
        return site


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    """Serves the built book with the types browsers insist on for ES modules and WebAssembly."""

    extensions_map = {".mjs": "text/javascript", ".js": "text/javascript", ".wasm": "application/wasm",
                      ".json": "application/json", ".css": "text/css", ".html": "text/html"}

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The calculator page built by Jupyter Book with the project's config, served over HTTP."""
    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    if not jupyter_book.exists():
        pytest.skip("jupyter-book is not installed (make setup)")
    folder = tmp_path_factory.mktemp("calculator-book")
    toc = folder / "toc.yml"
    toc.write_text("format: jb-book\nroot: book/memory_calculator\n")
    build = subprocess.run([str(jupyter_book), "build", str(ROOT), "--toc", str(toc), "--path-output", str(folder),
                            "-W"], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, f"the calculator page did not build:\n{build.stdout[-3000:]}\n{build.stderr[-3000:]}"
    html = folder / "_build" / "html"
    handler = functools.partial(_QuietHandler, directory=str(html))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield Site(f"http://127.0.0.1:{server.server_address[1]}", html)
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser():
    driver = Browser(_chromium())
    yield driver
    driver.close()


@pytest.fixture(scope="module")
def expected():
    """The calculator run by CPython on the data the build wrote: what the page must show."""
    return Calculator(page_data())


def _open(browser: Browser, url: str, doc: str = "document", allow_failure: bool = False) -> None:
    browser.navigate(url)
    browser.wait_for(READY % (doc, doc), timeout=90, what=f"the calculator at {url} to start")
    state = browser.evaluate(f"({doc}).getElementById('calculator').dataset.state")
    assert allow_failure or state != "failed", browser.evaluate(f"({doc}).getElementById('status').textContent")


def _set(browser: Browser, values: dict, doc: str = "document") -> None:
    """Set form fields and fire the change event, as a reader's edits do."""
    browser.evaluate(f"""(() => {{
        const form = ({doc}).getElementById('form');
        for (const [name, value] of Object.entries({json.dumps(values)})) {{
            const input = form.elements[name];
            if (input.type === 'checkbox') input.checked = value; else input.value = String(value);
        }}
        form.dispatchEvent(new Event('change'));
        return true; }})()""")


def _shown(browser: Browser, doc: str = "document") -> dict:
    return browser.evaluate(f"""(() => {{
        const doc = {doc};
        const form = doc.getElementById('form');
        return {{
            state: doc.getElementById('calculator').dataset.state,
            values: Object.fromEntries([...form.elements].filter(e => e.name).map(e =>
                [e.name, e.type === 'checkbox' ? e.checked : e.value])),
            total: doc.querySelector('[data-value="gpu-total-row"]')?.textContent,
            heading_total: doc.querySelector('[data-value="gpu-total"]')?.textContent,
            parts: [...doc.querySelectorAll('#breakdown tr[data-part-row]')].map(r => [r.dataset.partRow, r.cells[1].textContent]),
            bars: [...doc.querySelectorAll('#gpu-bar .segment')].map(s => s.dataset.part),
            verdicts: [...doc.querySelectorAll('#verdicts li')].map(li => [li.dataset.card, li.dataset.fits === 'true']),
            host: doc.getElementById('host-text').dataset.value,
            host_text: doc.getElementById('host-text').textContent,
            problems: [...doc.querySelectorAll('#problems li')].map(li => [li.dataset.source, li.querySelector('.message').textContent]),
            problems_shown: !doc.getElementById('problems').hidden,
            results_shown: !doc.getElementById('results').hidden,
            reference: doc.querySelector('[data-value="reference-id"]')?.textContent || null,
            exact: doc.getElementById('reference').dataset.exact === 'true',
            measured: [...doc.querySelectorAll('#reference tr[data-measured]')].map(r => [r.dataset.measured, r.cells[1].textContent]),
            presets: [...doc.querySelectorAll('#preset option')].map(o => o.value),
            text: doc.body.innerText,
        }}; }})()""")


def _assert_matches(shown: dict, result: dict) -> None:
    """What the page shows is what Python computed for the same values, to the last digit."""
    assert shown["problems"] == [[p["source"], p["message"]] for p in result["problems"]]
    assert "NaN" not in shown["text"] and "undefined" not in shown["text"]
    if not result["ok"]:
        assert shown["state"] == "refused" and shown["problems_shown"] and not shown["results_shown"]
        return
    assert shown["state"] == "ready" and shown["results_shown"]
    assert shown["total"] == shown["heading_total"] == result["gpu"]["total_gib"]
    assert shown["parts"] == [[p["part"], p["gib"]] for p in result["gpu"]["parts"]]
    assert shown["bars"] == [p["part"] for p in result["gpu"]["parts"]]
    assert shown["verdicts"] == [[v["card"], v["fits"]] for v in result["fits"]]
    assert shown["host"] == result["host"]["per_node_gib"] and shown["host_text"] == result["host"]["text"]
    reference = result["reference"]
    assert shown["reference"] == (reference["id"] if reference["found"] else None)
    assert shown["exact"] == bool(reference.get("exact"))
    if reference["found"]:
        measured = [[row["what"], f"{row['gib']} GiB"] for row in reference["measured"]]
        assert shown["measured"][:len(measured)] == measured


def test_the_book_page_runs_the_estimator_in_the_page(site, browser, expected):
    _open(browser, f"{site}/book/memory_calculator.html", IFRAME_DOC)
    shown = _shown(browser, IFRAME_DOC)
    _assert_matches(shown, expected.calculate({}))  # the form's defaults
    every_run = [run["id"] for chapter in expected.chapters.values() for run in chapter["experiments"]]
    assert shown["presets"] == [""] + every_run
    # The book's embed.js sizes the iframe to the calculator's content (no box scrolling inside the page).
    browser.wait_for("document.querySelector('iframe.memory-calculator').style.height !== '900px'", timeout=10)
    browser.evaluate("document.querySelector('iframe.memory-calculator').scrollIntoView()")
    browser.screenshot(SCREENSHOT_DIR / "memory_calculator_book_page.png")
    # A run picked from the list loads its layout.
    browser.evaluate(f"(() => {{ const select = ({IFRAME_DOC}).getElementById('preset');"
                     " select.value = 'fsdp/strategies/full-shard-offload';"
                     " select.dispatchEvent(new Event('change')); return true; })()")
    shown = _shown(browser, IFRAME_DOC)
    assert shown["reference"] == "fsdp/strategies/full-shard-offload" and shown["exact"]
    _assert_matches(shown, expected.calculate(shown["values"]))


def test_a_book_built_without_pyodide_says_how_to_install_it(site, browser):
    shipped = site.html_dir / "_static" / "memory-calculator"
    bare = site.html_dir / "_static" / "memory-calculator-without-pyodide"
    shutil.copytree(shipped, bare, ignore=shutil.ignore_patterns("pyodide"), dirs_exist_ok=True)
    _open(browser, f"{site}/_static/memory-calculator-without-pyodide/calculator.html", allow_failure=True)
    assert browser.evaluate("document.getElementById('calculator').dataset.state") == "failed"
    assert "run `npm ci`" in browser.evaluate("document.getElementById('status').textContent")


def test_opened_from_disk_it_says_how_to_serve_the_book(site, browser):
    browser.navigate((site.html_dir / CALCULATOR).as_uri())
    browser.wait_for(READY % ("document", "document"), timeout=30)
    assert browser.evaluate("document.getElementById('calculator').dataset.state") == "failed"
    assert "python -m http.server -d _build/html" in browser.evaluate("document.getElementById('status').textContent")


# Three layouts a reader tries: one that fits everywhere, one that fits only an H200, one that fits nothing,
# across the four methods.
CHANGES = [
    {"model": "bloom-560m", "engine": "deepspeed", "zero_stage": "3", "offload": "parameters", "gpus_per_node": 2,
     "batch": 4, "seq_len": 512, "precision": "fp16"},
    {"model": "llama-3.1-8b", "engine": "megatron", "tensor_parallel": 2, "pipeline_parallel": 1,
     "expert_parallel": 1, "gpus_per_node": 2, "batch": 1, "seq_len": 2048, "precision": "bf16", "lora_rank": 0,
     "distributed_optimizer": False, "micro_batches": 8},
    {"model": "llama-3.1-8b", "engine": "ddp", "gpus_per_node": 1, "lora_rank": 0, "batch": 1, "seq_len": 2048},
    {"model": "mixtral-8x7b", "engine": "megatron", "nodes": 2, "gpus_per_node": 8, "tensor_parallel": 2,
     "pipeline_parallel": 4, "expert_parallel": 2, "sequence_parallel": True, "micro_batches": 4, "lora_rank": 0,
     "distributed_optimizer": True},
    {"model": "gpt", "engine": "fsdp", "fsdp": "HYBRID_SHARD", "fsdp_offload": True, "nodes": 2, "gpus_per_node": 2,
     "batch": 1, "seq_len": 512, "precision": "fp16", "lora_rank": 0},
]


def test_changed_inputs_show_the_estimators_numbers_and_verdicts(site, browser, expected):
    _open(browser, f"{site}/{CALCULATOR}")
    verdicts_seen = set()
    for number, change in enumerate(CHANGES):
        _set(browser, change)
        shown = _shown(browser)
        result = expected.calculate(shown["values"])
        assert result["ok"], result["problems"]
        _assert_matches(shown, result)
        verdicts_seen.add(tuple(fits for _, fits in shown["verdicts"]))
        if number == 0:
            browser.screenshot(SCREENSHOT_DIR / "memory_calculator_zero3_offload.png")
    # The verdicts really change with the layout: fits everywhere, only on the H200, nowhere.
    assert {(True, True, True), (False, False, True), (False, False, False)} <= verdicts_seen


def test_the_closest_measured_run_is_marked_and_loads(site, browser, expected):
    _open(browser, f"{site}/{CALCULATOR}?chapter=3&experiment=zero/two-gpus/zero2")
    shown = _shown(browser)
    assert shown["reference"] == "zero/two-gpus/zero2" and shown["exact"]
    _assert_matches(shown, expected.calculate(shown["values"]))
    _set(browser, {"gpus_per_node": 8})  # not measured: the closest run is named, with what differs
    shown = _shown(browser)
    result = expected.calculate(shown["values"])
    closest = result["reference"]
    assert not shown["exact"] and f"GPUs per node: 8 here, {closest['inputs']['gpus_per_node']} in the run" in shown["text"]
    _assert_matches(shown, result)
    browser.evaluate("document.getElementById('load-reference').click()")
    shown = _shown(browser)
    assert shown["exact"] and shown["reference"] == closest["id"]
    assert shown["values"]["gpus_per_node"] == str(closest["inputs"]["gpus_per_node"])


BAD_INPUTS = [
    ({"model": "llama-3.1-8b", "engine": "ddp", "gpus_per_node": 0}, "gpus=0 must be at least 1"),
    ({"model": "llama-3.1-8b", "engine": "megatron", "gpus_per_node": 3, "tensor_parallel": 3,
      "expert_parallel": 1, "pipeline_parallel": 1}, "TP=3 does not divide llama-3.1-8b's 32 attention heads"),
    ({"model": "mixtral-8x7b", "engine": "megatron", "gpus_per_node": 6, "tensor_parallel": 1,
      "expert_parallel": 3, "pipeline_parallel": 1}, "EP=3 does not divide mixtral-8x7b's 8 experts"),
]


def test_bad_input_shows_the_linters_message_not_a_blank(site, browser, expected):
    _open(browser, f"{site}/{CALCULATOR}")
    # Typed as a reader types: focus the field, select its text, type.
    browser.evaluate("(() => { const input = document.getElementById('form').elements['gpus_per_node'];"
                     " input.focus(); input.select(); return true; })()")
    browser.send("Input.insertText", text="0")
    browser.wait_for("document.getElementById('calculator').dataset.state === 'refused'", timeout=10)
    for number, (change, message) in enumerate(BAD_INPUTS):
        if number:
            _set(browser, change)
        shown = _shown(browser)
        result = expected.calculate(shown["values"])
        assert not result["ok"]
        assert any(message in text for _, text in shown["problems"]), (message, shown["problems"])
        _assert_matches(shown, result)
        if number == 1:
            browser.screenshot(SCREENSHOT_DIR / "memory_calculator_bad_tp.png")
    _set(browser, {"gpus_per_node": "abc"})
    assert "is not a whole number" in _shown(browser)["problems"][0][1]


@pytest.mark.parametrize("chapter, experiment", [("1", "lora/mixtral/2-gpus"), ("2", "model-parallel/llama/tp4"),
                                                 ("3", "zero/single-gpu/zero2-offload"),
                                                 ("4", "fsdp/strategies/shard-grad-op")])
def test_each_chapter_opens_the_calculator_on_its_runs(site, browser, expected, chapter, experiment):
    _open(browser, f"{site}/{CALCULATOR}?chapter={chapter}&experiment={experiment}")
    shown = _shown(browser)
    runs = expected.chapters[chapter]["experiments"]
    assert shown["presets"] == [run["id"] for run in runs]
    inputs = next(run["inputs"] for run in runs if run["id"] == experiment)
    result = expected.calculate(inputs)
    assert result["inputs"] == expected.calculate(shown["values"])["inputs"]
    _assert_matches(shown, result)
    browser.screenshot(SCREENSHOT_DIR / f"memory_calculator_chapter{chapter}.png")
