"""`make demo` (python -m clipstream.demo): train, serve, stream, degrade, recover, report.

1. trains five digit models (ONNX and TorchScript) into out/demo/models and writes an Exp4 app;
2. runs `clipstream up` (its own Kafka and Redis on free ports unless some are running);
3. streams the held-out digits through the REST gateway, sending the true label as feedback;
4. a third of the way in deploys version 2 of the best model (it answers wrongly), and two
   thirds in rolls it back, both with the registry verbs a user would type;
5. shows a live table, then writes out/demo/report.json and PNG plots, and stops everything.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from clipstream.demo.dashboard import keep_history, screenshot
from clipstream.demo.report import cumulative_error, plot, replay_exp3, selector_total
from clipstream.demo.tap import Tap
from clipstream.demo.train import GROUP, LABELS, load_digits_split, train_all, write_app_file, write_degraded
from clipstream.metrics_targets import TARGETS_LINE
from clipstream.settings import get_settings
from selector.settings import SelectorSettings

OUT = Path("out/demo")


def say(msg: str) -> None:
    print(msg, flush=True)


def start_up(app_file: Path, state_dir: Path, port: int, timeout_s: float = 300) -> tuple[subprocess.Popen[str], dict[str, str]]:
    """Run `clipstream up` and wait for its ready line, echoing its progress."""
    cmd = [sys.executable, "-m", "clipstream.cli", "up", "-f", str(app_file), "--free-ports",
           "--state-dir", str(state_dir), "--gateway-port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    info: dict[str, str] = {}
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        say(f"  [up] {line}")
        if line.startswith("infra: "):
            info.update(kv.split("=", 1) for kv in line[len("infra: "):].split())
        if line.startswith("dashboard: "):
            info["dashboard"] = line[len("dashboard: "):]
        if line.startswith(TARGETS_LINE):
            info["targets"] = line[len(TARGETS_LINE):]
        if line.startswith("ready: "):
            info["url"] = line[len("ready: "):]
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
            return proc, info
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise SystemExit(f"clipstream up did not get ready; see the lines above and {state_dir}/up/")


def fresh_state(state_dir: Path) -> None:
    """Each demo starts from empty topics: stop what an interrupted run left, then wipe it."""
    import shutil

    from clipstream.infra import launcher

    if state_dir.exists():
        launcher.down(get_settings(state_dir=state_dir))
        shutil.rmtree(state_dir)


def cli(*args: str, env: dict[str, str]) -> None:
    subprocess.run([sys.executable, "-m", "clipstream.cli", *args], check=True, env=env,
                   stdout=subprocess.DEVNULL)


def table(rows: list[dict[str, Any]], models: list[str], tap: Tap, t0: float, total: int) -> str:
    recent = rows[-300:]
    def acc(m: str) -> str:
        got = [r["models"][m] == r["label"] for r in recent if m in r["models"]]
        return f"{np.mean(got):.2f}" if got else "  - "
    lat = [r["latency_ms"] for r in rows] or [0.0]
    _, status, sizes = tap.snapshot()
    hits = status.get("cached", 0) / max(1, sum(status.values()))
    ens = np.mean([r["ensemble_ok"] for r in recent]) if recent else 0.0
    done = len(rows)
    bar = "#" * int(30 * done / total)
    head = " ".join(f"{m:>7s}" for m in models)
    vals = " ".join(f"{acc(m):>7s}" for m in models)
    return (
        f"[{bar:<30s}] {done}/{total}  {done / max(1e-9, time.monotonic() - t0):6.1f} q/s  "
        f"p50 {np.percentile(lat, 50):6.1f} ms  p99 {np.percentile(lat, 99):6.1f} ms  "
        f"cache hits {hits:4.0%}  mean batch {np.mean(sizes[-200:]) if sizes else 0:4.1f}\n"
        f"    accuracy (last 300): {head}   Exp4\n"
        f"                         {vals}   {ens:.2f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--queries", type=int, default=2400)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--port", type=int, default=int(os.environ.get("CLIPSTREAM_GATEWAY_PORT", "8080")))
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    OUT.mkdir(parents=True, exist_ok=True)
    repo = (OUT / "models").resolve()
    say("1/5 training five models on scikit-learn's digits ...")
    offline = train_all(repo, progress=say)
    models = list(offline)
    degraded = max(offline, key=offline.get)  # the best model fails, as in the paper's Figure 8
    write_degraded(repo, degraded)
    app_file = write_app_file(OUT / "app.yaml", models)

    say("2/5 starting the pipeline (clipstream up) ...")
    state_dir = (OUT / "state").resolve()
    fresh_state(state_dir)
    proc, info = start_up(app_file, state_dir, args.port)
    env = {**os.environ, "CLIPSTREAM_KAFKA_BOOTSTRAP": info["kafka"], "CLIPSTREAM_REDIS_URL": info["redis"]}
    settings = get_settings(kafka_bootstrap=info["kafka"], redis_url=info["redis"])
    tap = Tap(settings, [GROUP], LABELS).start()  # the group's batches hold every model's work
    tap.wait_assigned()
    dashboard = info.get("dashboard", info["url"] + "/dashboard")
    say(f"    dashboard: {dashboard}")
    history = threading.Event()
    keep_history(dashboard, history)
    try:
        rows = stream(args, info["url"], models, degraded, tap, env)
        not_asked = selector_total(info.get("targets"), "clipstream_selector_not_asked_total")
        png = screenshot(dashboard, OUT / "dashboard.png")
        say(f"    wrote {png}" if png else "    no chromium installed: no dashboard.png")
    finally:
        say("5/5 stopping everything ...")
        history.set()
        tap.stop()
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    write_report(rows, models, degraded, offline, tap, args, not_asked)


class _Callers:
    """The demo's callers: each sends one held-out digit, retries while the gateway sheds load,
    sends the true label as feedback and keeps the answer's row."""

    def __init__(self, url: str, x_test: np.ndarray, y_test: np.ndarray, order: np.ndarray) -> None:
        from frontend.client import Client

        self.client = Client(url, app="digits")
        self.x_test, self.y_test, self.order = x_test, y_test, order
        self.rows: list[dict[str, Any]] = []
        self.rejected = 0
        self.lock = threading.Lock()

    def one(self, i: int) -> None:
        from frontend.client import Overloaded

        x, y = self.x_test[self.order[i]], int(self.y_test[self.order[i]])
        for attempt in range(50):
            try:
                r = self.client.predict("digits", x.tolist())
                break
            except Overloaded as exc:  # 503: the gateway sheds load; back off as it asks
                with self.lock:
                    self.rejected += 1
                time.sleep(min(exc.retry_after or 0.05, 0.05 * (attempt + 1)))
        else:
            raise SystemExit("the gateway kept answering 503; is the machine overloaded?")
        self.client.feedback(r["query_id"], y)
        with self.lock:
            self.rows.append({"i": i, "query_id": r["query_id"], "label": y, "output": r["output"],
                              "ensemble_ok": r["output"] == y, "latency_ms": r["latency_ms"],
                              "default": r["default"], "default_reason": r.get("default_reason"),
                              "answered": r["models"]["answered"], "missing": r["models"]["missing"]})

    def snapshot(self) -> list[dict[str, Any]]:
        with self.lock:
            return sorted(self.rows, key=lambda r: r["i"])


