"""Benchmark of the model abstraction layer ALONE, on a real Kafka broker and a real Redis.

``requests.<model>`` in -> ``clipstream batcher`` -> ``batches.<model>`` -> ``clipstream worker``
-> ``predictions`` out. The benchmark plays the selector on both sides: a load generator (its
own process) produces ``ModelRequest`` records straight into ``requests.<model>`` (deadline =
now + objective, ``selector_partition`` spread over the partitions of ``predictions``), and a
consumer reads ``predictions`` (and ``batch-stats.<model>``, the workers' per-batch reports).
Batcher and worker are the real CLI processes, started per run, each waited on for its
``ready:`` line and stopped at the end of the run.

Every run gets its own model name (so its own topics and consumer groups) under one private
broker + Redis (``launcher.up`` with free ports in a temporary state dir), stopped at the end,
also on Ctrl-C. Sections:

* ``throughput``: ok predictions answered within the objective per second (goodput), at a
  20 ms objective, open loop above capacity, for no batching (batch size 1), fixed batch
  sizes, and AIMD; for (a) the simulated accelerator with Clockwork's ResNet-50 table, (b) a
  high-fixed-cost profile (5 ms per batch + 0.05 ms per item, like the paper's SVM), (c) the
  scikit-learn digits logistic regression exported to ONNX. A *fixed* size N is the real
  batcher with ``--max-batch-size N``, AIMD started at N (``CLIPSTREAM_BATCHER_AIMD_START``)
  and an AIMD objective nothing misses (``--latency-objective-ms 1e6``): the size never moves.
  The request deadline (20 ms) is set by the load generator, not by that flag. AIMD's own
  objective on the batch's service time is the 20 ms latency objective, as in Clipper
  (``--aimd-objective-ms`` to tighten it): AIMD grows the batch up to it, and the batcher cuts
  each batch to what its latency curve says fits the oldest deadline. The sweep
  runs each size once; then no batching, the sweep's best fixed size and AIMD are run again
  in five interleaved rounds, and AIMD's ratios are the medians of those (the best of eight
  single runs is biased up, and one 3 s run varies by +-15% on a shared machine). For the
  simulated accelerator one more run, *always work queued*: AIMD (objective 20 ms on the
  batch's service time, as in Clipper) offered 1.3x the device's best throughput with request
  deadlines of 100 ms, so the queue never empties: how busy the layer keeps the device; and
  no batching run the same way (Clipper's ratio: throughput at the objective).
  Beside it, what an ideal batcher could answer within the 20 ms end-to-end deadline
  (``bounds``, simulated): the bound of that stricter reading.
* ``adapt``: AIMD on the Clockwork profile when the model becomes 2x slower mid-run
  (``set_slowdown``), against fixed sizes measured at the slower speed: three interleaved
  rounds of the sizes pick the new best (the highest median), then five rounds of that size
  and AIMD give its rate (its median there, apart from the pick) and the figures (medians of
  the rounds' recoveries and settled ratios; ``bench/batching/adapt.py``), in goodput and in ok
  throughput, both from AIMD's runs at the 20 ms objective (with ``--aimd-objective-ms``, AIMD
  at that objective is run and reported too, not counted).
* ``delayed``: delayed batching off (0 ms) vs on, AIMD, the high-fixed-cost profile, moderate
  bursty load, for two ways of dispatching: just in time (the default) and an open pipe (each
  request sent the moment it comes, up to 16 batches outstanding: the regime of Clipper's
  Figure 5, where without a delay the model cannot keep up); ``--dispatch`` also takes eager
  credit and clipper (one batch outstanding per replica, the next sent when it returns).
  Every configuration runs once per round, in three interleaved rounds; a ratio is the median
  of the per-round ratios. Beside them, an ideal batcher's gain from the same delays on the
  same loads (``bounds``).
* ``cache``: cache hits: batcher in -> predictions topic out.
* ``cost``: the ONNX model's CPU cost per query, per process (/proc/<pid>/stat), and where the
  batcher's and the worker's Python time goes (py-spy, when installed).

    .venv/bin/python -m bench.batching            # ~21 min; out/bench/batching.json and .png
    .venv/bin/python -m bench.batching --quick    # ~2-3 min smoke run (fewer sizes, shorter runs)
    .venv/bin/python -m bench.batching --sections throughput --models clockwork --deadline-ms 100 \
        --rate-scale 1.6 --out out/bench/d100     # a looser request deadline, more load
    (--verbose: latency by hop per run; --keep: keep the process logs and py-spy stacks)

Offered load is open loop: a linear ramp over the first half of each run's warm-up (a step
from nothing to the full rate puts a just-started batcher more than a deadline behind at
once, and it never catches up), then the constant rate, whether or not answers come back.
Before the first section a 20 s run at 500 q/s warms the broker (a cold one at full load
expires nearly everything), then up to four 5.5 s runs on the simulated accelerator at its
offered load, until the broker's JIT compiler threads use under a tenth of a core
(``warm_until_jit_quiet``): after the 20 s alone the first runs of a section still met a
broker that was compiling. Every run has the same warm-up and measurement window; figures
count answers made in the window. ``goodput`` = ok answers made within the request deadline,
counted when the worker writes them to ``predictions``; the batchers therefore run with no
margin for the hop on to the selector when they drop requests that cannot make their deadline
(``--hopeless-margin-ms``, default 0 here; the pipeline's default is 3 ms);
``ok throughput`` = ok answers, any latency (the batch latency is still bounded by AIMD's
objective).

Modules: ``helpers`` (pure functions, unit-tested), ``bounds`` (the ideal batcher's
simulation, unit-tested), ``procs`` (load generator and CLI
children), ``runner`` (``Bench``: one run), ``sections`` (the five sections), ``plot`` (the
figure), ``cli`` (``main``).
"""

from __future__ import annotations

from bench.batching.cli import SECTIONS, main

__all__ = ["SECTIONS", "main"]
