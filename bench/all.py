"""`make bench`: every benchmark, one after another; none starts after 75 minutes. Reports in out/bench/.

    .venv/bin/python -m bench.all            # the full run (~65 min on 2 cores)
    .venv/bin/python -m bench.all --quick    # a smoke run (~6-8 min)
    .venv/bin/python -m bench.all --only e2e,cache

Each benchmark starts (and stops) its own private pipeline; one that fails is reported and the
others still run. ``bench.batching``, ``bench.gateway`` and ``bench.join`` run in subprocesses.
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import time
import traceback

from bench.common import OUT, say
from bench.machine import machine_info

# bench.batching, the longest by far (about 18 minutes), runs last: on a slow machine the budget
# then costs its rows, not those of every benchmark after it
ORDER = ("breakdown", "e2e", "efficiency", "scaling", "members", "stragglers", "cache", "gateway", "join",
         "crossing", "cost", "fronts", "ensemble", "hopeless", "spinning", "batching")
# run as their own process: name -> extra arguments of the quick mode
SUBPROCESS = {"batching": ["--quick"], "gateway": ["--hits", "150", "--seconds", "4"], "join": ["--queries", "100"]}
BUDGET_S = 75 * 60


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated subset of " + ",".join(ORDER))
    args = ap.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(ORDER)
    OUT.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    index: dict[str, object] = {"machine": machine_info(), "quick": args.quick, "runs": {}}
    for i, name in enumerate(names):
        elapsed = time.monotonic() - t0
        if elapsed > BUDGET_S:
            say(f"== {name}: skipped, the {BUDGET_S // 60}-minute budget is spent")
            index["runs"][name] = {"status": "skipped (budget)"}  # type: ignore[index]
            continue
        say(f"== [{i + 1}/{len(names)}] {name} (at {elapsed / 60:.1f} min)")
        t = time.monotonic()
        try:
            if name in SUBPROCESS:
                cmd = [sys.executable, "-m", f"bench.{name}"] + (SUBPROCESS[name] if args.quick else [])
                rc = subprocess.run(cmd).returncode
                status = "ok" if rc == 0 else f"exit {rc}"
                summary = None
            else:
                report = importlib.import_module(f"bench.{name}").main(["--quick"] if args.quick else [])
                status, summary = "ok", report.get("summary")
        except KeyboardInterrupt:
            say("interrupted")
            index["runs"][name] = {"status": "interrupted"}  # type: ignore[index]
            break
        except Exception as exc:  # one broken benchmark must not lose the others
            traceback.print_exc()
            status, summary = f"failed: {type(exc).__name__}: {exc}", None
        index["runs"][name] = {"status": status, "seconds": round(time.monotonic() - t, 1),  # type: ignore[index]
                               "summary": summary}
        say(f"== {name}: {status} in {time.monotonic() - t:.0f} s")
    index["total_s"] = round(time.monotonic() - t0, 1)
    (OUT / "index.json").write_text(json.dumps(index, indent=2, default=str))
    say(f"all done in {index['total_s'] / 60:.1f} min; summary in {OUT / 'index.json'}")
    try:  # the headline table (FIGURES.md) from the reports just written; its failure fails no benchmark
        importlib.import_module("bench.figures").main(["--out-dir", str(OUT)])
    except Exception:
        traceback.print_exc()
        say("figures: failed (above); the reports themselves are in place")
    failed = [n for n, r in index["runs"].items() if r["status"] != "ok"]  # type: ignore[union-attr]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
