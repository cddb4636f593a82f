"""``UnansweredWrites`` against the session's real Redis: writes land, no reply ever comes back,
and a connection Redis dropped is replaced by one that asks for no replies again."""

from __future__ import annotations

import select
import socket
import time
import uuid

import pytest
import redis

from clipstream.redisclient import REDIS_AWAY, UnansweredWrites
from clipstream.settings import Settings

pytestmark = pytest.mark.integration


def landed(client: redis.Redis, keys: list[str], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(client.get(k) == k.encode() for k in keys):
            return True
        time.sleep(0.01)
    return False


def replies_waiting(writes: UnansweredWrites) -> bool:
    sock = writes._conn._sock
    assert sock is not None
    return bool(select.select([sock], [], [], 0.2)[0])


def sets(keys: list[str]) -> list[tuple[object, ...]]:
    return [("SET", k, k, "EX", 60) for k in keys]


def test_writes_land_and_redis_sends_nothing_back(settings: Settings, redis_client: redis.Redis) -> None:
    writes = UnansweredWrites(settings)
    keys = [f"cs:test:unanswered:{uuid.uuid4().hex}" for _ in range(200)]
    for i in range(0, len(keys), 20):
        writes.send(sets(keys[i:i + 20]))
    assert landed(redis_client, keys)
    assert 0 < redis_client.ttl(keys[0]) <= 60
    assert not replies_waiting(writes)
    writes.close()


def test_a_dropped_connection_raises_once_then_a_new_one_asks_for_no_replies(
    settings: Settings, redis_client: redis.Redis
) -> None:
    writes = UnansweredWrites(settings)
    name = f"unanswered-{uuid.uuid4().hex[:8]}"
    writes.send([("CLIENT", "SETNAME", name)])
    deadline = time.monotonic() + 5.0
    while not (ours := [c for c in redis_client.client_list() if c.get("name") == name]):
        assert time.monotonic() < deadline, "the writer's connection never showed up in CLIENT LIST"
        time.sleep(0.01)
    assert redis_client.client_kill_filter(_id=ours[0]["id"]) == 1
    failures = 0
    for _ in range(20):  # the first write into a closed socket may still be taken by the kernel
        try:
            writes.send(sets([f"cs:test:unanswered:probe:{uuid.uuid4().hex}"]))
        except REDIS_AWAY:
            failures += 1
            break
        time.sleep(0.05)
    assert failures == 1
    keys = [f"cs:test:unanswered:{uuid.uuid4().hex}" for _ in range(5)]
    writes.send(sets(keys))  # reconnects
    assert landed(redis_client, keys)
    assert not replies_waiting(writes)
    writes.close()


def test_no_redis_there_is_an_away_error(settings: Settings) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    writes = UnansweredWrites(settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{port}/0"}))
    with pytest.raises(REDIS_AWAY):
        writes.send(sets(["cs:test:unanswered:nowhere"]))
