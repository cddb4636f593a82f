"""A small faust-streaming app, run as its own process by tests/integration/test_faust.py.

It reads QueryEvent records (raw bytes, our Avro codec), and answers each with a Response on
another topic: proof that faust-streaming + aiokafka work against the project's broker.
"""

from __future__ import annotations

import os
import tempfile

from batchers.app import faust_app
from clipstream.clock import now_us
from clipstream.settings import get_settings
from schemas import QueryEvent, Response, decode_as, encode

settings = get_settings()
IN_TOPIC = os.environ["ECHO_IN"]
OUT_TOPIC = os.environ["ECHO_OUT"]

# the same faust settings the batcher runs with
app = faust_app(
    settings,
    os.environ.get("ECHO_APP_ID", "clipstream-faust-echo"),
    tempfile.mkdtemp(prefix="faust-echo-"),
    consumer_auto_offset_reset="earliest",
)
queries = app.topic(IN_TOPIC, value_type=bytes, key_type=bytes)
responses = app.topic(OUT_TOPIC, value_type=bytes, key_type=bytes)


@app.agent(queries)
async def answer(stream):  # type: ignore[no-untyped-def]
    async for value in stream:
        q = decode_as(QueryEvent, value)
        response = Response(
            query_id=q.query_id,
            app=q.app,
            output=len(q.input.data),
            scores=None,
            labels=None,
            confidence=1.0,
            is_default=False,
            default_reason=None,
            answered=["faust"],
            missing=[],
            created_us=now_us(),
            deadline_us=q.deadline_us,
            trace={},
        )
        await responses.send(key=q.query_id.encode(), value=encode(response))


if __name__ == "__main__":
    app.main()
