"""The fault suite of issue 32: under steady load through the gateway and through the Kafka
producer, one fault at a time against ``clipstream up`` on a 3-broker cluster, and a ledger
of every query sent (``clipstream.testing.faults``): none lost, none answered twice to its
caller, and real answers back within the bound each fault states.

Run with ``make test-faults`` (``pytest -m faults -s tests/faults``): the suite starts its own
cluster and pipeline and takes minutes, so the default ``make test`` leaves it out. Each
ledger is printed and written to ``out/faults/<fault>.json``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from clipstream.infra import cluster, launcher, pid_alive
from clipstream.infra.kafka import fetch_jars
from clipstream.testing.faults import PATHS, Load, Query, ledger, observe, ready_count, stage_pid, table
from clipstream.testing.leaders import coordinator_of, move_coordinator
from clipstream.testing.procs import wait_until
from selector.settings import SelectorSettings
from tests.faults.conftest import BATCHER, CLUSTER_START_S, GROUP_WORKER, ROOT, SLO_MS, WORKER, Pipeline
from topics.catalogue import Catalogue
from topics.client import admin_config

pytestmark = [pytest.mark.faults, pytest.mark.timeout(720)]  # the first one starts the cluster

RATE_QPS = 20.0  # on each path: 40 q/s in all, the steady load
# the last this many queries on each path (5 s of load) real and on time: the pipeline is well.
# A cold start on a busy 2-core machine lets most requests straggle for minutes, with lulls of
# a second or two in which every answer is in time; a fault injected in such a lull measures
# the rest of the cold start, not the fault (docs/design/0060)
HEALTHY_RUN = 100
# bound on a recovery from the previous fault (a restarted broker's JVM, ...) or on a cold start:
# three fresh brokers on a slow 2-core machine carry each query too slowly for the SLO until
# their JIT compilers have run, which took about four minutes under this load
HEALTHY_S = 420.0
HEALTH_EVERY_S = 20.0  # how often the wait for health says where it stands
BASELINE_S = 2.0  # of steady load in the ledger before the fault
SETTLED_S = 3.0  # after the gaps close and the killed stage is back, so a second dip would show
DRAIN_S = SLO_MS / 1000 + 20.0
# a run goes on this long past its bound while answers have not resumed, so the ledger gives
# the real gap of a fault that misses its bound, not just "over"
OBSERVE_EXTRA_S = 60.0
# The bound, for every stage killed: a selector member rejoins as the same static
# member (its partitions wait for it, no rebalance; docs/design/0022), a gateway member's
# callers retry on the other one (docs/design/0023)
GAP_BOUND_S = 3.0
HUNG_PAST_SESSION_S = 3.0  # a hung member stays stopped this long past its session timeout
BROKER_BOUND_S = 10.0  # the target for a broker of three
# the bound too: a restarted batcher member has the most to import and to join (its
# registry, its request group), so it is the one most likely to miss it (docs/design/0024, 0046)
BATCHER_BOUND_S = GAP_BOUND_S
REDIS_FREEZE_S = 10.0
OUT = ROOT / "out" / "faults"
COMMAND = "make test-faults  # .venv/bin/python -m pytest -q -s -p no:cacheprovider -m faults tests/faults"


def _heal(pipe: Pipeline) -> None:
    """Restart a broker an earlier fault killed (in place, same ports): each fault starts whole."""
    if not launcher.status(pipe.infra_settings).running:
        launcher.up(pipe.infra_settings, progress=lambda _: None, timeout_s=CLUSTER_START_S, die_with_parent=True)


def _settled_tail(load: Load, path: str) -> list[Query] | None:
    """The last ``HEALTHY_RUN`` queries on ``path`` but the newest five (still under way);
    None until that many were sent."""
    sent, qs = load.tail(path, HEALTHY_RUN + 5)
    return qs[:-5] if sent > HEALTHY_RUN else None


def _recent_good(load: Load) -> dict[str, int]:
    """Per path, how many of its settled tail were real and on time; -1 while it has none."""
    return {p: -1 if (tail := _settled_tail(load, p)) is None else sum(q.good(0.5) for q in tail)
            for p in PATHS}


def _outcome(q: Query) -> str:
    if not q.outcome:
        return "no answer yet"
    return f"{q.outcome} in time" if q.good(0.5) else f"{q.outcome} ({q.reason or 'late'})"


def _wait_healthy(load: Load, name: str) -> float:
    """Wait for ``HEALTHY_RUN`` good queries in a row on each path; say how it goes every
    ``HEALTH_EVERY_S`` (a cold start takes minutes); the seconds it took."""
    start = last = time.monotonic()

    def healthy() -> bool:
        nonlocal last
        counts = _recent_good(load)
        if all(n == HEALTHY_RUN for n in counts.values()):
            return True
        if time.monotonic() - last >= HEALTH_EVERY_S:
            last = time.monotonic()
            print(f"  {name}: waiting for health, {last - start:.0f} s: of the last {HEALTHY_RUN} on each path, "
                  + ", ".join(f"{p} {n} in time" for p, n in counts.items()), flush=True)
        return False

    try:
        wait_until(healthy, HEALTHY_S, "real answers on both paths before the fault")
    except AssertionError:  # what the last queries got says which part stayed behind
        for p in PATHS:
            tail = _settled_tail(load, p) or []
            said = Counter(_outcome(q) for q in tail)
            print(f"  {name}: the last {len(tail)} on {p} before giving up: {dict(said)}", flush=True)
        raise
    took = time.monotonic() - start
    print(f"  {name}: healthy after {took:.0f} s", flush=True)
    return took


def write_report(report: dict[str, Any]) -> None:
    """``out/faults/<fault>.json``: the ledger and what else the fault measured."""
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{report['fault']}.json").write_text(json.dumps(report, indent=1))


def run_fault(pipe: Pipeline, name: str, inject: Callable[[], str], *, bound_s: float,
              back: Callable[[], bool] = lambda: True, hold_s: float = 0.0,
              restore: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """Load, wait for health, ``BASELINE_S`` of it, ``inject`` the fault, ``restore`` after
    ``hold_s`` (a freeze's length), observe until the gaps closed, ``back()`` holds and
    ``SETTLED_S`` more passed (at most ``bound_s + OBSERVE_EXTRA_S``), drain; the ledger of the
    queries sent from the baseline on, printed and written."""
    _heal(pipe)
    load = Load(pipe.url, pipe.app, pipe.settings, RATE_QPS, SLO_MS).start()
    restored = False
    try:
        healthy_after_s = _wait_healthy(load, name)
        since = time.time()  # the ledger counts the queries sent from here on
        observe(lambda: False, BASELINE_S)
        fault_at = time.time()
        what = inject()

        if hold_s:
            observe(lambda: False, hold_s)  # the fault lasts this long, under load
        restore()
        restored = True

        def settled() -> bool:  # complete answers too: a restarted worker's return is in the ledger
            rows = [ledger(load.of(p), fault_at) for p in PATHS]
            gaps = [row[k] for row in rows for k in ("gap_s", "gap_complete_s")]
            return (time.time() >= fault_at + hold_s + SETTLED_S and back() and None not in gaps
                    and time.time() > fault_at + max(gaps) + SETTLED_S)  # type: ignore[type-var]

        observe(settled, bound_s + OBSERVE_EXTRA_S - hold_s)
    finally:
        if not restored:
            restore()
        load.stop(DRAIN_S)
    paths = {p: ledger([q for q in load.of(p) if q.sent >= since], fault_at) for p in PATHS}
    report = {"fault": name, "injected": what, "fault_at_epoch_s": round(fault_at, 3), "bound_s": bound_s, "rate_qps_each_path": RATE_QPS,
              "slo_ms": SLO_MS, "healthy_after_s": round(healthy_after_s, 1), "second_responses_dropped_by_reader": load.raw_duplicates,
              "command": COMMAND, "paths": paths}
    write_report(report)
    print(f"\n{table(f'{name}: {what}; bound {bound_s:g} s', paths)}\n"
          f"  second Responses on the topic dropped by ResponseReader: {load.raw_duplicates}")
    return report


# ``report`` (what CI runs): the ledger's recovery times are a measurement, printed and written
# with their bounds, while loss, duplicates and answers resuming at all are asserted; ``assert``
# (``make test-faults``, the default) holds each gap to the bound as well
GAPS = os.environ.get("CLIPSTREAM_FAULT_GAPS", "assert")


def check(report: dict[str, Any], gap_bound_s: float) -> None:
    """The issue's ledger assertions, for both paths; every failure is listed, not just the first."""
    failures = []
    strict = GAPS != "report"
    for path, row in report["paths"].items():
        if not row["sent_after_fault"]:
            failures.append(f"{path}: no query sent after the fault")
        if row["lost"]:
            failures.append(f"{path}: {row['lost']} of {row['sent']} queries lost (no answer, no status)")
        if row["duplicates"]:
            failures.append(f"{path}: {row['duplicates']} duplicate answers reached the caller")
        if row["gap_s"] is None or (strict and row["gap_s"] > gap_bound_s):
            failures.append(f"{path}: real answers resumed after {row['gap_s']} s (bound {gap_bound_s:g} s)")
    assert not failures, f"{report['fault']}: " + "; ".join(failures)


def _kill_stage(pipe: Pipeline, stage: str) -> tuple[Callable[[], str], Callable[[], bool]]:
    """SIGKILL ``up``'s stage; ``back()`` once ``up`` restarted it and it printed ``ready:``."""
    readies = [ready_count(pipe.log_dir, stage)]
    assert readies[0] >= 1, f"{stage} never ready; up said:\n{pipe.tail()}"

    def inject() -> str:
        pid = stage_pid(pipe.log_dir, stage)
        assert pid is not None, f"no running {stage}; up said:\n{pipe.tail()}"
        os.kill(pid, signal.SIGKILL)
        return f"SIGKILL {stage} (pid {pid})"

    return inject, lambda: ready_count(pipe.log_dir, stage) > readies[0]


def test_selector_member_killed(pipeline: Pipeline) -> None:
    inject, back = _kill_stage(pipeline, "selector-2")
    check(run_fault(pipeline, "selector", inject, bound_s=GAP_BOUND_S, back=back), GAP_BOUND_S)


def test_batcher_member_killed(pipeline: Pipeline) -> None:
    """One batcher of two: its request partitions wait for its restart (a static member gets
    them back at once) or its session timeout, whichever comes first (docs/design/0024)."""
    inject, back = _kill_stage(pipeline, f"{BATCHER}.2")
    check(run_fault(pipeline, "batcher", inject, bound_s=BATCHER_BOUND_S, back=back), BATCHER_BOUND_S)


def test_selector_member_hung_past_its_session(pipeline: Pipeline) -> None:
    """The fallback when a member does not come back: selector-2 SIGSTOPped for longer than its
    session, so the coordinator drops the static member and selector-1 takes its partitions
    (then SIGCONT: it rejoins, one more rebalance). Not one of the issue's faults: its bound is
    the session timeout plus the issue's 3 s."""
    pid = stage_pid(pipeline.log_dir, "selector-2")
    assert pid is not None, f"no running selector-2; up said:\n{pipeline.tail()}"
    session_s = SelectorSettings().session_timeout_ms / 1000
    stopped = [False]

    def inject() -> str:
        os.kill(pid, signal.SIGSTOP)
        stopped[0] = True
        return f"SIGSTOP selector-2 (pid {pid}) for {session_s + HUNG_PAST_SESSION_S:g} s"

    def restore() -> None:
        if stopped[0]:
            os.kill(pid, signal.SIGCONT)
            stopped[0] = False

    bound = session_s + GAP_BOUND_S
    report = run_fault(pipeline, "selector-hung", inject, bound_s=bound, hold_s=session_s + HUNG_PAST_SESSION_S,
                       restore=restore)
    check(report, bound)


def test_worker_killed(pipeline: Pipeline) -> None:
    inject, back = _kill_stage(pipeline, WORKER)
    check(run_fault(pipeline, "worker", inject, bound_s=GAP_BOUND_S, back=back), GAP_BOUND_S)


def test_group_worker_killed(pipeline: Pipeline) -> None:
    """The one process that serves two of the three models (docs/design/0088). While ``up``
    restarts it, the selector answers with the model left, if the spare that takes its place
    (docs/design/0062) is not serving within the SLO; every answer must have all three again."""
    inject, back = _kill_stage(pipeline, GROUP_WORKER)
    report = run_fault(pipeline, "group-worker", inject, bound_s=GAP_BOUND_S, back=back)
    check(report, GAP_BOUND_S)
    never = [p for p, row in report["paths"].items() if row["gap_complete_s"] is None]
    assert not never, f"group-worker: answers from every model never came back on {never}"


def test_gateway_killed(pipeline: Pipeline) -> None:
    inject, back = _kill_stage(pipeline, "gateway-1")
    check(run_fault(pipeline, "gateway", inject, bound_s=GAP_BOUND_S, back=back), GAP_BOUND_S)


def test_redis_frozen(pipeline: Pipeline) -> None:
    pid = pipeline.status.redis_pid
    assert pid is not None and pid_alive(pid)
    stopped = [False]

    def inject() -> str:
        os.kill(pid, signal.SIGSTOP)
        stopped[0] = True
        return f"SIGSTOP redis-server (pid {pid}) for {REDIS_FREEZE_S:g} s"

    def restore() -> None:
        if stopped[0]:
            os.kill(pid, signal.SIGCONT)
            stopped[0] = False

    # the run goes on past the thaw, which must not cost a gap either
    report = run_fault(pipeline, "redis", inject, bound_s=REDIS_FREEZE_S, hold_s=REDIS_FREEZE_S, restore=restore)
    check(report, 0.0)
    _said(pipeline, "alert: redis: does not answer")
    _said(pipeline, "redis: answers again")


def _said(pipe: Pipeline, start: str, end: str = "", timeout_s: float = 30.0) -> None:
    """Wait for a line of `up`'s output that starts with ``start`` and ends with ``end``."""
    wait_until(lambda: any(line.startswith(start) and line.endswith(end) for line in pipe.lines), timeout_s,
               f"`up` to say {start!r}...{end!r}; it said:\n{pipe.tail()}")


def _kill_broker(pipe: Pipeline, name: str, victim: int) -> dict[str, Any]:
    """SIGKILL Kafka node ``victim`` under load, for good; the ledger, with when the cluster
    took its own steps (a new controller, the dead node fenced; docs/design/0070)."""
    settings = pipe.settings
    queries = Catalogue.from_settings(settings).queries.name
    group = SelectorSettings().join_group(settings)
    admin = AdminClient(admin_config(settings))
    leads = sum(p.leader == victim for p in admin.list_topics(queries, timeout=10).topics[queries].partitions.values())
    del admin  # a librdkafka handle left to the GC would keep calling the dead node
    nodes = launcher.status(pipe.infra_settings).kafka_nodes
    node = next(n for n in nodes if n.node_id == victim)
    logs = _node_logs(pipe, nodes)
    controller_at_kill: list[int | None] = []

    def inject() -> str:
        # read at the kill: losing the quorum's leader as well adds an election to the outage
        controller = cluster.quorum_leader(logs)
        controller_at_kill.append(controller)
        os.kill(node.pid, signal.SIGKILL)
        return (f"SIGKILL kafka node {node.node_id} (pid {node.pid}), coordinator of group {group}, "
                f"leader of {leads} of the queries partitions, "
                + ("and the quorum's controller" if controller == victim else f"the controller being node {controller}"))

    report = run_fault(pipe, name, inject, bound_s=BROKER_BOUND_S, back=lambda: not pid_alive(node.pid))
    fault_at = report["fault_at_epoch_s"]
    steps = cluster.failover([log for n, log in zip(nodes, logs) if n.node_id != victim], victim, fault_at)

    def after(at: float | None) -> float | None:
        return None if at is None else round(at - fault_at, 2)

    report["controller_active_after_s"], report["fenced_after_s"] = after(steps.controller_at), after(steps.fenced_at)
    report["controller_killed"] = controller_at_kill == [victim]
    write_report(report)
    print(f"  a new controller active after {report['controller_active_after_s']} s (None: it did not change), "
          f"node {victim} fenced after {report['fenced_after_s']} s")
    return report


def _node_logs(pipe: Pipeline, nodes: list[Any]) -> list[Path]:
    """Each node's own log, in the order of ``nodes``."""
    state_dir = launcher.state_dir_of(pipe.infra_settings)
    return [cluster.node_files(state_dir, n.node_id, len(nodes)).log for n in nodes]


def _quorum_leader(pipe: Pipeline) -> int:
    """The node that leads the controller quorum now, from the nodes' own logs."""
    leader = cluster.quorum_leader(_node_logs(pipe, launcher.status(pipe.infra_settings).kafka_nodes))
    assert leader is not None, "no node of the cluster has logged a quorum leader"
    return leader


def _coordinate_from(pipe: Pipeline, node: int) -> None:
    """Move the selectors' coordinator onto ``node`` (``clipstream.testing.leaders``)."""
    libs = fetch_jars(pipe.infra_settings, progress=lambda _: None)
    move_coordinator(pipe.settings, libs, SelectorSettings().join_group(pipe.settings), node)


def test_broker_killed(pipeline: Pipeline) -> None:
    """The node that coordinates the selectors' consumer group, and not the quorum's
    controller: its groups wait for a new coordinator as well as for new partition leaders,
    while the cluster needs no election. Which node leads the quorum is chance; the
    coordinator is moved off it first when they share a node. The next fault kills both."""
    controller = _quorum_leader(pipeline)
    victim = coordinator_of(pipeline.settings, SelectorSettings().join_group(pipeline.settings))
    if victim == controller:
        nodes = launcher.status(pipeline.infra_settings).kafka_nodes
        victim = next(n.node_id for n in nodes if n.node_id != controller)
        _coordinate_from(pipeline, victim)
        print(f"  moved the selectors' coordinator off the quorum's leader {controller} onto node {victim}")
    report = _kill_broker(pipeline, "broker", victim)
    print(f"  the killed node led the quorum at the kill: {report['controller_killed']}")
    check(report, BROKER_BOUND_S)
    _said(pipeline, f"alert: kafka: broker {victim} (")  # `up` tells its operator, with what to do
    _heal(pipeline)
    _said(pipeline, f"kafka: broker {victim} (", " is back")


def test_broker_killed_with_the_quorums_controller(pipeline: Pipeline) -> None:
    """The worst of the broker faults: the node that coordinates the selectors' group also leads
    the controller quorum, so the cluster elects a new controller before it can fence the dead
    node. The coordinator is moved onto the quorum's leader first."""
    _heal(pipeline)  # the fault before this one left a node dead
    controller = _quorum_leader(pipeline)
    _coordinate_from(pipeline, controller)
    report = _kill_broker(pipeline, "broker-controller", controller)
    # the quorum seldom elects a new leader on its own under this load; if it did before the
    # kill, the report says so (``controller_killed``) rather than failing the fault
    print(f"  the killed node led the quorum at the kill: {report['controller_killed']}")
    check(report, BROKER_BOUND_S)