def stream(args: argparse.Namespace, url: str, models: list[str], degraded: str, tap: Tap,
           env: dict[str, str]) -> list[dict[str, Any]]:
    _, x_test, _, y_test = load_digits_split()
    order = np.random.default_rng(0).integers(0, len(x_test), size=args.queries)
    marks = (args.queries // 3, 2 * args.queries // 3)
    callers = _Callers(url, x_test, y_test, order)
    say(f"3/5 streaming {args.queries} held-out digits through {url} with feedback ...")
    t0 = time.monotonic()
    with ThreadPoolExecutor(args.concurrency) as pool:
        for phase, (lo, hi) in enumerate(((0, marks[0]), marks, (marks[1], args.queries))):
            paused = time.monotonic()
            if phase == 1:
                say(f"4/5 degrading {degraded}: deploying version 2, which answers wrongly")
                cli("deploy-model", degraded, str((OUT / "models" / degraded / "2").resolve()), "--version", "2", env=env)
                until_serving(callers.client, tap, degraded, "2")
            if phase == 2:
                say(f"4/5 recovering {degraded}: rollback to version 1")
                cli("rollback", degraded, env=env)
                until_serving(callers.client, tap, degraded, "1")
            t0 += time.monotonic() - paused  # the rate is the stream's own
            last = 0.0
            for f in [pool.submit(callers.one, i) for i in range(lo, hi)]:
                f.result()
                if time.monotonic() - last > 2:
                    last = time.monotonic()
                    say(table(_join(callers.snapshot(), tap), models, tap, t0, args.queries))
    if callers.rejected:
        say(f"    the gateway shed load {callers.rejected} times (503, retried)")
    rows = callers.snapshot()
    short = tap.wait_for({r["query_id"]: r["answered"] for r in rows})
    if short:
        say(f"    {short} answered queries have no prediction on the predictions topic yet; the report leaves them out")
    return _join(rows, tap)


def until_serving(client: Any, tap: Tap, model: str, version: str, timeout_s: float = 90.0) -> None:
    """Send queries the report leaves out until ``version`` of ``model`` evaluates them: its
    group's new worker loads and warms every member before the batcher moves to it. The inputs
    are noise in the digits' range, so the cache cannot answer them."""
    from frontend.client import Overloaded

    say(f"    waiting for {model} version {version} to serve (its workers start and warm up first) ...")
    t0 = time.monotonic()
    rng = np.random.default_rng(1)
    while tap.serving(model) != version:
        if time.monotonic() - t0 > timeout_s:
            raise SystemExit(f"{model} version {version} did not serve within {timeout_s:.0f} s; "
                             f"see the worker logs under {OUT / 'state' / 'up'}")
        try:
            client.predict("digits", rng.uniform(0, 16, 64).tolist())
        except Overloaded:
            time.sleep(0.05)
    say(f"    {model} version {version} serves, after {time.monotonic() - t0:.1f} s")


def _join(rows: list[dict[str, Any]], tap: Tap) -> list[dict[str, Any]]:
    answers, _, _ = tap.snapshot()
    return [{**r, "models": answers.get(r["query_id"], {})} for r in rows]


def write_report(rows: list[dict[str, Any]], models: list[str], degraded: str, offline: dict[str, float],
                 tap: Tap, args: argparse.Namespace, not_asked: float | None) -> None:
    marks = (args.queries // 3, 2 * args.queries // 3)
    exp3 = replay_exp3(models, rows)
    _, status, sizes = tap.snapshot()
    lat = np.array([r["latency_ms"] for r in rows])
    per_model = {m: cumulative_error([r["models"].get(m) == r["label"] if m in r["models"] else None for r in rows])[-1] for m in models}
    report = {
        "queries": len(rows),
        "models": models,
        "degraded_model": degraded,
        "degraded_between_queries": list(marks),
        "offline_accuracy": offline,
        "cumulative_error": {**{m: float(v) for m, v in per_model.items()},
                             "exp4_live": float(cumulative_error([r["ensemble_ok"] for r in rows])[-1]),
                             "exp3_replayed": float(cumulative_error(exp3)[-1])},
        "latency_ms": {"p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99)),
                       "max": float(lat.max())},
        "defaults": int(sum(r["default"] for r in rows)),
        "default_reasons": dict(Counter(str(r["default_reason"]) for r in rows if r["default"])),
        "models_not_asked": not_asked,
        "concurrency": args.concurrency,
        "hopeless_quantile": SelectorSettings().hopeless_quantile,
        "prediction_status": status,
        "cache_hit_rate": status.get("cached", 0) / max(1, sum(status.values())),
        "mean_batch_size": float(np.mean(sizes)) if sizes else 0.0,
    }
    pngs = plot(OUT, models, rows, exp3, degraded, marks)
    (OUT / "report.json").write_text(json.dumps(report, indent=2))
    with open(OUT / "queries.jsonl", "w") as f:  # one line per query, for a closer look
        for r in rows:
            f.write(json.dumps({k: r[k] for k in ("i", "query_id", "label", "output", "latency_ms", "default", "missing", "models")}) + "\n")
    say(json.dumps(report["cumulative_error"], indent=2))
    say(f"latency p50 {report['latency_ms']['p50']:.1f} ms, p99 {report['latency_ms']['p99']:.1f} ms; "
        f"cache hit rate {report['cache_hit_rate']:.0%}; mean batch {report['mean_batch_size']:.1f}")
    if report["defaults"]:
        say(f"defaults: {report['default_reasons']}")
    if report["hopeless_quantile"]:
        n = report["models_not_asked"]
        say(f"models the selector did not ask (CLIPSTREAM_SELECTOR_HOPELESS_QUANTILE="
            f"{report['hopeless_quantile']:g}): {'unknown (a selector could not be read)' if n is None else f'{n:,.0f}'}")
    say(f"wrote {OUT / 'report.json'} and {', '.join(str(p) for p in pngs)}")


if __name__ == "__main__":
    main()
