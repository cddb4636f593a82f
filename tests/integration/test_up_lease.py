"""One ``up`` per topic prefix, on a real Redis: a second one is refused with who holds the
prefix; a clean stop hands it on at once, and a killed ``up``'s hold runs out by itself."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from clipstream import lease
from clipstream.errors import InfraError
from clipstream.lease import UpLease
from clipstream.testing.procs import wait_until

pytestmark = pytest.mark.integration


def test_a_second_up_is_refused_until_the_first_lets_go(redis_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lease, "TTL_S", 1.0)
    monkeypatch.setattr(lease, "EVERY_S", 0.2)
    prefix = f"t{uuid.uuid4().hex[:8]}."
    first = UpLease(redis_client, prefix, "http://127.0.0.1:8080").claim()
    try:
        with pytest.raises(InfraError, match=r"another clipstream up \(pid \d+ on .*, gateway "
                                             r"http://127.0.0.1:8080\) serves topic prefix .* another "
                                             r"CLIPSTREAM_TOPIC_PREFIX"):
            UpLease(redis_client, prefix, "http://127.0.0.1:9090").claim()
        t0 = time.monotonic()  # held past its time to live: refreshed while its up runs
        wait_until(lambda: time.monotonic() - t0 > 1.5 and redis_client.exists(lease.lease_key(prefix)), 3,
                   "the lease held past its time to live")
        UpLease(redis_client, f"other-{prefix}", "x").claim().release()  # another prefix: beside it
    finally:
        first.release()
    second = UpLease(redis_client, prefix, "http://127.0.0.1:9090").claim()  # a clean stop: at once
    second._stop.set()  # killed: nothing refreshes or releases it
    wait_until(lambda: redis_client.get(lease.lease_key(prefix)) is None, 5, "a killed up's hold to run out")
    UpLease(redis_client, prefix, "x").claim().release()
