"""A stage reads the records of a newer clipstream while a pipeline is upgraded stage by stage:
a running selector answers a query written with a schema it was not built with, once the newer
writer has published that schema to the schemas topic (``topics.schema_topic``)."""

from __future__ import annotations

import io
import json
import threading
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from confluent_kafka import Producer
from fastavro import schemaless_writer
from fastavro.schema import parse_schema, to_parsing_canonical_form

from clipstream.clock import now_us
from clipstream.settings import Settings
from schemas import QueryEvent, Tensor
from schemas.codec import MAGIC, Codec, schema_fingerprint
from schemas.records import to_avro
from tests.integration.test_selector_service import Client, fake_models, process, publish_app, python_models
from topics import Catalogue, producer_config
from topics.schema_topic import SchemaLookup

pytestmark = pytest.mark.integration


def _newer_query_schema() -> Any:
    """QueryEvent as a later version might write it: one field more, and one of today's
    (``context``, which has a default) left out."""
    canonical = json.loads(to_parsing_canonical_form(Codec().schema("QueryEvent").parsed))
    canonical["fields"] = [f for f in canonical["fields"] if f["name"] != "context"]
    canonical["fields"].append({"name": "priority", "type": "int", "default": 0})
    return parse_schema(canonical, _write_hint=False)


def _written_with(schema: Any, ev: QueryEvent) -> bytes:
    fields = {k: v for k, v in to_avro(ev).items() if k != "context"}
    buf = io.BytesIO()
    buf.write(MAGIC + schema_fingerprint(schema))
    schemaless_writer(buf, schema, {**fields, "priority": 3})
    return buf.getvalue()


def test_a_running_selector_answers_a_query_written_by_a_newer_version(settings: Settings, tmp_path: Path) -> None:
    cat = Catalogue.from_settings(settings)
    app = f"up{uuid.uuid4().hex[:6]}"
    models = python_models(tmp_path)
    publish_app(settings, {m: p for m, p in models.items() if m != "m3"}, app)
    stop = threading.Event()
    faker = threading.Thread(target=fake_models, args=(settings, ["m1", "m2"], stop, set()), daemon=True)
    faker.start()
    client = Client(settings)
    try:
        with process(["selector"], settings):
            client.warm_up(app)
            # this version's schemas were published by the stage (and the verbs) at start
            published = {to_parsing_canonical_form(parse_schema(s, _write_hint=False))
                         for s in SchemaLookup(settings, Codec())._schemas()}
            assert set(Codec().written().values()) <= published

            newer = _newer_query_schema()
            now = now_us()
            ev = QueryEvent(query_id=uuid.uuid4().hex, app=app, context=None,
                            input=Tensor.of(np.array([0.1, 0.9], np.float32)), created_us=now,
                            deadline_us=now + 5_000_000, reply_topic=client.reply.name, reply_partition=0,
                            trace={"produced": now})
            producer = Producer(producer_config(settings))
            # the newer writer publishes its schema before it writes a record with it
            producer.produce(cat.schemas.name, key=schema_fingerprint(newer).hex().encode(),
                             value=to_parsing_canonical_form(newer).encode())
            producer.produce(cat.queries.name, _written_with(newer, ev), key=ev.query_id.encode())
            assert producer.flush(10) == 0
            answer, _ = client.answer(ev.query_id, timeout_s=20)
            assert not answer.is_default and sorted(answer.answered) == ["m1", "m2"], answer
    finally:
        stop.set()
        faker.join(10)
        client.close()
