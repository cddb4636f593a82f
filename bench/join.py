"""Selector join figures (issue: model selection layer), on the real pipeline.

* join overhead: the selector's ``joined`` stamp minus ``selector_in``, the moment the poll that
  brought the last expected prediction returned (the issue's "after the last expected prediction
  arrives"), with three python models that answer at once; the Kafka hop before it
  (``worker_out`` -> ``selector_in``) and the sum are reported beside it;
* at the deadline: ``joined`` minus the query's deadline, with a third model that always sleeps
  past it (a straggler), so every answer is cut off by the timer.

    python -m bench.join [--queries 300]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import Pipeline, figure, save_figure, say, write_app_file, write_json
from bench.machine import machine_info
from bench.stats import percentiles
from bench.tap import Tap
from schemas import Predictions, Record, Response
from topics import Catalogue

MODEL = """
import time
import numpy as np

class Model:
    def __init__(self, path, config):
        self.sleep_s = float(config.get("sleep_s", 0.0))

    def predict_batch(self, x):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        p = np.clip(x[:, :1], 0.0, 1.0).astype(np.float32)
        return np.concatenate([1.0 - p, p], axis=1)
"""


def _models(root: Path, straggler_s: float) -> list[dict[str, Any]]:
    from clipstream.testing.models import make_python_model

    out = []
    for i, sleep in enumerate((0.0, 0.0, straggler_s)):
        name = f"j{i}"
        make_python_model(root, name, MODEL, labels=[0, 1], shape=(2,), extra={"sleep_s": sleep})
        out.append({"name": name, "version": "1", "path": f"models/{name}/1", "replicas": 1})
    return out


class JoinTap:
    """worker_out stamps per query (predictions topic) and responses (responses topic)."""

    def __init__(self, settings: Any) -> None:
        cat = Catalogue.from_settings(settings)
        self.worker_out: dict[str, list[int]] = {}
        self.responses: dict[str, Response] = {}
        self.tap = Tap(settings, [cat.predictions, cat.responses]).start(self._on)

    def _on(self, rec: Record, msg: Any, arrived_us: int) -> None:
        if isinstance(rec, Predictions):
            for p in rec.items:
                if "worker_out" in p.trace:
                    self.worker_out.setdefault(p.query_id, []).append(p.trace["worker_out"])
        elif isinstance(rec, Response):
            self.responses[rec.query_id] = rec


def measure(pipe: Pipeline, queries: int, slo_ms: float, expect_all: bool) -> dict[str, Any]:
    from frontend.producer import Producer

    settings = pipe.settings()
    tap = JoinTap(settings)  # assigned at the topics' ends: it misses nothing sent from now on
    producer = Producer(settings=settings)
    rng = np.random.default_rng(0)
    sent = []
    for i in range(queries):
        x = np.array([rng.random(), rng.random()], np.float32)  # fresh inputs: no cache hits
        sent.append(producer.send_query("joinbench", x, slo_ms=slo_ms))
        producer.flush()
        time.sleep(slo_ms / 1000 * 1.2 if not expect_all else 0.02)  # sequential, light load
        if i % 50 == 0:
            say(f"    {i}/{queries}")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len([q for q in sent if q in tap.responses]) < len(sent):
        time.sleep(0.1)
    tap.tap.close()
    overhead, hop, produced_to_joined, after_deadline, missing = [], [], [], [], []
    for q in sent[5:]:  # the first few warm up fresh clients
        r = tap.responses.get(q)
        if r is None:
            continue
        joined = r.trace["joined"]
        outs = tap.worker_out.get(q, [])
        if expect_all and len(r.answered) == 3 and outs and "selector_in" in r.trace:
            arrived = r.trace["selector_in"]
            overhead.append((joined - arrived) / 1000)
            hop.append((arrived - max(outs)) / 1000)
            produced_to_joined.append((joined - max(outs)) / 1000)
        after_deadline.append((joined - r.deadline_us) / 1000)
        missing.append(len(r.missing))
    return {"overhead_ms": overhead, "hop_ms": hop, "produced_to_joined_ms": produced_to_joined,
            "after_deadline_ms": after_deadline, "missing": missing}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--queries", type=int, default=300)
    args = ap.parse_args()
    results = {}
    for case, straggler_s, slo_ms in (("all_arrive", 0.0, 200.0), ("straggler_cut", 1.0, 50.0)):
        say(f"{case}: 3 python models, third sleeps {straggler_s}s, SLO {slo_ms} ms")
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            models = _models(root / "models", straggler_s)
            app = {"name": "joinbench", "policy": "exp4", "slo_ms": slo_ms, "default_output": -1,
                   "models": [m["name"] for m in models]}
            write_app_file(root / "app.yaml", [app], models)
            # the batcher would drop requests for a model it knows to be this slow (and the
            # answer would come early); keep them queued so the deadline timer does the cutoff
            with Pipeline(root / "app.yaml", env={"CLIPSTREAM_BATCHER_DROP_HOPELESS": "false"}) as pipe:
                results[case] = measure(pipe, args.queries, slo_ms, expect_all=straggler_s == 0)
    every, cut = results["all_arrive"], results["straggler_cut"]
    summary = {
        "join_overhead_ms": {**percentiles(every["overhead_ms"], (50, 99)), "n": len(every["overhead_ms"])},
        "kafka_hop_ms": percentiles(every["hop_ms"], (50, 99)),
        "last_prediction_produced_to_joined_ms": percentiles(every["produced_to_joined_ms"], (50, 99)),
        "after_deadline_ms": {**percentiles(cut["after_deadline_ms"], (50, 99)),
                              "max": max(cut["after_deadline_ms"], default=float("nan")),
                              "n": len(cut["after_deadline_ms"])},
        "straggler_named_in_missing": float(np.mean([m >= 1 for m in cut["missing"]]))
        if cut["missing"] else float("nan"),
    }
    say(f"join overhead (last prediction received by the selector -> response built): "
        f"p50 {summary['join_overhead_ms']['p50']:.2f} ms, p99 {summary['join_overhead_ms']['p99']:.2f} ms")
    say(f"  before it, the Kafka hop worker -> selector: p50 {summary['kafka_hop_ms']['p50']:.2f} ms; "
        f"produced -> joined p50 {summary['last_prediction_produced_to_joined_ms']['p50']:.2f} ms")
    say(f"answer vs deadline with a straggler: p50 {summary['after_deadline_ms']['p50']:+.2f} ms, "
        f"p99 {summary['after_deadline_ms']['p99']:+.2f} ms (negative = before the deadline)")
    write_json("join", {"machine": machine_info(), "settings": vars(args), "summary": summary, "raw": results})
    fig, axes = figure(1, 2)
    axes[0][0].hist(results["all_arrive"]["overhead_ms"], bins=50, label="join")
    axes[0][0].hist(results["all_arrive"]["hop_ms"], bins=50, alpha=0.5, label="Kafka hop before it")
    axes[0][0].legend()
    axes[0][0].set_xlabel("join overhead (ms): last prediction received -> response")
    axes[0][1].hist(results["straggler_cut"]["after_deadline_ms"], bins=50, color="tab:red")
    axes[0][1].set_xlabel("response time minus deadline (ms), straggler cut off")
    save_figure(fig, "join")


if __name__ == "__main__":
    main()
