"""A model applied on one host is served by a worker on another, each with its own repository.

The applier's repository root is folder A; the worker runs from another working directory
with its root at B (a copy of the model, A deleted), either as a folder (a shared filesystem
mounted elsewhere) or behind an HTTP server (an object store, reached through fsspec).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from clipstream.clock import now_us
from clipstream.settings import Settings
from clipstream.testing.models import digits, make_onnx_digits_model
from clipstream.testing.procs import stop_process, wait_until
from registry.spec import load_spec
from registry.topic import wait_for
from schemas import Batch, BatchItem, Predictions, Tensor, decode_as, encode
from topics import Catalogue
from topics.admin import ensure_core_topics
from topics.client import admin_config, consumer_config, producer_config
from workers.backends import load_model

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
CLI = str(ROOT / ".venv" / "bin" / "clipstream")
APP = """apps:
  - {name: digits, policy: single, models: [logreg]}
models:
  - {name: logreg, version: "1", path: digits/logreg/1}
"""


@pytest.fixture
def http_store(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A folder served over HTTP on a free loopback port: (folder, URL)."""
    folder = tmp_path / "b"
    folder.mkdir()
    server = subprocess.Popen(
        [sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1", "--directory", str(folder)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        line = server.stdout.readline()  # "Serving HTTP on 127.0.0.1 port N ...", once it listens
        port = re.search(r"port (\d+)", line)
        assert port, f"http.server did not start: {line!r}"
        yield folder, f"http://127.0.0.1:{port.group(1)}"
    finally:
        stop_process(server)


def _apply_from(settings: Settings, repository: Path) -> str:
    """``clipstream apply`` run from the applier's repository, with its root set there."""
    ensure_core_topics(settings)
    # a fresh registry topic briefly has no leader, and the registry follower does not retry it
    admin, registry = AdminClient(admin_config(settings)), Catalogue.from_settings(settings).registry.name
    wait_until(lambda: admin.list_topics(registry, timeout=10).topics[registry].partitions[0].leader >= 0,
               30, "a leader for the registry topic")
    env = {**os.environ, "CLIPSTREAM_TOPIC_PREFIX": settings.topic_prefix,
           "CLIPSTREAM_MODEL_REPOSITORY": str(repository)}
    done = subprocess.run([CLI, "apply", "-f", "app.yaml"], cwd=repository, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.parametrize("store", ["folder", "http"])
def test_a_worker_elsewhere_serves_the_model_from_its_own_repository(
    settings: Settings, tmp_path: Path, request: pytest.FixtureRequest, store: str
) -> None:
    a, cwd, cache = tmp_path / "a", tmp_path / "worker-cwd", tmp_path / "cache"
    folder = make_onnx_digits_model(a / "digits", "logreg", "1")
    (a / "app.yaml").write_text(APP)
    cwd.mkdir()
    x, _ = digits()
    expected = load_model(load_spec(folder)).predict_batch(x[:6])

    out = _apply_from(settings, a)
    assert "model logreg version 1 (1 replicas): digits/logreg/1" in out
    record = wait_for(settings, lambda v: "logreg" in v.models, timeout_s=30).models["logreg"]
    assert record.location == "digits/logreg/1"  # not the applier's absolute path

    if store == "http":
        b, root = request.getfixturevalue("http_store")
    else:
        b = tmp_path / "b"
        root = str(b)
    shutil.copytree(a / "digits", b / "digits")
    shutil.rmtree(a)  # the applier's copy is gone: the worker can only use its own repository
    env = {**os.environ, "CLIPSTREAM_TOPIC_PREFIX": settings.topic_prefix, "CLIPSTREAM_WORKER_THREADS": "1",
           "CLIPSTREAM_MODEL_REPOSITORY": root, "CLIPSTREAM_CACHE_DIR": str(cache)}
    log_path = tmp_path / "worker.log"
    with open(log_path, "w") as log:
        worker = subprocess.Popen([CLI, "worker", "--model", "logreg"], cwd=cwd, env=env,
                                  stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: worker.poll() is not None or "ready: worker" in log_path.read_text(),
                   90, "the worker to start")  # a cold start imports ONNX Runtime on 2 busy cores
        assert worker.poll() is None, log_path.read_text()[-3000:]
        copies = list((cache / "models").glob("logreg-1-*"))
        assert len(copies) == (1 if store == "http" else 0)  # only a remote folder is copied

        cat = Catalogue.from_settings(settings)
        items = [BatchItem(query_id=f"q{i}", selector_partition=i % 4, deadline_us=now_us() + 10**7,
                           cache_key=None, input=Tensor.of(x[i]), trace={}) for i in range(6)]
        producer = Producer(producer_config(settings))
        producer.produce(cat.batches("logreg").name, encode(Batch(
            batch_id=uuid.uuid4().hex, model="logreg", version="1", replica=0, created_us=now_us(), items=items,
        )), partition=0)
        assert producer.flush(30) == 0
        got = _predictions(settings, cat.predictions.name, cat.predictions.partitions, 6)
        for i in range(6):
            assert got[f"q{i}"].status == "ok" and got[f"q{i}"].version == "1"
            np.testing.assert_allclose(got[f"q{i}"].output.array(), expected[i], rtol=1e-5)
    finally:
        code = stop_process(worker)
        print(log_path.read_text()[-3000:])  # shown by pytest when the test fails
    assert code == 0


def _predictions(settings: Settings, topic: str, partitions: int, count: int) -> dict:
    consumer = Consumer(consumer_config(settings, f"test-{uuid.uuid4().hex}", **{"enable.auto.commit": False}))
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got: dict = {}
    deadline = time.monotonic() + 60
    try:
        while len(got) < count:
            assert time.monotonic() < deadline, f"only {len(got)} of {count} predictions arrived"
            for msg in consumer.consume(100, 0.2):
                if msg.error() is None:
                    got.update((p.query_id, p) for p in decode_as(Predictions, msg.value()).items)
    finally:
        consumer.close()
    return got
