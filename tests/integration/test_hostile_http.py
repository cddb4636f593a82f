"""Hostile HTTP against a real gateway process (the test plays the selector): bodies that
trickle in, bodies over the limit with and without Content-Length, and HTTPS."""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from clipstream.settings import Settings
from clipstream.testing.procs import wait_until
from registry.topic import RegistryWriter
from tests.integration.test_gateway import APP_SLO_MS, GOOD, MODEL_YAML, FakeSelector, GatewayProcess

pytestmark = [pytest.mark.integration, pytest.mark.component]  # the test plays a neighbouring stage

LIMIT = 4  # admission slots: fewer than the slow callers below


@pytest.fixture(scope="module")
def hostile_settings(infra: Any) -> Settings:
    return Settings(kafka_bootstrap=infra.kafka_bootstrap, redis_url=infra.redis_url,
                    topic_prefix=f"h{uuid.uuid4().hex[:12]}.")


@pytest.fixture(scope="module")
def fake_selector(hostile_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeSelector]:
    folder = tmp_path_factory.mktemp("m1")
    (folder / "model.yaml").write_text(MODEL_YAML)
    with RegistryWriter(hostile_settings) as writer:
        writer.model("m1", "1", folder)
        writer.app("pets", policy="exp4", slo_ms=APP_SLO_MS, default_output="unknown")
        writer.link("pets", "m1")
    fake = FakeSelector(hostile_settings)
    yield fake
    fake.close()


@pytest.fixture(scope="module")
def gateway(hostile_settings: Settings, fake_selector: FakeSelector,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    gw = GatewayProcess(hostile_settings, tmp_path_factory.mktemp("gw") / "gw.log", instance="hostile",
                        max_inflight=str(LIMIT), adaptive_admission="false", body_timeout_s="1.5",
                        max_loop_lag_ms="1000")  # a loaded test machine must not shed these callers
    yield gw
    gw.stop()


def _slow_caller(url: str) -> socket.socket:
    """A predict request whose headers promise 200 bytes and whose body starts with one."""
    parts = urlsplit(url)
    s = socket.create_connection((parts.hostname, parts.port), timeout=10)
    s.sendall(b"POST /v1/apps/pets/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: 200\r\n\r\n{")
    return s


def _answer_of(s: socket.socket) -> bytes:
    data = b""
    try:
        while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    finally:
        s.close()
    return data


def test_slow_bodies_hold_no_admission_slot_and_get_408(gateway: GatewayProcess) -> None:
    slow = [_slow_caller(gateway.url) for _ in range(2 * LIMIT)]
    stop = threading.Event()

    def trickle() -> None:  # one byte per socket every 0.2 s, as a slow-loris client does
        while not stop.wait(0.2):
            for s in slow:
                try:
                    s.send(b" ")
                except OSError:
                    pass

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        with httpx.Client(base_url=gateway.url, timeout=5) as http:
            # every slow request is in, its body trickling, before the good ones come
            wait_until(lambda: f"clipstream_gateway_reading_bodies {2 * LIMIT}.0" in http.get("/metrics").text, 10,
                       "the gateway to be reading every slow body")
            for _ in range(3 * LIMIT):
                r = http.post("/v1/apps/pets/predict", json={"input": GOOD})
                assert r.status_code == 200, r.text  # no slot is held by the slow ones
    finally:
        stop.set()
        thread.join(2)
    answers = [_answer_of(s) for s in slow]
    for a in answers:
        assert a.startswith(b"HTTP/1.1 408"), a[:200]
        assert b"not received within 1.5 s" in a
    with httpx.Client(base_url=gateway.url, timeout=5) as http:  # a body given up is no longer counted
        assert "clipstream_gateway_reading_bodies 0.0" in http.get("/metrics").text


def test_a_4mb_body_gets_a_readable_413(gateway: GatewayProcess) -> None:
    body = b'{"input": [' + b"1," * (2 << 20) + b'1]}'
    with httpx.Client(base_url=gateway.url, timeout=10) as http:
        r = http.post("/v1/apps/pets/predict", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 413 and "over the limit" in r.json()["detail"]

        def chunked() -> Iterator[bytes]:  # no Content-Length: Transfer-Encoding chunked
            for i in range(0, len(body), 64 << 10):
                yield body[i:i + (64 << 10)]

        r = http.post("/v1/apps/pets/predict", content=chunked())
        assert r.request.headers.get("transfer-encoding") == "chunked"
        assert r.status_code == 413 and "over the limit of 1048576 bytes" in r.json()["detail"]
        r = http.post("/v1/apps/pets/feedback", content=chunked())
        assert r.status_code == 413
        assert http.post("/v1/apps/pets/predict", json={"input": GOOD}).status_code == 200


@pytest.mark.parametrize("length", [b"abc", b"-5", b"1e3"])
def test_a_content_length_that_is_no_number_gets_the_gateways_json_400(gateway: GatewayProcess, length: bytes) -> None:
    """uvicorn's parser refuses it before the app runs; the gateway's protocol still answers in JSON."""
    parts = urlsplit(gateway.url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as s:
        s.sendall(b"POST /v1/apps/pets/predict HTTP/1.1\r\nHost: x\r\nContent-Length: " + length + b"\r\n\r\n")
        data = b""
        while chunk := s.recv(4096):  # to the close: the server ends the connection
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ") and b"content-type: application/json" in head.lower(), data
    assert "Content-Length" in json.loads(body)["detail"]
    with httpx.Client(base_url=gateway.url, timeout=10) as http:  # a new connection is served
        assert http.post("/v1/apps/pets/predict", json={"input": GOOD}).status_code == 200


def _self_signed(folder: Path) -> tuple[Path, Path]:
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
                    "-out", str(cert)], check=True, capture_output=True)
    return cert, key


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_the_gateway_serves_https_with_the_configured_certificate(
        hostile_settings: Settings, fake_selector: FakeSelector, tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    gw = GatewayProcess(hostile_settings, tmp_path / "gw.log", instance="tls", tls_cert=str(cert), tls_key=str(key),
                        max_loop_lag_ms="1000")
    try:
        assert gw.url.startswith("https://")
        with httpx.Client(base_url=gw.url, verify=ssl.create_default_context(cafile=str(cert)), timeout=5) as http:
            assert http.get("/healthz").status_code == 200
            assert http.post("/v1/apps/pets/predict", json={"input": GOOD}).status_code == 200
        with pytest.raises(httpx.HTTPError):  # no plain HTTP on the TLS port
            httpx.get(gw.url.replace("https://", "http://") + "/healthz", timeout=5)
    finally:
        gw.stop()


def test_a_record_on_the_reply_topic_that_is_no_response_is_a_dead_letter(
        gateway: GatewayProcess, hostile_settings: Settings) -> None:
    from confluent_kafka import Producer

    from clipstream.testing.procs import wait_until
    from topics import Catalogue, producer_config
    from topics.deadletters import latest

    topic = Catalogue.from_settings(hostile_settings).replies("hostile").name
    producer = Producer(producer_config(hostile_settings))
    producer.produce(topic, b"\x03no response", partition=0)
    producer.flush(10)
    dead = wait_until(lambda: next((d for d in latest(hostile_settings, 50, 5.0)
                                    if d.stage == "gateway" and d.source_topic == topic), None),
                      20, "the gateway's dead letter")
    assert "undecodable reply" in dead.reason and dead.payload == b"\x03no response"
    with httpx.Client(base_url=gateway.url, timeout=5) as http:
        assert http.post("/v1/apps/pets/predict", json={"input": GOOD}).status_code == 200
