"""A screenshot of the experiment builder in JupyterLab under headless Chromium.

    python -m workshop_lib.widgets.screenshot [--output _build/screenshots/widget_builder.png]

Starts JupyterLab (no token, a free port, settings and runtime folders of its own) in a temporary folder
holding a one-cell notebook that shows the builder, opens it in headless Chromium, runs the cell through
JupyterLab's own command (``notebook:run-all-cells``, over the DevTools protocol), waits for the widget
and saves the page. Stops Chromium and JupyterLab (and so the kernel) before it returns.
Needs: Chromium ($CHROMIUM or chromium on PATH) and websocket-client (a jupyter_server dependency).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack, contextmanager
from pathlib import Path

from workshop_lib.core.errors import WorkshopError
from workshop_lib.core.paths import repository_root
from workshop_lib.widgets.builder import BUILDER_CLASS

DEFAULT_OUTPUT = Path("_build") / "screenshots" / "widget_builder.png"
NOTEBOOK_CELLS = [
    "# The experiment builder: change a control and watch the checks, the script and the estimate follow.\n"
    "from workshop_lib.widgets import ExperimentBuilder\n"
    "builder = ExperimentBuilder(chapter=3, profile='tiny').set(gpus=2, zero_stage=3, offload=True)\n"
    "builder",
]
INVALID_CHANGE = "builder.set(zero_stage=0).select_tab('estimate')"
# Quiet JupyterLab: no news toast, no update check over a closed network.
NOTEBOOK_PANEL = "Array.from(window.jupyterapp.shell.widgets('main')).find(w => w.sessionContext)"
KERNEL_IDLE = (f"(() => {{ const kernel = {NOTEBOOK_PANEL}.sessionContext.session?.kernel;"
               " return !!kernel && kernel.status === 'idle'; })()")
LAB_SETTINGS = {"@jupyterlab/apputils-extension/notification.jupyterlab-settings":
                {"fetchNews": "false", "checkForUpdates": False},
                # Every cell in the page, not only those scrolled into view: a test reads outputs anywhere.
                "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
                # A driven session edits cells (the parameters cell): nothing is written back to disk.
                "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False}}


def find_chromium() -> str | None:
    for candidate in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def take_screenshot(output: Path | str | None = None, width: int = 1400, height: int = 900,
                    timeout: float = 120.0, cells: list[str] | None = None,
                    invalid_output: Path | str | None = None) -> Path:
    """Save a PNG of the builder rendered in JupyterLab; returns its path.

    With ``invalid_output``, a second PNG shows the same widget after ``INVALID_CHANGE`` ran in the kernel.
    """
    output = Path(output) if output else repository_root() / DEFAULT_OUTPUT
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="workshop-screenshot-") as name:
        folder = Path(name)
        _write_notebook(folder / "builder.ipynb", cells or NOTEBOOK_CELLS)
        with lab_page(folder, width, height, timeout) as (page, port):
            open_notebook(page, port, "builder.ipynb", timeout)
            page.evaluate("window.jupyterapp.shell.collapseLeft(); window.jupyterapp.shell.collapseRight(); "
                          "window.jupyterapp.commands.execute('notebook:run-all-cells')")
            page.wait_for(f"!!document.querySelector('.{BUILDER_CLASS} .jupyter-widgets')", timeout,
                          "the builder widget to render")
            page.evaluate("window.jupyterapp.commands.execute('notebook:enter-command-mode')")
            time.sleep(1.5)  # fonts and the tab bar settle
            _capture(page, output)
            if invalid_output is not None:
                # The same live widget after a change made in the kernel: an invalid combination, estimate tab.
                page.evaluate(f"void {NOTEBOOK_PANEL}.sessionContext.session.kernel.requestExecute("
                              f"{{code: {json.dumps(INVALID_CHANGE)}}})")
                page.wait_for(f"document.querySelector('.{BUILDER_CLASS}').innerText.includes('offload-with-zero0')",
                              timeout, "the builder to show the validator's message")
                time.sleep(1.0)
                _capture(page, Path(invalid_output))
    return output


@contextmanager
def lab_page(folder: Path, width: int = 1400, height: int = 900, timeout: float = 120.0):
    """JupyterLab serving `folder` (runs in `folder`/runs) and a headless Chromium page to drive it: yields
    (page, port). Both are stopped, and with them the kernels, when the block ends."""
    chromium = find_chromium()
    if chromium is None:
        raise WorkshopError("no Chromium found: install it (Debian: apt-get install chromium) or set $CHROMIUM")
    with ExitStack() as stack:
        port = free_port()
        stack.enter_context(_jupyterlab(folder, port, timeout))
        browser = stack.enter_context(_chromium(chromium, folder / "chrome", width, height, timeout))
        page = stack.enter_context(_DevTools(_page_websocket(browser, timeout)))
        page.call("Page.enable")
        page.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        yield page, port


def open_notebook(page: "_DevTools", port: int, name: str, timeout: float = 120.0) -> None:
    """Open `name` (a path under the served folder) in JupyterLab and wait for its kernel to be idle."""
    page.call("Page.navigate", url=f"http://127.0.0.1:{port}/lab/tree/{name}")
    page.wait_for("!!(window.jupyterapp && document.querySelector('.jp-NotebookPanel .jp-Cell'))",
                  timeout, f"{name} to open in JupyterLab as a notebook")
    # Headless Chromium has no focus, so JupyterLab's "current" notebook stays unset: activate it by hand.
    page.evaluate(f"window.jupyterapp.shell.activateById({NOTEBOOK_PANEL}.id)")
    page.wait_for(KERNEL_IDLE, timeout, "the kernel to start")


def capture(page: "_DevTools", path: Path, selector: str | None = None) -> Path:
    """A PNG of the page, scrolled so that the first element matching `selector` is in the middle."""
    if selector:
        page.evaluate(f"document.querySelector({json.dumps(selector)}).scrollIntoView({{block: 'center'}})")
        time.sleep(0.5)
    _capture(page, path)
    return path


def _capture(page: "_DevTools", path: Path) -> None:
    shot = page.call("Page.captureScreenshot", format="png")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(base64.b64decode(shot["data"]))


def _write_notebook(path: Path, cells: list[str]) -> None:
    notebook = {
        "nbformat": 4, "nbformat_minor": 5,
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "cells": [{"cell_type": "code", "id": f"cell{index}", "metadata": {}, "execution_count": None,
                   "outputs": [], "source": source} for index, source in enumerate(cells)],
    }
    path.write_text(json.dumps(notebook, indent=1))


@contextmanager
def _jupyterlab(folder: Path, port: int, timeout: float):
    settings = folder / "lab-settings"
    for name, values in LAB_SETTINGS.items():
        (settings / name).parent.mkdir(parents=True, exist_ok=True)
        (settings / name).write_text(json.dumps(values))
    env = {**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(settings),
           "JUPYTERLAB_WORKSPACES_DIR": str(folder / "lab-workspaces"),
           "JUPYTER_RUNTIME_DIR": str(folder / "runtime"), "JUPYTER_CONFIG_DIR": str(folder / "config"),
           "WORKSHOP_RUNS_DIR": str(folder / "runs"), "WORKSHOP_ROOT": str(repository_root())}
    command = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
               "--ServerApp.token=", "--ServerApp.password=", "--ServerApp.disable_check_xsrf=True",
               f"--ServerApp.root_dir={folder}", "--LabApp.expose_app_in_browser=True",
               "--ServerApp.open_browser=False"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-root")
    log = open(folder / "jupyterlab.log", "w")
    process = subprocess.Popen(command, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        _wait(lambda: _http_ok(f"http://127.0.0.1:{port}/api/status"), timeout, "JupyterLab to start",
              process, folder / "jupyterlab.log")
        yield process
    finally:
        _stop(process)  # SIGTERM: the server shuts its kernels down first
        log.close()


@contextmanager
def _chromium(executable: str, profile_dir: Path, width: int, height: int, timeout: float):
    profile_dir.mkdir(parents=True, exist_ok=True)
    command = [executable, "--headless", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
               f"--user-data-dir={profile_dir}", "--remote-debugging-port=0", f"--window-size={width},{height}",
               "about:blank"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.insert(1, "--no-sandbox")
    log = open(profile_dir.parent / "chromium.log", "w")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        active = profile_dir / "DevToolsActivePort"
        _wait(lambda: active.is_file() and len(active.read_text().split()) >= 1, timeout, "Chromium to start",
              process, profile_dir.parent / "chromium.log")
        yield int(active.read_text().split()[0])
    finally:
        _stop(process)
        log.close()


def _page_websocket(port: int, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as answer:
            pages = [target for target in json.load(answer) if target.get("type") == "page"]
        if pages:
            return pages[0]["webSocketDebuggerUrl"]
        time.sleep(0.2)
    raise WorkshopError("Chromium opened no page to drive")


class _DevTools:
    """The few DevTools-protocol calls this needs, over websocket-client."""

    def __init__(self, url: str):
        self.url = url
        self.next_id = 0

    def __enter__(self):
        import websocket

        self.socket = websocket.create_connection(self.url, timeout=60, suppress_origin=True)
        return self

    def __exit__(self, *_):
        self.socket.close()

    def call(self, method: str, **params) -> dict:
        self.next_id += 1
        self.socket.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise WorkshopError(f"DevTools {method} failed: {message['error']}")
                return message.get("result", {})

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=False)
        if "exceptionDetails" in result:
            raise WorkshopError(f"page script failed: {result['exceptionDetails'].get('text')}: {expression}")
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.evaluate(expression):
                return
            time.sleep(0.5)
        raise WorkshopError(f"gave up after {timeout:.0f} s waiting for {what}")


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


def _wait(condition, timeout: float, what: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        if process.poll() is not None:
            raise WorkshopError(f"{what}: the process exited ({process.returncode}); its log:\n"
                                + log.read_text(errors="replace")[-3000:])
        time.sleep(0.25)
    raise WorkshopError(f"gave up after {timeout:.0f} s waiting for {what}")


def _stop(process: subprocess.Popen, timeout: float = 15.0) -> None:
    """SIGTERM, then SIGKILL, to the process group this module started (its session leader's id)."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout)
    try:  # children left behind (a kernel, Chromium's helpers) share the group this module made
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=None, help=f"PNG path (default: <repository>/{DEFAULT_OUTPUT})")
    parser.add_argument("--timeout", type=float, default=120.0)
    arguments = parser.parse_args(argv)
    output = arguments.output or repository_root() / DEFAULT_OUTPUT
    invalid = output.with_name(output.stem + "_invalid.png")
    take_screenshot(output, timeout=arguments.timeout, invalid_output=invalid)
    print(output)
    print(invalid)
    return 0


if __name__ == "__main__":
    sys.exit(main())
