"""Consumer-group membership (``topics.membership``): a named member is static, an unnamed one
dynamic, and bad names or heartbeats fail with a clear error."""

from __future__ import annotations

import pytest

from clipstream.errors import ConfigError
from clipstream.settings import Settings
from topics.membership import MEMBER_ENV, instance_id, member_name, membership_config


def test_a_named_member_is_static_under_the_topic_prefix() -> None:
    conf = membership_config(Settings(topic_prefix="run1."), "selector-2", session_timeout_ms=6000,
                             heartbeat_interval_ms=500)
    assert conf == {"group.instance.id": "run1.selector-2", "session.timeout.ms": 6000, "heartbeat.interval.ms": 500}


def test_an_unnamed_member_is_dynamic() -> None:
    conf = membership_config(Settings(), None)
    assert "group.instance.id" not in conf and conf["session.timeout.ms"] >= 3 * conf["heartbeat.interval.ms"]


def test_the_member_name_comes_from_the_environment() -> None:
    assert member_name({MEMBER_ENV: " selector-1 "}) == "selector-1"
    assert member_name({MEMBER_ENV: ""}) is None and member_name({}) is None


@pytest.mark.parametrize("name", ["selector 1", "a/b", "x" * 250])
def test_a_name_kafka_would_refuse_is_a_config_error(name: str) -> None:
    with pytest.raises(ConfigError, match=MEMBER_ENV):
        instance_id(Settings(), name)


def test_heartbeats_must_fit_three_times_in_the_session() -> None:
    with pytest.raises(ConfigError, match="a third"):
        membership_config(Settings(), "s", session_timeout_ms=1000, heartbeat_interval_ms=500)
