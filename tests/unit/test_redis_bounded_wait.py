"""A Redis that accepts connections and never answers (a SIGSTOPped server) costs one socket
timeout per command, not redis-py's default retries with backoff (seconds)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest
from redis.exceptions import TimeoutError as RedisTimeout

from clipstream.redisclient import async_client, sync_client
from clipstream.settings import Settings
from clipstream.testing.procs import wait_until


@pytest.fixture
def silent_redis() -> str:
    """A listener whose connections the kernel accepts (its backlog) and nobody reads."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    yield f"redis://127.0.0.1:{sock.getsockname()[1]}/0"
    sock.close()


def test_a_frozen_server_costs_one_timeout_per_command(silent_redis: str) -> None:
    settings = Settings(redis_url=silent_redis, redis_timeout_ms=100)
    start = time.monotonic()
    with pytest.raises(RedisTimeout):
        sync_client(settings).get("k")
    assert time.monotonic() - start < 1.0  # redis-py's default retries take several seconds

    async def go() -> float:
        client = async_client(settings)
        t = time.monotonic()
        try:
            with pytest.raises(RedisTimeout):
                await client.get("k")
            return time.monotonic() - t
        finally:
            await client.aclose()

    assert asyncio.run(go()) < 1.0


class Frozen:
    """A Redis stand-in whose MGET hangs for ``hang_s`` once ``frozen`` is set, then times out."""

    def __init__(self, data: dict[str, bytes], hang_s: float) -> None:
        self.data, self.hang_s = data, hang_s
        self.frozen = threading.Event()

    def ping(self) -> bool:
        if self.frozen.is_set():
            raise RedisTimeout("Timeout reading from socket")
        return True

    def mget(self, keys: list[str]) -> list[bytes | None]:
        if self.frozen.is_set():
            time.sleep(self.hang_s)
            raise RedisTimeout("Timeout reading from socket")
        return [self.data.get(k) for k in keys]


def test_the_join_thread_waits_for_a_frozen_redis_no_longer_than_its_state_wait() -> None:
    from clipstream.redisclient import RedisGuard
    from selector.service import Selector
    from selector.store import StateStore, state_key

    r = Frozen({state_key("app", None): json.dumps({"glob": 1}).encode()}, hang_s=1.0)
    guard = RedisGuard(r.ping, probe_every_s=0.01)
    sel = Selector(None, None, StateStore(r), None, None, None, None, guard=guard)  # type: ignore[arg-type]
    try:
        assert sel.states([("app", "c")]) == {("app", "c"): {"glob": 1}}  # read while Redis answers
        r.frozen.set()
        start = time.monotonic()
        assert sel.states([("app", "c")]) == {("app", "c"): {"glob": 1}}  # from memory, at once
        assert time.monotonic() - start < 0.5  # the read itself hangs for 1 s
        assert guard.available()  # not known to be away until the read gives up...
        assert sel.states([("app", "d")]) == {("app", "d"): {"glob": 1}}  # ...and no second read meanwhile
        wait_until(lambda: not guard.available(), 5, "the hung read to mark Redis away")
        r.frozen.clear()
        assert guard.wait_available(5.0)
        wait_until(lambda: sel._state_read is None, 5, "the read to be done")
        assert sel.states([("app", "c")]) == {("app", "c"): {"glob": 1}}
    finally:
        guard.close()
