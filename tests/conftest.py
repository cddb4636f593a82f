"""Fixtures shared by all tests.

Unit tests need nothing here. Integration tests (``@pytest.mark.integration``) get a real Kafka
broker and Redis: the ones named by CLIPSTREAM_KAFKA_BOOTSTRAP and CLIPSTREAM_REDIS_URL when
both are set (for example after ``clipstream infra up``), otherwise a private pair started once
per session on free ports in a temporary state dir and stopped at the end. The broker starts
lazily, on the first test that needs it, so ``pytest tests/unit`` never starts one.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from clipstream.settings import Settings

if TYPE_CHECKING:
    import redis

    from clipstream.infra.launcher import InfraStatus

# fixtures defined beside their helpers, for the tests that share them
pytest_plugins = ["tests.integration.batcher_harness"]

ENV_BOOTSTRAP = "CLIPSTREAM_KAFKA_BOOTSTRAP"
ENV_REDIS = "CLIPSTREAM_REDIS_URL"


@pytest.fixture(scope="session")
def infra(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InfraStatus]:
    """The session's Kafka + Redis; os.environ points at them so subprocesses inherit it."""
    from clipstream.infra import kafka, launcher

    bootstrap, url = os.environ.get(ENV_BOOTSTRAP), os.environ.get(ENV_REDIS)
    if bootstrap and url:
        yield launcher.InfraStatus(bootstrap, url, kafka_running=True, redis_running=True)
        return

    settings = Settings(state_dir=tmp_path_factory.mktemp("infra"))  # jars: the normal cache

    def progress(message: str) -> None:
        # silent normally; the first-ever run downloads jars for a minute: say so past capture
        sys.__stderr__.write(f"[infra] {message}\n")

    quiet = kafka.jars_ready(settings)
    status = launcher.up(
        settings,
        free_ports=True,
        progress=(lambda _: None) if quiet else progress,
        die_with_parent=True,  # a killed pytest leaves no orphan broker behind
    )
    patch = pytest.MonkeyPatch()
    for key, value in status.env().items():
        patch.setenv(key, value)
    try:
        yield status
    finally:
        patch.undo()
        launcher.down(settings)


@pytest.fixture(autouse=True)
def _integration_infra(request: pytest.FixtureRequest) -> None:
    """Integration tests get the infra (and its environment) even if they don't name it."""
    if request.node.get_closest_marker("integration") is not None:
        request.getfixturevalue("infra")


@pytest.fixture
def settings(infra: InfraStatus, tmp_path: Path) -> Settings:
    """Settings aimed at the session infra, with a topic prefix no other test uses.

    The state dir is the test's own, so a test that supervises processes cannot touch the
    session infra's records (or the user's).
    """
    return Settings(
        kafka_bootstrap=infra.kafka_bootstrap,
        redis_url=infra.redis_url,
        topic_prefix=f"t{uuid.uuid4().hex[:12]}.",
        state_dir=tmp_path / "state",
    )


@pytest.fixture
def redis_client(infra: InfraStatus) -> Iterator[redis.Redis]:
    """A client of the session Redis. Not flushed: tests share it, so use unique keys."""
    import redis

    client = redis.Redis.from_url(infra.redis_url)
    try:
        yield client
    finally:
        client.close()
