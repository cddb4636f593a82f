"""Consumer-group membership of a stage that runs as several members (selector, batcher).

A member named by its runner (``clipstream up`` sets ``CLIPSTREAM_MEMBER`` to the stage name,
``selector-2``) joins as a static member (KIP-345): its ``group.instance.id`` outlives the
process, so a restart within the session timeout gets the same partitions back without a
rebalance, and the other members never stop. A member with no name joins dynamically, as
before. Either way, a member that does not come back loses its partitions to the others once
the broker has missed its heartbeats for the session timeout (docs/design/0022).

Usage, on top of ``topics.client.consumer_config``::

    consumer_config(settings, group, **membership_config(settings, member_name()))
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from clipstream.errors import ConfigError
from clipstream.settings import Settings

MEMBER_ENV = "CLIPSTREAM_MEMBER"
# long enough to outlast the move of the group's coordinator when its broker dies (a member whose
# session runs out meanwhile is fenced: docs/design/0035); 6 s is the least a broker accepts by
# default (group.min.session.timeout.ms). Heartbeats every 500 ms let the other members hear of
# a rebalance quickly
SESSION_TIMEOUT_MS = 10_000
HEARTBEAT_INTERVAL_MS = 500
_INSTANCE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")  # what Kafka accepts in a group.instance.id


def member_name(env: Mapping[str, str] | None = None) -> str | None:
    """The member name the runner gave this process (``CLIPSTREAM_MEMBER``); None if none."""
    name = (os.environ if env is None else env).get(MEMBER_ENV, "").strip()
    return name or None


def instance_id(settings: Settings, member: str) -> str:
    """The member's ``group.instance.id``: the topic prefix and the name, so two pipelines
    sharing a cluster under different prefixes never fence each other's members."""
    value = f"{settings.topic_prefix}{member}"
    if not _INSTANCE.match(value):
        raise ConfigError(f"{MEMBER_ENV}: {value!r} is not a valid group instance id "
                          "(letters, digits, '.', '_', '-'; at most 249)")
    return value


def membership_config(settings: Settings, member: str | None, *, session_timeout_ms: int = SESSION_TIMEOUT_MS,
                      heartbeat_interval_ms: int = HEARTBEAT_INTERVAL_MS) -> dict[str, Any]:
    """librdkafka settings for a group member: static with ``member``, dynamic without."""
    if heartbeat_interval_ms * 3 > session_timeout_ms:
        raise ConfigError(f"heartbeat interval ({heartbeat_interval_ms} ms) must be at most a third of the "
                          f"session timeout ({session_timeout_ms} ms), so one late heartbeat does not cost a "
                          "member its partitions")
    conf: dict[str, Any] = {"session.timeout.ms": session_timeout_ms, "heartbeat.interval.ms": heartbeat_interval_ms}
    if member:
        conf["group.instance.id"] = instance_id(settings, member)
    return conf
