"""A worker's word on whether its replica has its model loaded (``clipstream.loaded``): said
once it serves and kept fresh, taken back when it stops, and a failure to load said with its
reason, so that readiness reads what the workers did rather than what the registry asks for."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from clipstream.loaded import FRESH_S, REFRESH_S, commands, field_of, key_of, read_word, word
from clipstream.redisclient import REDIS_AWAY, UnansweredWrites, sync_client
from clipstream.settings import Settings
from workers.group import GroupModel

Served = Sequence[tuple[str, str | None]]  # (model, version): a group worker serves each member
OnDevice = Sequence[tuple[str, str | None, str]]  # (model, version, the device it runs on)


def served_by(name: str, version: str | None, model: Any) -> list[tuple[str, str | None, str]]:
    if isinstance(model, GroupModel):
        return [(m.name, m.version, m.model.device) for m in model.members]
    return [(name, version, model.device)]


class LoadedWord:
    """The word of a serving worker, sent on its connection that waits for no replies."""

    def __init__(self, settings: Settings, served: OnDevice, replica: int) -> None:
        self.prefix, self.served, self.replica = settings.topic_prefix, served, replica
        self.said_at = 0.0

    def say(self, writes: UnansweredWrites, loaded: bool = True) -> None:
        """Loaded (again, every ``REFRESH_S``: ``due``), or taken back (``loaded`` False)."""
        now = time.time()
        try:
            writes.send([c for name, version, device in self.served
                         for c in commands(self.prefix, name, version, self.replica,
                                           word(True, now, device=device) if loaded else None)])
            self.said_at = time.monotonic()
        except REDIS_AWAY:
            pass  # said again at the next refresh; until then readiness reads the last word

    def due(self) -> bool:
        return time.monotonic() - self.said_at >= REFRESH_S


def say_not_loaded(settings: Settings, served: Served, replica: int, reason: str) -> None:
    """A worker that could not load its model says why before it exits (best effort: Redis
    away, the reason is still in its log). A group's worker speaks for every member, but not
    over a member version that another worker of the same replica says it has loaded now: a
    group's new worker shares the unchanged members' versions with the one that serves."""
    now = time.time()
    said = word(False, now, reason)
    try:
        client = sync_client(settings)
        try:
            reads = client.pipeline(transaction=False)  # every member's word in one round trip
            for name, version in served:
                reads.hget(key_of(settings.topic_prefix, name), field_of(version, replica))
            pipe = client.pipeline(transaction=False)
            for (name, version), raw in zip(served, reads.execute()):
                held = read_word(raw)
                if held is not None and held.loaded and now - held.at <= FRESH_S:
                    continue
                for command in commands(settings.topic_prefix, name, version, replica, said):
                    pipe.execute_command(*command)
            pipe.execute()
        finally:
            client.close()
    except REDIS_AWAY:
        pass


def tell_batcher_not_loaded(settings: Settings, name: str, version: str, replica: int) -> None:
    """A deployed worker that could not load ``version`` of ``name`` (a model or group) says so
    on its ``batch-stats`` topic, so the batcher keeps the batches on the version that serves
    (``batchers.version``); best effort, as the reason is in Redis and the log already."""
    import socket

    from schemas import encode
    from topics.catalogue import Catalogue
    from topics.emitter import Emitter
    from topics.markers import failed_marker

    marker = failed_marker(name, version, replica, f"{socket.gethostname()}:{name}.{replica}", int(time.time() * 1e6))
    emitter = Emitter(settings, name=f"worker {name}.{replica}")
    try:
        emitter.send(Catalogue.from_settings(settings).batch_stats(name).name, encode(marker))
    finally:
        emitter.close(timeout_s=5.0)

