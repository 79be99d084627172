"""A small Chrome DevTools Protocol client: headless Chromium a test can drive (navigate, run script, screenshot).

Chromium is started with --remote-debugging-port=0 and a fresh profile; the port it picked is read from the
profile's DevToolsActivePort file. One page target, one WebSocket (websocket-client), one command at a time.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import websocket

# Flags the other browser test uses too: no network of its own beyond the pages it is sent to.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
                  "--remote-debugging-port=0", "--remote-allow-origins=*")


class BrowserError(AssertionError):
    """The browser did not do what the test asked (a script raised, a wait ran out)."""


class Browser:
    def __init__(self, executable: str, width: int = 1280, height: int = 1800, timeout: float = 30.0):
        self.profile = Path(tempfile.mkdtemp(prefix="workshop-cdp-"))
        self.process = subprocess.Popen([executable, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}",
                                         f"--window-size={width},{height}", "about:blank"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.socket = None
        self._next_id = 0
        try:
            port = self._debugging_port(timeout)
            targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10).read())
            page = next(target for target in targets if target["type"] == "page")
            self.socket = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=timeout,
                                                      suppress_origin=True)
            self.send("Page.enable")
            self.send("Runtime.enable")
            self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                      mobile=False)
        except Exception:
            self.close()
            raise

    def _debugging_port(self, timeout: float) -> int:
        marker = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if marker.is_file() and marker.read_text().strip():
                return int(marker.read_text().split()[0])
            if self.process.poll() is not None:
                raise BrowserError(f"chromium exited with {self.process.returncode}: "
                                   f"{self.process.stderr.read().decode(errors='replace')[-2000:]}")
            time.sleep(0.1)
        raise BrowserError(f"chromium did not open its debugging port within {timeout:.0f} s")

    def send(self, method: str, **params) -> dict:
        self._next_id += 1
        self.socket.send(json.dumps({"id": self._next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == self._next_id:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error']}")
                return message.get("result", {})

    def evaluate(self, expression: str):
        """The value of a JavaScript expression in the page (promises awaited); a thrown error fails the test."""
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise BrowserError(f"{expression[:200]}: {details.get('exception', {}).get('description', details)}")
        return result["result"].get("value")

    def navigate(self, url: str) -> None:
        self.send("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete'", timeout=30)

    def wait_for(self, expression: str, timeout: float = 60.0, what: str = "") -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.evaluate(expression):
                    return
            except BrowserError:
                pass  # the page is between documents
            time.sleep(0.2)
        raise BrowserError(f"waited {timeout:.0f} s for {what or expression}")

    def screenshot(self, target: Path) -> Path:
        data = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=False)["data"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(base64.b64decode(data))
        return target

    def close(self) -> None:
        if self.socket is not None:
            self.socket.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stderr:
            self.process.stderr.close()
        shutil.rmtree(self.profile, ignore_errors=True)
