"""A local Kafka broker that wants credentials: a SASL_SSL listener (SCRAM-SHA-512) with a
self-signed CA made at start-up, for testing clipstream's Kafka security settings end to end.

The controller listener stays PLAINTEXT on 127.0.0.1 (it is the node talking to itself); the
one listener clients reach authenticates every connection, so a client without the
credentials (or without trusting the CA) is refused. The SCRAM user is created when the
storage is formatted (``--add-scram``), as KRaft has no ZooKeeper to hold it.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clipstream.errors import InfraError
from clipstream.infra import kafka as kafka_mod
from clipstream.infra import last_line, require_binary
from clipstream.settings import Settings

MECHANISM = "SCRAM-SHA-512"
OPENSSL_HINT = "apt-get install -y openssl"


@dataclass(frozen=True)
class SecureBroker:
    """A started secured broker: where it listens, the CA clients must trust, its process."""

    bootstrap: str
    ca: Path
    username: str
    process: subprocess.Popen[bytes]
    files: kafka_mod.BrokerFiles

    def client_env(self, password: str) -> dict[str, str]:
        """The ``CLIPSTREAM_KAFKA_*`` variables a stage needs to reach this broker."""
        return {
            "CLIPSTREAM_KAFKA_BOOTSTRAP": self.bootstrap,
            "CLIPSTREAM_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "CLIPSTREAM_KAFKA_SASL_MECHANISM": MECHANISM,
            "CLIPSTREAM_KAFKA_SASL_USERNAME": self.username,
            "CLIPSTREAM_KAFKA_SASL_PASSWORD": password,
            "CLIPSTREAM_KAFKA_SSL_CA_LOCATION": str(self.ca),
        }

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)


def make_certificates(folder: Path) -> tuple[Path, Path]:
    """A CA and a server certificate for 127.0.0.1 signed by it: (ca.pem, server.pem with the
    unencrypted PKCS#8 key and the certificate, Kafka's PEM keystore)."""
    openssl = require_binary("openssl", OPENSSL_HINT)
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca, key, csr, cert = (folder / n for n in ("ca.key", "ca.pem", "server.key", "server.csr", "server.crt"))
    ext = folder / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    steps = [
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=clipstream local CA",
         "-keyout", str(ca_key), "-out", str(ca)],
        [openssl, "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", str(key),
         "-out", str(csr)],
        [openssl, "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
         "-days", "2", "-extfile", str(ext), "-out", str(cert)],
    ]
    for argv in steps:
        _openssl(argv, folder)
    pkcs8 = _openssl([openssl, "pkcs8", "-topk8", "-nocrypt", "-in", str(key)], folder)
    keystore = folder / "server.pem"
    keystore.write_text(pkcs8 + cert.read_text())
    for private in (ca_key, key, keystore):  # the keys: for the owner only, like the password file
        private.chmod(0o600)
    return ca, keystore


def _openssl(argv: list[str], folder: Path) -> str:
    """Run one openssl step and return its stdout; a failure is an InfraError with openssl's
    last line, not a CalledProcessError traceback."""
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise InfraError(f"openssl {argv[1]} failed making the broker's certificates in {folder}: "
                         f"{last_line(result)}; check that {folder} is writable and `openssl version` runs, "
                         "then retry")
    return result.stdout


def secure_properties(port: int, controller_port: int, keystore: Path, ca: Path, username: str,
                      password: str) -> dict[str, str]:
    """server.properties entries (over ``kafka.render_server_properties``'s) for one SASL_SSL
    client listener with SCRAM-SHA-512, also used between the node and itself."""
    jaas = (f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{username}" '
            f'password="{password}";')
    return {
        "listeners": f"SASL_SSL://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"SASL_SSL://127.0.0.1:{port}",
        "listener.security.protocol.map": "SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "SASL_SSL",
        "sasl.enabled.mechanisms": MECHANISM,
        "sasl.mechanism.inter.broker.protocol": MECHANISM,
        f"listener.name.sasl_ssl.{MECHANISM.lower()}.sasl.jaas.config": jaas,
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(keystore),
        "ssl.truststore.type": "PEM",  # the node connects to itself, trusting the CA as clients do
        "ssl.truststore.location": str(ca),
        "ssl.client.auth": "none",
    }


def start_secure_broker(settings: Settings, state_dir: Path, port: int, controller_port: int, username: str,
                        password: str, timeout_s: float = 90.0) -> SecureBroker:
    """Format, start and wait for a one-node secured broker in ``state_dir`` (which it owns)."""
    java = require_binary("java", kafka_mod.JAVA_HINT)
    libs = kafka_mod.fetch_jars(settings, progress=lambda _: None)
    ca, keystore = make_certificates(state_dir / "tls")
    files = kafka_mod.write_broker_files(state_dir, port, controller_port,
                                         extra=secure_properties(port, controller_port, keystore, ca, username, password))
    files.config.chmod(0o600)  # its JAAS line holds the password
    kafka_mod.format_storage(java, libs, files, scram=[f"{MECHANISM}=[name={username},password={password}]"])
    proc = kafka_mod.start_broker(java, libs, files, die_with_parent=True)
    broker = SecureBroker(f"127.0.0.1:{port}", ca, username, proc, files)
    _wait(broker, secured_settings(settings, broker, password), timeout_s)
    return broker


def secured_settings(settings: Settings, broker: SecureBroker, password: str) -> Settings:
    """``settings`` aimed at ``broker`` with its credentials."""
    over = {k.removeprefix("CLIPSTREAM_").lower(): v for k, v in broker.client_env(password).items()}
    return Settings(**{**settings.model_dump(), **over})


def _wait(broker: SecureBroker, settings: Settings, timeout_s: float) -> None:
    from confluent_kafka.admin import AdminClient

    from topics.client import admin_config

    admin = AdminClient(admin_config(settings))
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        if broker.process.poll() is not None:
            break
        try:
            if admin.list_topics(timeout=2).brokers:
                return
        except Exception as exc:  # not up yet
            last = exc
        time.sleep(0.5)
    tail = broker.files.log.read_text()[-2000:] if broker.files.log.exists() else ""
    broker.stop()
    raise InfraError(f"the secured broker did not answer within {timeout_s:.0f}s ({last}): read its log "
                     f"{broker.files.log} for why, then retry (with another --port if {broker.bootstrap} is "
                     f"taken); the log ends:\n{tail}")
