"""The demo's dashboard: its history kept from the start, and a screenshot at the end.

The gateway's dashboard scrapes the stages only while someone asks for its data, so the demo
asks every half minute from the start; the screenshot at the end then shows the whole run,
the degraded model's weight falling and coming back after the rollback included.
"""

from __future__ import annotations

import threading
import urllib.request
from pathlib import Path

from clipstream.errors import ClipstreamError
from clipstream.testing.browser import DRAWN_PANELS, Browser, find_chromium, panel_points_js

KEEP_EVERY_S = 30.0


def keep_history(dashboard_url: str, stop: threading.Event) -> threading.Thread:
    """Ask for the dashboard's data now and every ``KEEP_EVERY_S`` until ``stop``."""
    def ask() -> None:
        while True:
            try:
                with urllib.request.urlopen(dashboard_url + "/data", timeout=10) as answer:
                    answer.read()
            except OSError:
                pass  # the page will show the gap; the demo goes on
            if stop.wait(KEEP_EVERY_S):
                return

    thread = threading.Thread(target=ask, name="dashboard history", daemon=True)
    thread.start()
    return thread


def screenshot(dashboard_url: str, path: Path) -> Path | None:
    """A PNG of the dashboard once its panels are drawn; None when no Chromium is installed."""
    if find_chromium() is None:
        return None
    with Browser() as browser:
        browser.open(dashboard_url)
        try:
            browser.wait_for(panel_points_js(DRAWN_PANELS), timeout_s=60)
        except ClipstreamError:
            pass  # a panel without data is still worth the picture
        return browser.screenshot(path)
