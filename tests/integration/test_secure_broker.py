"""The pipeline through a broker that wants credentials (SASL_SSL, SCRAM-SHA-512, a CA made at
start-up): selector, batcher and worker connect with the configured ones and answer a query;
a client without them, or with a wrong password, is refused."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from clipstream.infra.secure import SecureBroker, secured_settings
from clipstream.settings import Settings
from tests.integration.test_selector_service import Client, process, publish_app, python_models
from topics.admin import ensure_core_topics, ensure_topics
from topics.catalogue import Catalogue
from topics.client import admin_config

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")]

PASSWORD = "s3cret-" + uuid.uuid4().hex[:8]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def broker(infra: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    """The broker as a user starts it: ``clipstream infra up --secure``, in the foreground, with
    the password from the environment; the exports it prints say where it is and what to trust."""
    env = dict(os.environ, CLIPSTREAM_KAFKA_SASL_PASSWORD=PASSWORD, PYTHONUNBUFFERED="1")
    state = tmp_path_factory.mktemp("secure")
    proc = subprocess.Popen([sys.executable, "-m", "clipstream.cli", "infra", "up", "--secure", "--kafka-port",
                             str(_free_port()), "--state-dir", str(state)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    exports: dict[str, str] = {}
    lines: list[str] = []
    for line in proc.stdout:  # ends when it exits: a failed start fails below with what it said
        lines.append(line.rstrip())
        if line.startswith("export "):
            key, _, value = line[len("export "):].strip().partition("=")
            exports[key] = value
        if line.startswith("ready: secure broker"):
            break
    assert proc.poll() is None and exports, "clipstream infra up --secure did not start:\n" + "\n".join(lines)
    assert PASSWORD not in "\n".join(lines)  # never printed
    b = SecureBroker(exports["CLIPSTREAM_KAFKA_BOOTSTRAP"], Path(exports["CLIPSTREAM_KAFKA_SSL_CA_LOCATION"]),
                     exports["CLIPSTREAM_KAFKA_SASL_USERNAME"], proc, None)  # type: ignore[arg-type]
    yield b
    proc.send_signal(signal.SIGINT)  # it stops its broker on the way out
    proc.wait(30)
    assert not list(state.glob("secure-*")), "its CA key and password are left behind"  # useless to any other


def _refused(conf: dict[str, Any]) -> bool:
    try:
        AdminClient(conf).list_topics(timeout=5)
    except KafkaException:
        return True
    return False


def test_a_client_without_the_credentials_is_refused(broker: SecureBroker) -> None:
    base = Settings(kafka_bootstrap=broker.bootstrap)
    assert _refused(admin_config(base))  # plaintext: no TLS, no SASL
    wrong = secured_settings(base, broker, "not-the-password")
    assert _refused(admin_config(wrong))
    untrusted = dict(admin_config(secured_settings(base, broker, PASSWORD)), **{"ssl.ca.location": "probe"})
    assert _refused(untrusted)  # the broker's certificate is not trusted without its CA


def test_a_wrong_password_is_said_as_refused_credentials_not_as_a_broker_away(broker: SecureBroker,
                                                                               tmp_path: Path) -> None:
    """The broker answered: the line names the credentials to check, at once, rather than
    sending the user to look for a Kafka that is there."""
    from clipstream.infra.readiness import kafka_refusal

    wrong = secured_settings(Settings(kafka_bootstrap=broker.bootstrap), broker, "not-the-password")
    ok, refused = kafka_refusal(broker.bootstrap, admin_config(wrong))
    assert not ok and refused is not None and "uthentication" in refused
    env = dict(os.environ, **broker.client_env("not-the-password"), CLIPSTREAM_STATE_DIR=str(tmp_path / "state"))
    (tmp_path / "none.yaml").write_text("apps: []\n")
    for args in (["inspect"], ["deadletters"], ["up", "-f", str(tmp_path / "none.yaml")]):
        done = subprocess.run([sys.executable, "-m", "clipstream.cli", *args], env=env, capture_output=True,
                              text=True, timeout=120)
        said = done.stdout + done.stderr
        assert done.returncode != 0 and "refused this client's credentials" in said, said
        assert "CLIPSTREAM_KAFKA_SASL_PASSWORD" in said and "does not answer" not in said, said
        assert "not-the-password" not in said


def test_the_files_holding_its_password_and_keys_are_the_owners_alone(
    broker: SecureBroker, tmp_path_factory: pytest.TempPathFactory
) -> None:
    state = next(tmp_path_factory.getbasetemp().glob("secure*"))
    secret = [*state.rglob("server.properties"), *state.rglob("*.key"), *state.rglob("server.pem")]
    assert len(secret) >= 4, secret
    assert {f.name: oct(f.stat().st_mode & 0o777) for f in secret} == {f.name: "0o600" for f in secret}
    assert any(PASSWORD in f.read_text() for f in secret)  # the JAAS line: why it is the owner's alone


def test_the_pipeline_answers_through_the_secured_broker(broker: SecureBroker, infra: Any, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    settings = secured_settings(Settings(redis_url=infra.redis_url, topic_prefix=f"s{uuid.uuid4().hex[:10]}."),
                                broker, PASSWORD)
    for key, value in broker.client_env(PASSWORD).items():  # the stages' processes inherit these
        monkeypatch.setenv(key, value)
    ensure_core_topics(settings)
    name, folder = next(iter(python_models(tmp_path, f"-{uuid.uuid4().hex[:6]}").items()))
    ensure_topics(settings, Catalogue.from_settings(settings).for_model(name))
    app = f"app{uuid.uuid4().hex[:6]}"
    publish_app(settings, {name: folder}, app, slo_ms=3000)
    client = Client(settings)
    try:
        with ExitStack() as stack:
            stack.enter_context(process(["worker", "--model", name, "--path", str(folder)], settings, 90))
            stack.enter_context(process(["batcher", "--model", name, "--version", "1", "--replicas", "1"],
                                        settings, 90))
            stack.enter_context(process(["selector"], settings, 90))
            client.warm_up(app, slo_ms=3000, timeout_s=60)
            rec, _ = client.answer(client.query([0.1, 0.9], app, slo_ms=3000).query_id)
            assert not rec.is_default and rec.output == 1 and rec.answered == [name]
    finally:
        client.close()
