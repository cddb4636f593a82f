"""Redis clients for every stage, and a guard that tells when Redis is away.

Redis holds a cache and the policy state, and no stage may stall on it: every client has the
socket timeouts of ``CLIPSTREAM_REDIS_TIMEOUT_MS``, so a frozen server costs one bounded
wait. After a failure the stage's ``RedisGuard`` marks Redis away, and the stage serves
without it (cache misses, remembered weights) while one thread probes it back, so the hot
path does not pay the timeout again on every record.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from clipstream.weights import without_model

if TYPE_CHECKING:
    import redis.asyncio as aioredis

log = logging.getLogger("clipstream.redis")

# what "Redis is away" looks like (refused, reset, timed out, still loading); a command error
# (a wrong type, out of memory) is the data's problem and retrying would not cure it
REDIS_AWAY: tuple[type[Exception], ...] = (RedisConnectionError, RedisTimeoutError, OSError)


# the context of an app's global policy state, learnt from every query's feedback
GLOBAL_CONTEXT = "__global__"


def policy_state_key(app: str, context: str | None) -> str:
    """Where an app's policy state for ``context`` lives (its global state for None); ``inspect``
    reads the global one to show the weights."""
    return f"cs:state:{app}:{context or GLOBAL_CONTEXT}"


def contexts_key(app: str) -> str:
    """The contexts an app has policy states for (the selector caps their number)."""
    return f"cs:contexts:{app}"


def forget_app(client: redis.Redis, app: str, chunk: int = 500) -> int:
    """Delete every policy state of ``app`` (its global one and each context's) and its list of
    contexts; the number of keys deleted. A removed app registered again learns afresh."""
    deleted, keys = 0, [contexts_key(app)]
    for key in client.scan_iter(match=policy_state_key(app, "*"), count=chunk):
        keys.append(key)
        if len(keys) >= chunk:
            deleted += client.unlink(*keys)
            keys = []
    return deleted + (client.unlink(*keys) if keys else 0)


def forget_model_weights(client: redis.Redis, model: str, chunk: int = 500) -> int:
    """Take ``model`` out of every app's policy states (``clipstream.weights.without_model``);
    the number of states changed. Each is rewritten only if no learner wrote it meanwhile
    (WATCH), else read again, and keeps its expiry."""
    def rewrite(key: Any) -> Callable[[Any], bool]:
        def on(pipe: Any) -> bool:  # redis-py's ``transaction`` runs it again after a WatchError
            new = _state_without(pipe.get(key), model)
            if new is not None:
                pipe.multi()
                pipe.set(key, json.dumps(new), keepttl=True)
            return new is not None
        return on

    return sum(client.transaction(rewrite(key), key, value_from_callable=True)
               for key in client.scan_iter(match=policy_state_key("*", "*"), count=chunk))


def _state_without(raw: bytes | None, model: str) -> dict[str, Any] | None:
    """The stored state ``raw`` without ``model``; None when there is nothing to change (no
    state, one holding nothing of it, or one this code did not write)."""
    try:
        state = json.loads(raw) if raw else None
    except ValueError:
        return None
    return without_model(state, model) if isinstance(state, dict) else None


def stored_predictions_key(query_id: str) -> str:
    """Where the selector keeps a query's predictions for the feedback join (the gateway asks
    whether they are there before it takes feedback for the query)."""
    return f"cs:pred:{query_id}"


class RedisSettings(Protocol):
    """What a client needs of ``clipstream.settings.Settings`` (a sibling this module may not import)."""

    redis_url: str
    redis_timeout_ms: float


def client_options(settings: RedisSettings) -> dict[str, Any]:
    """Socket timeouts for connect and every command, from ``CLIPSTREAM_REDIS_TIMEOUT_MS``, and
    the password (``CLIPSTREAM_REDIS_PASSWORD``, or the one the URL held) when there is one."""
    timeout_s = settings.redis_timeout_ms / 1000
    options: dict[str, Any] = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
    password = getattr(settings, "redis_password", None)
    if password is not None:
        options["password"] = password.get_secret_value() if hasattr(password, "get_secret_value") else password
    return options


def sync_client(settings: RedisSettings) -> redis.Redis:
    """A blocking client of ``settings.redis_url`` with bounded waits. No retries: redis-py
    retries a timed-out command (10 times, with backoff, by default), which turns one bounded
    wait on a frozen server into seconds; the stage's ``RedisGuard`` decides when to try again."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return redis.Redis.from_url(settings.redis_url, retry=Retry(NoBackoff(), 0), **client_options(settings))


