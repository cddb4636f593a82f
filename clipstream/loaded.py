"""Which replicas of a model have it loaded, as their workers say in Redis: the readiness that
Triton's and MLServer's callers read from ``/v2/models/{name}/ready`` (docs/design/0115).

A worker says so once it serves, and again every ``REFRESH_S``; one that fails to load its
model says why before it exits, and one that stops takes its word back. A replica's word holds
for ``FRESH_S``, so a worker killed outright stops counting without anyone cleaning up.
Redis is a cache (docs/design/0016): when it is away, the readiness is not known, and callers
treat the model as ready rather than take a serving model out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import NamedTuple

KEY_PREFIX = "cs:loaded:"
REFRESH_S = 10.0
FRESH_S = 3 * REFRESH_S
KEEP_S = 3600  # a model nobody serves any more: its key goes
REASON_CHARS = 600  # a reason longer than this is cut, and says so


def key_of(topic_prefix: str, model: str) -> str:
    """The hash of ``model``'s replicas, one field per version and replica."""
    return f"{KEY_PREFIX}{topic_prefix}{model}"


def field_of(version: str | None, replica: int) -> str:
    return f"{version or '-'}:{replica}"


def word(loaded: bool, now_s: float, reason: str | None = None, device: str | None = None) -> str:
    """A replica's word: loaded or not (and why), when it said so, and the device it runs the
    model on (``cpu``, ``cuda``), which ``inspect`` shows."""
    cut = reason if reason is None or len(reason) <= REASON_CHARS else reason[:REASON_CHARS - 4] + " ..."
    return json.dumps({"loaded": loaded, "at": round(now_s, 3), **({"reason": cut} if cut else {}),
                       **({"device": device} if device else {})})


def commands(topic_prefix: str, model: str, version: str | None, replica: int, said: str | None
             ) -> list[tuple[str, ...]]:
    """The Redis commands that record ``said`` (None: take the replica's word back)."""
    key, field = key_of(topic_prefix, model), field_of(version, replica)
    if said is None:
        return [("HDEL", key, field)]
    return [("HSET", key, field, said), ("EXPIRE", key, str(KEEP_S))]


class Said(NamedTuple):
    """A replica's word, read back."""

    at: float
    loaded: bool
    why: str  # why it is not loaded
    device: str | None


def read_word(raw: bytes | str | None) -> Said | None:
    """A replica's word (``word``); None for none or one unreadable."""
    try:
        said = json.loads(raw) if raw else None
        if not said:
            return None
        device = said.get("device")
        return Said(float(said["at"]), bool(said["loaded"]), said.get("reason") or "see its worker log",
                    str(device) if device else None)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def unready(model: str, fields: Mapping[bytes | str, bytes | str], now_s: float,
            version: str | None = None) -> str | None:
    """None when a replica of ``model`` said it has it loaded within ``FRESH_S``; else why the
    model cannot answer: the latest failure to load (of ``version``, the registry's, when given:
    an earlier version's failure explains nothing now), or that no worker has said it loaded."""
    failed: tuple[float, str] | None = None
    for name, raw in fields.items():
        said = read_word(raw)
        if said is None:
            continue
        if said.loaded and now_s - said.at <= FRESH_S:
            return None
        said_version, _, replica = (name.decode() if isinstance(name, bytes) else name).rpartition(":")
        if not said.loaded and version in (None, said_version) and (failed is None or said.at > failed[0]):
            ago = f", {now_s - said.at:.0f} s ago" if now_s - said.at > FRESH_S else ""  # no worker may run now
            failed = (said.at, f"model {model} version {said_version} replica {replica} did not load{ago}: {said.why}")
    return failed[1] if failed else f"model {model}: no worker has said it has the model loaded"


def rollout(fields: Mapping[bytes | str, bytes | str], version: str | None, replicas: int, now_s: float,
            since_s: float) -> tuple[list[int], str | None]:
    """How far ``version`` of a model is loaded on its ``replicas``: the replicas whose word says
    loaded within ``FRESH_S``, and the reason of a replica that said it failed to load since
    ``since_s`` (None: none did)."""
    loaded: list[int] = []
    failed: tuple[float, str] | None = None
    for replica in range(replicas):
        field = field_of(version, replica)
        said = read_word(fields.get(field) or fields.get(field.encode()))
        if said is None:
            continue
        if said.loaded and now_s - said.at <= FRESH_S:
            loaded.append(replica)
        elif not said.loaded and said.at >= since_s and (failed is None or said.at > failed[0]):
            failed = (said.at, f"replica {replica} did not load it: {said.why}")
    return loaded, failed[1] if failed else None


def devices(fields: Mapping[bytes | str, bytes | str], now_s: float) -> list[str]:
    """The devices that the replicas having a version loaded now (within ``FRESH_S``) run it on,
    each once and sorted: during a rollout, the old version's and the new one's; a word from a
    worker that named none counts as none."""
    found: set[str] = set()
    for raw in fields.values():
        said = read_word(raw)
        if said is not None and said.loaded and said.device and now_s - said.at <= FRESH_S:
            found.add(said.device)
    return sorted(found)
