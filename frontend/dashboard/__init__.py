"""``/dashboard``: a live page of the pipeline, served by the gateway from the stages' metrics.

A thread scrapes every stage's /metrics once a second, the targets read from the Prometheus
file_sd JSON that ``clipstream up`` writes (``CLIPSTREAM_METRICS_TARGETS``; without it, only
this gateway's own families), and keeps the last minutes as time series
(``frontend.dashboard.series``). The page (static HTML and uPlot, served from the package, so
it works offline) polls ``/dashboard/data``. The page and its scripts hold no data and are
served without an API key; the data route is behind the key like every other route, and the
page sends the key it is given in the address (``#key=...``, never sent to the server).
The thread starts with the first data request and stops after a few idle minutes.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

from frontend.dashboard.series import Continuity, Scrape, Series, merge, parse
from frontend.metrics import GatewayMetrics
from topics.metrics import GaugesAtScrape, MetricsSettings

log = logging.getLogger("clipstream.dashboard")

# the page and its scripts: open like /healthz (they carry no data); name -> media type
ASSETS: dict[str, str] = {
    "dashboard.html": "text/html; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "uPlot.iife.min.js": "text/javascript; charset=utf-8",
    "uPlot.min.css": "text/css; charset=utf-8",
}
PAGE_PATHS: frozenset[str] = frozenset({"/dashboard", *(f"/dashboard/{name}" for name in ASSETS)})
IDLE_STOP_S = 300.0


@dataclass(frozen=True)
class Target:
    stage: str
    name: str
    url: str


def read_targets(path: str | Path | None) -> list[Target]:
    """The /metrics URLs of a Prometheus file_sd JSON (``[{"targets": [...], "labels": {...}}]``)."""
    if not path:
        return []
    try:
        groups = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return []
    out = []
    for group in groups if isinstance(groups, list) else []:
        labels = group.get("labels", {}) if isinstance(group, dict) else {}
        for target in group.get("targets", []) if isinstance(group, dict) else []:
            out.append(Target(str(labels.get("stage", "")), str(labels.get("name", target)),
                              f"http://{target}/metrics"))
    return out


class Scraper:
    """Scrapes the targets (or the gateway's own registry) into ``Series`` from a thread."""

    def __init__(self, own: Callable[[], str], slos: Callable[[], Mapping[str, float]],
                 targets_file: str | None, every_s: float = 1.0) -> None:
        self.own, self.slos, self.targets_file, self.every_s = own, slos, targets_file, every_s
        self.series = Series()
        self.continuity = Continuity()
        self.errors: dict[str, str] = {}
        self.lock = threading.Lock()
        self.asked = 0.0
        self.thread: threading.Thread | None = None

    def data(self, since: float | None = None) -> dict[str, Any]:
        """What the page polls (the rows after ``since``); starts the scraping thread."""
        self.asked = time.monotonic()
        if self.thread is None or not self.thread.is_alive():
            self.thread = threading.Thread(target=self._run, name="dashboard scraper", daemon=True)
            self.thread.start()
        with self.lock:
            out = self.series.to_json(since)
            out["errors"] = dict(self.errors)
        return out

    def _run(self) -> None:
        while time.monotonic() - self.asked < IDLE_STOP_S:
            t0 = time.monotonic()
            try:
                self.scrape_once()
            except Exception:  # the page shows a gap; the gateway serves on
                log.exception("dashboard scrape failed")
            time.sleep(max(0.0, self.every_s - (time.monotonic() - t0)))

    def scrape_once(self) -> None:
        targets = read_targets(self.targets_file)
        scraped: dict[str, Scrape | None] = {}
        errors: dict[str, str] = {}
        if not targets:
            scraped[""] = parse(self.own())
        for target in targets:
            try:
                with urllib.request.urlopen(target.url, timeout=min(1.0, self.every_s)) as answer:
                    scraped[target.name] = parse(answer.read().decode())
            except (OSError, ValueError) as exc:  # a stage restarting: its samples come back
                scraped[target.name] = None
                errors[target.name] = str(exc)
        samples = merge(self.continuity.samples(scraped))
        try:
            slos = dict(self.slos())
        except Exception:
            slos = {}
        with self.lock:
            self.series.add(time.time(), samples, slos)
            self.errors = errors


def asset(name: str) -> bytes:
    return resources.files("frontend.dashboard").joinpath("static", name).read_bytes()


def mount_dashboard(app: FastAPI, metrics: GatewayMetrics,
                    slos: Callable[[], Mapping[str, float]] = dict,
                    direct: Callable[[], Iterable[str]] = tuple) -> Scraper:
    """Add ``/dashboard``, its assets and ``/dashboard/data`` to the gateway's app. ``direct``:
    the apps whose queries this gateway sends to their model straight, which the selector
    does not count."""
    scraper = Scraper(metrics.render, slos, MetricsSettings().targets)
    metrics.registry.register(GaugesAtScrape(
        {"clipstream_app_slo_seconds": ("Each app's latency objective, from the registry.", ("app",)),
         "clipstream_gateway_direct_app": ("1 for each app whose queries this gateway sends to its model "
                                           "straight, without the selector.", ("app",))},
        lambda: {"clipstream_app_slo_seconds": [((app, ), ms / 1000.0) for app, ms in slos().items()],
                 "clipstream_gateway_direct_app": [((app,), 1.0) for app in sorted(direct())]}))

    @app.get("/dashboard", include_in_schema=False)
    async def page() -> Response:
        return Response(asset("dashboard.html"), media_type=ASSETS["dashboard.html"])

    @app.get("/dashboard/data", summary="The dashboard's time series (JSON)")
    async def data(since: float | None = None) -> JSONResponse:
        return JSONResponse(scraper.data(since))

    @app.get("/dashboard/{name}", include_in_schema=False)
    async def static(name: str) -> Response:
        if name not in ASSETS:
            return JSONResponse({"detail": f"no dashboard asset {name!r}"}, 404)
        return Response(asset(name), media_type=ASSETS[name], headers={"cache-control": "max-age=3600"})

    return scraper