def async_client(settings: RedisSettings) -> aioredis.Redis:
    """An asyncio client of ``settings.redis_url`` with bounded waits and no retries, as
    ``sync_client`` (make it on the loop)."""
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    return aioredis.from_url(settings.redis_url, retry=Retry(NoBackoff(), 0), **client_options(settings))


class UnansweredWrites:
    """Writes on a connection of their own that asks Redis for no replies (``CLIENT REPLY OFF``).

    For writes whose outcome changes nothing for the caller, such as a worker filling the
    prediction cache: waiting for Redis's reply would put the calling thread to sleep and wake
    it again for every batch. A failure to send (Redis gone, or frozen with the socket's buffer
    full until the timeout) still raises one of ``REDIS_AWAY``; a command Redis rejects is lost
    unseen. A reconnect asks for no replies again before anything else is sent.
    """

    def __init__(self, settings: RedisSettings) -> None:
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        pool = redis.ConnectionPool.from_url(settings.redis_url, retry=Retry(NoBackoff(), 0),
                                             **client_options(settings))
        self._conn = pool.make_connection()
        self._conn.register_connect_callback(self._no_replies)

    def _no_replies(self, conn: Any) -> None:
        conn.send_command("CLIENT", "REPLY", "OFF")

    def send(self, commands: Sequence[tuple[Any, ...]]) -> None:
        """Send ``commands`` (each a tuple of its words) in one write, without waiting."""
        try:
            self._conn.send_packed_command(self._conn.pack_commands(commands), check_health=False)
        except REDIS_AWAY:
            self._conn.disconnect()  # the next send connects afresh, replies off again
            raise

    def close(self) -> None:
        self._conn.disconnect()


# every guard of this process, for the metrics that say whether Redis is away (``topics.metrics``)
GUARDS: weakref.WeakSet[RedisGuard] = weakref.WeakSet()


class RedisGuard:
    """Whether Redis answered lately: ``available()`` is False from a failure until a probe
    thread's PING gets an answer again, so callers skip Redis rather than wait on it."""

    def __init__(self, ping: Callable[[], object], probe_every_s: float = 0.25, name: str = "redis") -> None:
        self._ping, self._every, self._name = ping, probe_every_s, name
        GUARDS.add(self)
        self._away = threading.Event()
        self._lock = threading.Lock()
        self._prober: threading.Thread | None = None
        self._closed = threading.Event()
        self.outages = 0  # times Redis went away
        self.since: float | None = None  # monotonic time it went away, while it is away

    @property
    def name(self) -> str:
        return self._name

    def available(self) -> bool:
        return not self._away.is_set()

    def failed(self, exc: BaseException | None = None) -> None:
        """Mark Redis away (a command failed with ``exc``) and start probing it back."""
        with self._lock:
            if self._away.is_set():
                return
            self._away.set()
            self.outages += 1
            self.since = time.monotonic()
            log.warning("%s: Redis is away (%s); serving without it until it answers", self._name, exc)
            if self._prober is None:  # the prober clears this under the lock as it ends
                self._prober = threading.Thread(target=self._probe, name=f"{self._name}-redis-probe", daemon=True)
                self._prober.start()

    def wait_available(self, timeout_s: float) -> bool:
        """Block up to ``timeout_s`` for Redis to be back; True if it is."""
        deadline = time.monotonic() + timeout_s
        while self._away.is_set() and not self._closed.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._closed.wait(min(left, 0.02))
        return not self._away.is_set()

    def close(self) -> None:
        self._closed.set()

    def _probe(self) -> None:
        while not self._closed.wait(self._every):
            try:
                self._ping()
            except Exception:  # still away: the next probe tries again
                continue
            with self._lock:
                away_s = time.monotonic() - (self.since or time.monotonic())
                self._away.clear()
                self.since, self._prober = None, None
            log.warning("%s: Redis answers again after %.1f s", self._name, away_s)
            return
