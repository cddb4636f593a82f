"""A headless Chromium driven over the DevTools protocol: open a page, wait until a script
says it is drawn, take a screenshot. The dashboard's test and ``make demo`` use it.

Only the few protocol calls they need, over the ``websockets`` client uvicorn already brings
(no Selenium, no driver download: Debian's ``chromium`` package is all it takes).
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect

from clipstream.errors import ClipstreamError

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """The path of a Chromium (or Chrome) binary, or None."""
    return next((p for p in map(shutil.which, CANDIDATES) if p), None)


class Browser:
    """``with Browser() as b: b.open(url); b.wait_for(js); b.screenshot(path)``."""

    def __init__(self, width: int = 1500, height: int = 1150, binary: str | None = None) -> None:
        self.binary = binary or find_chromium()
        if self.binary is None:
            raise ClipstreamError("no chromium found (Debian/Ubuntu: apt-get install chromium)")
        self.width, self.height = width, height
        self.profile = tempfile.mkdtemp(prefix="clipstream-chromium-")
        self.proc: subprocess.Popen[bytes] | None = None
        self.ws: ClientConnection | None = None
        self._ids = itertools.count(1)
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> Browser:
        self.proc = subprocess.Popen(
            [self.binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--no-default-browser-check", "--hide-scrollbars", "--mute-audio",
             f"--window-size={self.width},{self.height}", "--remote-debugging-port=0",
             f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise ClipstreamError("chromium did not open its DevTools port")
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            pages = [t for t in json.loads(r.read()) if t.get("type") == "page"]
        self.ws = self._stack.enter_context(connect(pages[0]["webSocketDebuggerUrl"], max_size=64 << 20,
                                                    open_timeout=10))
        self.call("Page.enable")
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._stack.close()
        self.ws = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.profile, ignore_errors=True)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """One protocol command; its result (events that arrive meanwhile are skipped)."""
        assert self.ws is not None, "use the browser in a with block"
        call_id = next(self._ids)
        self.ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv(timeout=60))
            if message.get("id") == call_id:
                if "error" in message:
                    raise ClipstreamError(f"{method}: {message['error']}")
                return message.get("result", {})

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-serialisable)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise ClipstreamError(f"script failed: {result['exceptionDetails']}")
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout_s: float = 60.0) -> Any:
        """Evaluate ``expression`` until it is truthy (returned); ClipstreamError at the deadline."""
        deadline = time.monotonic() + timeout_s
        value = None
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(expression)
            except ClipstreamError:  # the page is still loading
                value = None
            if value:
                return value
            time.sleep(0.2)
        raise ClipstreamError(f"the page did not satisfy {expression!r} within {timeout_s:g} s (last: {value!r})")

    def screenshot(self, path: Path) -> Path:
        """A PNG of the whole page."""
        size = self.evaluate("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
        width, height = (int(v) for v in size) if size else (self.width, self.height)
        self.call("Emulation.setDeviceMetricsOverride", width=max(width, self.width),
                  height=max(height, 200), deviceScaleFactor=1, mobile=False)
        # two animation frames: the resized layout is painted before the capture
        self.call("Runtime.evaluate", awaitPromise=True,
                  expression="new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path


# the dashboard's panels that hold data whenever the pipeline answers queries
DRAWN_PANELS = ("throughput", "latency", "outcomes", "batch_size", "queue", "cache", "weights", "breakdown",
                "admission")


def panel_points_js(panels: tuple[str, ...] = DRAWN_PANELS) -> str:
    """A script returning each panel's drawn data-point count when every one has some, else null."""
    ids = json.dumps(list(panels))
    return (f"(() => {{ const out = {{}}; for (const id of {ids}) {{ const el = document.getElementById('panel-' + id);"
            " const n = el ? Number(el.dataset.points) : 0; if (!n || !el.querySelector('canvas')) return null;"
            " out[id] = n; } return out; })()")
