"""Two selector members under steady load; one is SIGKILLed mid-run.

The ledger of every query sent must show none lost (each gets a Response: a prediction, or a
default with its reason), none yielded twice by ``ResponseReader``, and real answers for the
killed member's partitions resuming once the group has moved them to the survivor. The test
plays batcher and worker (``fake_models``): the faults under test are the selector's.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from clipstream.settings import Settings
from clipstream.testing.procs import wait_until
from frontend.producer import Producer, ResponseReader
from schemas import QueryEvent, Response, decode_as
from selector.settings import SelectorSettings
from tests.integration.test_selector_service import fake_models, process, publish_app, python_models
from topics.admin import ensure_core_topics, watermarks
from topics.catalogue import Catalogue
from topics.client import admin_config, consumer_config
from topics.membership import membership_config
from topics.stage import FATAL_EXIT

pytestmark = [pytest.mark.integration, pytest.mark.component]  # the test plays a neighbouring stage

RATE_QPS = 40  # the steady load
SLO_MS = 300.0
BEFORE_KILL_S = 3.0
AFTER_RESUME_S = 2.0
# the broker notices a SIGKILLed member only when its session times out (6 s by default, the
# least a broker accepts unless group.min.session.timeout.ms is lowered); the survivor hears of
# the rebalance at its next heartbeat, rejoins and reads on from the committed offsets. The
# slack covers that and a machine whose two cores every process here shares
RESUME_BOUND_S = SelectorSettings().session_timeout_ms / 1000 + 4.0


def _owners(settings: Settings, group: str, queries: str) -> dict[str, set[int]]:
    """client id -> the queries partitions it owns, as the group coordinator says."""
    admin = AdminClient(admin_config(settings))
    (desc,) = [f.result(10) for f in admin.describe_consumer_groups([group]).values()]
    return {m.client_id: {tp.partition for tp in m.assignment.topic_partitions if tp.topic == queries}
            for m in desc.members}


def _partitions_of(settings: Settings, topic: str, parts: int) -> dict[str, int]:
    """query id -> the partition its QueryEvent was written to (read back from the topic)."""
    c = Consumer(consumer_config(settings, uuid.uuid4().hex, **{"enable.auto.commit": False}))
    ends = {p: watermarks(c, TopicPartition(topic, p))[1] for p in range(parts)}
    c.assign([TopicPartition(topic, p, 0) for p in range(parts)])
    where: dict[str, int] = {}
    read = {p: 0 for p in range(parts)}
    deadline = time.monotonic() + 30
    while any(read[p] < ends[p] for p in range(parts)) and time.monotonic() < deadline:
        msg = c.poll(0.5)
        if msg is not None and not msg.error():
            where[decode_as(QueryEvent, msg.value()).query_id] = msg.partition()
            read[msg.partition()] = msg.offset() + 1
    c.close()
    return where


def test_a_killed_selector_member_loses_no_query_and_answers_none_twice(settings: Settings, tmp_path: Path) -> None:
    ensure_core_topics(settings)
    cat = Catalogue.from_settings(settings)
    models = python_models(tmp_path, f"-{uuid.uuid4().hex[:6]}")  # only their names and specs are used
    app = f"app{uuid.uuid4().hex[:8]}"
    publish_app(settings, models, app, slo_ms=SLO_MS)
    group = f"selector-{uuid.uuid4().hex[:8]}"  # the session's other tests use the default group
    stop = threading.Event()
    fake = threading.Thread(target=fake_models, args=(settings, list(models), stop, set()), daemon=True)
    fake.start()
    producer, reader = Producer(settings=settings), ResponseReader(settings)
    acked: dict[str, float] = {}  # query id -> when sent (only queries the broker took entered)
    sent_at: dict[str, float] = {}
    got: dict[str, tuple[Response, float]] = {}
    yielded: list[str] = []
    x = np.array([0.1, 0.9], np.float32)

    def send() -> str:
        qid = uuid.uuid4().hex
        sent_at[qid] = time.time()
        producer.send_query(app, x, slo_ms=SLO_MS, query_id=qid,
                            on_delivery=lambda q, err: acked.__setitem__(q, sent_at[q]) if err is None else None)
        return qid

    def read(until: Any) -> None:
        while not until():
            r = reader.poll(0.05)
            if r is not None:
                yielded.append(r.query_id)
                got.setdefault(r.query_id, (r, time.time()))

    try:
        with ExitStack() as stack:
            a = stack.enter_context(process(["selector", "--group", group], settings))
            b = stack.enter_context(process(["selector", "--group", group], settings))
            owners = wait_until(lambda: (o := _owners(settings, group, cat.queries.name)) and len(o) == 2 and
                                all(o.values()) and o, 60, "both members to own queries partitions")
            killed = next(ps for cid, ps in owners.items() if cid.endswith(f"-{b.pid}"))

            def warm() -> bool:  # a real answer through both members' partitions
                ids = [send() for _ in range(8)]
                read(lambda: all(q in got for q in ids) or time.time() - sent_at[ids[0]] > 5)
                return all(q in got and not got[q][0].is_default for q in ids)

            wait_until(warm, 60, "real answers from both members (warm-up)")
            first = len(sent_at)

            load_stop, kill_at = threading.Event(), [0.0]

            def load() -> None:
                start = time.monotonic()
                i = 0
                while not load_stop.is_set():
                    send()
                    i += 1
                    if kill_at[0] == 0 and time.monotonic() - start >= BEFORE_KILL_S:
                        kill_at[0] = time.time()
                        os.kill(b.pid, signal.SIGKILL)
                    time.sleep(max(0.0, start + i / RATE_QPS - time.monotonic()))

            loader = threading.Thread(target=load, daemon=True)
            loader.start()
            where: dict[str, int] = {}

            def resumed() -> float | None:
                """When the first real answer to a query on the killed partitions, sent after
                the kill, was made (None: not yet)."""
                real = [(q, r) for q, (r, _) in got.items() if kill_at[0] and sent_at[q] > kill_at[0]
                        and not r.is_default]
                if any(q not in where for q, _ in real):
                    where.update(_partitions_of(settings, cat.queries.name, settings.selector_partitions))
                times = [r.created_us / 1e6 for q, r in real if where.get(q) in killed]
                return min(times) if times else None

            last_check = [0.0]

            def until_resumed() -> bool:  # checked twice a second: it reads the queries topic
                if time.monotonic() - last_check[0] < 0.5:
                    return False
                last_check[0] = time.monotonic()
                return resumed() is not None or time.time() - (kill_at[0] or time.time()) > RESUME_BOUND_S + 10

            read(until_resumed)
            resume_at = resumed()
            stop_reading = time.monotonic() + AFTER_RESUME_S
            read(lambda: time.monotonic() > stop_reading)
            load_stop.set()
            loader.join(10)
            producer.flush(10)
            # every query has its Response by its deadline, or at once when replayed past it
            drain_until = time.monotonic() + 15
            read(lambda: all(q in got for q in acked) or time.monotonic() > drain_until)
            quiet_until = time.monotonic() + 1.0  # late duplicates still on their way count too
            read(lambda: time.monotonic() > quiet_until)
            raw_extra = reader.duplicates
            assert a.poll() is None, "the surviving member died"
    finally:
        stop.set()
        fake.join(10)
        reader.close()
        producer.close()

    run = [q for q in list(sent_at)[first:] if q in acked]  # the warm-up's queries are not counted
    lost = [q for q in run if q not in got]
    dupes = len(yielded) - len(set(yielded))
    defaults = [got[q][0] for q in run if q in got and got[q][0].is_default]
    where = _partitions_of(settings, cat.queries.name, settings.selector_partitions)
    on_killed = [q for q in run if where.get(q) in killed]
    survivor_defaults = sum(1 for d in defaults if where.get(d.query_id) not in killed)
    gap = None if resume_at is None else resume_at - kill_at[0]
    print(f"\nledger: sent {len(run)} (killed member's partitions {sorted(killed)}: {len(on_killed)}), "
          f"answered {len(run) - len(lost)}, lost {len(lost)}, duplicates yielded {dupes}, "
          f"duplicates on the topic (dropped by the reader) {raw_extra}, defaults {len(defaults)} "
          f"({sorted({d.default_reason for d in defaults})}; on the survivor's partitions {survivor_defaults}), real answers on the killed partitions "
          f"resumed {gap if gap is None else round(gap, 2)} s after the kill (bound {RESUME_BOUND_S:g} s)")
    assert run and on_killed, "the load reached the killed member's partitions"
    assert not lost, f"{len(lost)} of {len(run)} queries got no Response"
    assert dupes == 0
    assert all(d.default_reason for d in defaults), "every default says why"
    assert gap is not None and gap <= RESUME_BOUND_S, f"real answers resumed {gap} s after the kill"


def test_a_fenced_selector_member_exits_to_be_restarted(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """A static member whose ``group.instance.id`` another consumer took over is fenced, as a
    member is whose session ran out while its group's coordinator moved: its consumer is in a
    fatal state for good. The selector must then exit, with ``FATAL_EXIT``, so that ``up``
    starts it afresh, rather than keep beating its heartbeat while it answers nothing."""
    ensure_core_topics(settings)
    cat = Catalogue.from_settings(settings)
    group = f"selector-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("CLIPSTREAM_MEMBER", "fenced-1")
    monkeypatch.setenv("CLIPSTREAM_SELECTOR_GROUP", group)
    with process(["selector"], settings) as proc:
        intruder = Consumer(consumer_config(settings, group, **membership_config(settings, "fenced-1")))
        try:
            intruder.subscribe([cat.queries.name, cat.predictions.name])
            wait_until(lambda: intruder.poll(0.1) is None and proc.poll() is not None, 60,
                       "the fenced selector to exit")
        finally:
            intruder.close()
        assert proc.returncode == FATAL_EXIT, f"exit code {proc.returncode}"
