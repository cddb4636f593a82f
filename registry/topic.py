"""The registry of apps, models and links: records of a compacted topic that every stage follows.

The topic is the source of truth (Clipper's management layer, kept as a changelog): a stage
builds its view by reading it from the beginning, then keeps reading, so a model linked to a
running app reaches every stage without a restart. Keys: ``app:<name>``, ``model:<name>``,
``link:<app>:<model>``; a tombstone (no value) deletes.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition

from clipstream.clock import now_us
from clipstream.errors import ConfigError, DecodeError, InfraError
from clipstream.settings import Settings
from registry.groups import groups_of
from registry.limits import KNOBS, check_knob, check_replicas, check_slo
from registry.repository import Repository
from registry.view import AppConfig, ModelConfig, RegistryView
from registry.spec import ModelSpec
from schemas import App, Link, Model, Record, decode_as, encode
from topics.admin import ensure_core_topics, learn_leaders, watermarks
from topics.catalogue import Catalogue, check_name
from topics.client import consumer_config, producer_config
from topics.deadletters import DeadLetters
from topics.schema_topic import install as install_schemas
from topics.stage import IDLE_POLL_S

log = logging.getLogger(__name__)

# a follower that stops as soon as it has read what it came for (a CLI verb, a test)
ONE_OFF_POLL_S = 0.05


# what an app is registered with when its file or command names no policy or SLO
NEW_APP_POLICY = "exp4"
NEW_APP_SLO_MS = 50.0


# the next step of every "the registry did not answer" error
_KAFKA_MUST_ANSWER = "Kafka at CLIPSTREAM_KAFKA_BOOTSTRAP must answer (check with `clipstream infra status`)"

# the record type each kind of registry key holds
_KINDS: dict[str, type] = {"app": App, "model": Model, "link": Link}


class RegistryState:
    """Folds registry records into a view; pure, so it is tested without a broker."""

    def __init__(self, repository: Repository | None = None) -> None:
        self._repository = repository or Repository()
        self._apps: dict[str, App] = {}
        self._models: dict[str, Model] = {}
        self._links: dict[tuple[str, str], Link] = {}
        self._specs: dict[str, ModelSpec] = {}

    def apply(self, key: str, value: bytes | None) -> None:
        kind, _, rest = key.partition(":")
        expected = _KINDS.get(kind)
        if expected is None:
            raise DecodeError(f"unknown registry key {key!r}")
        record = None if value is None else decode_as(expected, value)
        if kind == "app":
            self._put(self._apps, rest, record)
        elif kind == "model":
            self._put(self._models, rest, record)
        elif kind == "link":
            app, _, model = rest.partition(":")
            self._put(self._links, (app, model), record)

    @staticmethod
    def _put(table: dict[Any, Any], key: Any, record: Record | None) -> None:
        if record is None:
            table.pop(key, None)
        else:
            table[key] = record

    def _spec(self, location: str) -> tuple[ModelSpec | None, str | None]:
        # only a spec that loaded is kept: a repository that was unreachable is tried again
        # at the next change of the registry
        if location not in self._specs:
            try:
                self._specs[location] = self._repository.read_spec(location)
            except ConfigError as exc:
                return None, str(exc)
        return self._specs[location], None

    def view(self) -> RegistryView:
        models = {}
        for name, m in self._models.items():
            spec, err = self._spec(m.path)
            models[name] = ModelConfig(
                name=name,
                version=m.version,
                path=self._repository.folder(m.path),
                replicas=m.replicas,
                latency_objective_ms=m.latency_objective_ms,
                max_batch_size=m.max_batch_size,
                batch_delay_ms=m.batch_delay_ms,
                spec=spec,
                spec_error=err,
                previous_versions=tuple(m.previous_versions),
                previous_paths=tuple(m.previous_paths),
                location=m.path,
                group=m.group,
                retired_versions=tuple(m.retired_versions),
                retired_paths=tuple(m.retired_paths),
            )
        apps = {}
        for name, a in self._apps.items():
            links = sorted(
                (r.updated_us, model)
                for (app, model), r in self._links.items()
                if app == name and r.linked
            )
            apps[name] = AppConfig(
                name=name,
                policy=a.policy,
                slo_ms=a.slo_ms,
                default_output=a.default_output,
                policy_config=dict(a.policy_config or {}),
                models=tuple(model for _, model in links),
            )
        return RegistryView(apps=apps, models=models, groups=groups_of(models))


class RegistryFollower:
    """Reads the registry topic from the beginning in a thread and keeps a current view."""

    def __init__(self, settings: Settings, on_change: Callable[[RegistryView], None] | None = None,
                 idle_poll_s: float = IDLE_POLL_S) -> None:
        self._settings = settings
        self._idle_poll_s = idle_poll_s  # how soon ``stop`` is seen: short for a one-off read
        self._topic = Catalogue.from_settings(settings).registry.name
        self._state = RegistryState(Repository.from_settings(settings))
        self._view = RegistryView()
        self._listeners = [on_change] if on_change else []
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._dead: DeadLetters | None = None  # made at the first record refused

    def add_listener(self, callback: Callable[[RegistryView], None]) -> None:
        self._listeners.append(callback)

    def start(self) -> "RegistryFollower":
        ensure_core_topics(self._settings)
        # every stage and verb follows the registry: each publishes the schemas it writes with,
        # and reads a newer version's records, before it writes or reads any
        install_schemas(self._settings)
        self._thread = threading.Thread(target=self._run, name="registry", daemon=True)
        self._thread.start()
        return self

    def wait_ready(self, timeout_s: float = 30.0) -> RegistryView:
        if not self._ready.wait(timeout_s):
            raise InfraError(f"registry topic {self._topic} not read within {timeout_s:.0f}s: {_KAFKA_MUST_ANSWER}")
        return self._view

    def view(self) -> RegistryView:
        return self._view

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        conf = consumer_config(
            self._settings, f"registry-{uuid.uuid4().hex}", **{"enable.auto.commit": False}
        )
        consumer = Consumer(conf)
        try:
            learn_leaders(consumer, [self._topic])
            tp = TopicPartition(self._topic, 0, OFFSET_BEGINNING)
            consumer.assign([tp])
            _, high = watermarks(consumer, tp)
            if high <= 0:
                self._ready.set()
            while not self._stop.is_set():
                # short polls until caught up, as every stage's start waits for that; then a
                # poll returns with the first record, and the rest already fetched come with it
                first = consumer.poll(self._idle_poll_s if self._ready.is_set() else 0.01)
                msgs = [first, *consumer.consume(499, timeout=0)] if first is not None else []
                if not msgs and not self._ready.is_set():
                    # compaction leaves gaps in offsets: compare the position, not the last offset
                    pos = consumer.position([tp])[0].offset
                    if pos >= high:
                        self._ready.set()
                changed = False
                caught_up = False
                for msg in msgs:
                    if msg.error():
                        continue
                    try:
                        self._state.apply(msg.key().decode(), msg.value())
                        changed = True
                    except Exception as exc:  # any record: a bad one changes nothing, the follower goes on
                        self._refuse(msg, exc)
                    if msg.offset() + 1 >= high:
                        caught_up = True
                if changed:
                    self._view = self._state.view()
                    for cb in self._listeners:
                        try:
                            cb(self._view)
                        except Exception:  # a listener's bug must not stop the follower
                            log.exception("registry listener failed")
                if caught_up:
                    # only after the view holds every record that existed at start
                    self._ready.set()
        except KafkaException as exc:
            log.error("registry follower stopped: %s", exc)
        finally:
            consumer.close()
            if self._dead is not None:
                self._dead.producer.flush(2)

    def _refuse(self, msg: Any, exc: Exception) -> None:
        """Skip a registry record that cannot be applied; one that arrives while the stage runs
        is also a dead letter (the ones read at start were dead-lettered when they arrived, and
        every restart would write them again)."""
        log.warning("skipping registry record at offset %s: %s", msg.offset(), exc)
        if not self._ready.is_set():
            return
        if self._dead is None:
            self._dead = DeadLetters(Producer(producer_config(self._settings)),
                                     Catalogue.from_settings(self._settings).deadletter.name, stage="registry")
        self._dead.send(reason=f"registry record refused: {type(exc).__name__}: {exc}", msg=msg)


def read_view(settings: Settings, timeout_s: float = 30.0) -> RegistryView:
    """A one-off snapshot of the registry (CLI verbs, tests)."""
    follower = RegistryFollower(settings, idle_poll_s=ONE_OFF_POLL_S).start()
    try:
        return follower.wait_ready(timeout_s)
    finally:
        follower.stop()


class RegistryWriter:
    """Publishes registry records; one producer for a group of changes."""

    def __init__(self, settings: Settings) -> None:
        ensure_core_topics(settings)
        self._topic = Catalogue.from_settings(settings).registry.name
        self._producer = Producer(producer_config(settings, acks="all"))
        self._repository = Repository.from_settings(settings)
        self._last_us = 0

    def _now(self) -> int:
        # strictly increasing, so links written in one go keep the order they were written in
        self._last_us = max(now_us(), self._last_us + 1)
        return self._last_us

    def _put(self, key: str, record: Record | None) -> None:
        value = encode(record) if record is not None else None
        self._producer.produce(self._topic, key=key.encode(), value=value)
        self._producer.poll(0)

    def app(
        self,
        name: str,
        policy: str = NEW_APP_POLICY,
        slo_ms: float = NEW_APP_SLO_MS,
        default_output: Any = None,
        policy_config: dict[str, float] | None = None,
    ) -> None:
        check_name("app", name)
        check_slo(slo_ms, f"app {name}: slo_ms")
        self._put(f"app:{name}", App(
            name=name,
            policy=policy,
            slo_ms=float(slo_ms),
            default_output=default_output,
            policy_config={k: float(v) for k, v in (policy_config or {}).items()},
            updated_us=self._now(),
        ))

    def model(self, name: str, version: str, path: str | Path, replicas: int = 1, **knobs: Any) -> None:
        """``path``: a local folder (a ``Path``: recorded relative to the model repository when
        it lies inside it) or a location as the registry records it (a ``str``)."""
        check_name("model", name)
        check_replicas(replicas, f"model {name}: replicas")
        for key, value in knobs.items():
            if key in KNOBS and value is not None:
                check_knob(key, value, f"model {name}: {key}")
        record = Model(
            name=name,
            version=str(version),
            path=self._repository.location_of(path) if isinstance(path, Path) else str(path),
            replicas=int(replicas),
            previous_versions=list(knobs.pop("previous_versions", [])),
            previous_paths=list(knobs.pop("previous_paths", [])),
            latency_objective_ms=knobs.pop("latency_objective_ms", None),
            max_batch_size=knobs.pop("max_batch_size", None),
            batch_delay_ms=knobs.pop("batch_delay_ms", None),
            updated_us=self._now(),
            group=knobs.pop("group", None),
            retired_versions=list(knobs.pop("retired_versions", [])),
            retired_paths=list(knobs.pop("retired_paths", [])),
        )
        if record.group is not None:
            check_name("group", record.group)
            if record.group == name:
                raise ConfigError(f"model {name}: its group needs a name of its own")
        if knobs:
            raise ConfigError(f"model {name}: unknown settings {sorted(knobs)}")
        self._put(f"model:{name}", record)

    def link(self, app: str, model: str, linked: bool = True) -> None:
        check_name("app", app)
        check_name("model", model)
        self._put(f"link:{app}:{model}", Link(app=app, model=model, linked=linked, updated_us=self._now()))

    def delete(self, key: str) -> None:
        self._put(key, None)

    def flush(self, timeout_s: float = 10.0) -> None:
        left = self._producer.flush(timeout_s)
        if left:
            raise InfraError(f"{left} registry records not delivered within {timeout_s:.0f}s: {_KAFKA_MUST_ANSWER}")

    def __enter__(self) -> "RegistryWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.flush()


def wait_for(
    settings: Settings, predicate: Callable[[RegistryView], bool], timeout_s: float = 10.0
) -> RegistryView:
    """Follow the registry until ``predicate(view)`` holds (tests, CLI)."""
    follower = RegistryFollower(settings, idle_poll_s=ONE_OFF_POLL_S).start()
    try:
        follower.wait_ready(timeout_s)
        deadline = time.monotonic() + timeout_s
        while not predicate(follower.view()):
            if time.monotonic() > deadline:
                raise InfraError(f"registry did not reach the expected state in time: {_KAFKA_MUST_ANSWER}")
            time.sleep(0.02)
        return follower.view()
    finally:
        follower.stop()
