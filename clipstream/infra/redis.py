"""The local Redis: the system ``redis-server``, started for development and tests.

One Redis holds both the prediction cache and durable state (policy weights). Eviction must
only ever hit the cache, so the server runs with ``maxmemory-policy volatile-lru`` (only keys
with a TTL are evicted; every cache entry has one, policy state has none) and a memory cap so
that the policy actually applies. It snapshots to its state dir a minute after a change and
when it stops, so the weights a policy learnt survive a restart (docs/design/0104).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from clipstream.infra import require_binary, spawn_detached

REDIS_HINT = "apt-get install -y redis-server (macOS: brew install redis)"
MAXMEMORY = "256mb"
MAXMEMORY_POLICY = "volatile-lru"
# a snapshot 60 s after any change (and one at shutdown): a crash loses at most a minute of
# learning, and the cache's churn costs one fork a minute rather than a write per command
SNAPSHOT_EVERY = "60 1"


def redis_url(port: int, db: int = 0) -> str:
    return f"redis://127.0.0.1:{port}/{db}"


def redis_command(
    redis_server: str, port: int, state_dir: Path, maxmemory: str = MAXMEMORY, conf: Path | None = None
) -> list[str]:
    """The redis-server command line: loopback only, snapshots in the state dir, evict only TTL
    keys; ``conf``, a file of settings that must not show in the process list, comes first."""
    return [
        redis_server,
        *([str(conf)] if conf is not None else []),
        "--bind", "127.0.0.1",
        "--port", str(port),
        "--save", SNAPSHOT_EVERY,
        "--appendonly", "no",
        "--maxmemory", maxmemory,
        "--maxmemory-policy", MAXMEMORY_POLICY,
        "--dir", str(state_dir / "redis"),
        "--logfile", str(state_dir / "redis.log"),
        "--daemonize", "no",
    ]  # fmt: skip


def start_redis(
    port: int, state_dir: Path, die_with_parent: bool = False, password: str | None = None
) -> subprocess.Popen[bytes]:
    """Start redis-server detached (own session); does not wait for it. With ``password``
    (``CLIPSTREAM_REDIS_PASSWORD``) it asks every client for it, as the settings promise."""
    binary = require_binary("redis-server", REDIS_HINT)
    (state_dir / "redis").mkdir(parents=True, exist_ok=True)
    return spawn_detached(
        redis_command(binary, port, state_dir, conf=_password_file(state_dir, password)),
        state_dir / "redis.out",
        cwd=state_dir / "redis",
        die_with_parent=die_with_parent,
    )


def _password_file(state_dir: Path, password: str | None) -> Path | None:
    """The password in a config file only the owner reads, not on the command line, where any
    user's ``ps`` shows it; None (and no file left behind) without one."""
    path = state_dir / "redis" / "secret.conf"
    path.unlink(missing_ok=True)
    if not password:
        return None
    # in double quotes redis-server reads \xHH as that byte: a quote, a backslash or a control
    # byte goes so; the rest as its UTF-8 bytes, as redis-py sends the password
    quoted = b"".join(b"\\x%02x" % b if b in b'"\\' or b < 0x20 or b == 0x7F else bytes([b])
                      for b in password.encode())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(b'requirepass "' + quoted + b'"\n')
    return path


def _ping(url: str, password: str | None, timeout_s: float) -> str:
    """One PING: "ok", "silent" (the connection taken, no reply in time), or "failed"."""
    import redis

    client = redis.Redis.from_url(url, password=password, socket_connect_timeout=min(0.5, timeout_s),
                                  socket_timeout=timeout_s)
    try:
        return "ok" if client.ping() else "failed"
    except redis.TimeoutError:
        return "silent"
    except redis.RedisError:
        return "failed"
    finally:
        client.close()


def redis_silent(url: str, timeout_s: float = 1.0) -> bool:
    """True when the Redis at ``url`` takes the connection and sends nothing back within
    ``timeout_s`` (hung, or too busy to serve); a refusal of the password is an answer."""
    return _ping(url, None, timeout_s) == "silent"


def redis_answers(url: str, password: str | None = None) -> bool:
    """True when the Redis at ``url`` answers PING (with ``password`` when it wants one)."""
    return _ping(url, password, 1.0) == "ok"