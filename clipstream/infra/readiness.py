"""Is a Kafka node up? Checks for ``infra up``'s wait and for ``up``'s "is Kafka there?".

A broker is ready when it serves metadata; a cluster when, in addition, every node itself lists
every node as a live broker.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Mapping
from typing import Any


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed by the broker")
        data += chunk
    return data


def listed_brokers(address: str, timeout_s: float = 1.0) -> int | None:
    """How many live brokers the node at ``host:port`` itself lists; None while it does not
    answer.

    A raw Metadata v4 request (no topics) to that node alone: an AdminClient would ask whichever
    broker it likes. A node answers only once its startup is done, and each node learns of the
    others' registrations a moment apart, so a cluster is ready when every node lists all of
    them; until then a topic created through a node that lists two would get two copies.
    """
    host, _, port = address.rpartition(":")
    client_id = b"clipstream-probe"
    header = struct.pack(">hhih", 3, 4, 1, len(client_id)) + client_id  # Metadata v4, id 1
    body = struct.pack(">ib", 0, 0)  # no topics; do not create any
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s) as sock:
            sock.sendall(struct.pack(">i", len(header) + len(body)) + header + body)
            # size, correlation id, throttle time, then the brokers array's length
            _size, correlation_id, _throttle, brokers = struct.unpack(">iiii", _recv_exact(sock, 16))
    except OSError:  # refused, reset, closed or timed out: not serving yet
        return None
    return brokers if correlation_id == 1 else None


class MetadataProbe:
    """Answers "does the broker serve metadata yet?" with one reused AdminClient.

    A TCP check comes first so the client is not created (and does not log connection
    refusals) while the JVM is still starting. ``brokers``: how many brokers the metadata must
    list (a cluster is ready once every node has registered).
    """

    def __init__(self, bootstrap: str, brokers: int = 1, client_config: Mapping[str, Any] | None = None) -> None:
        """``client_config``: the clients' settings (security among them), for a broker that
        answers only clients that speak its protocol."""
        self.bootstrap = bootstrap
        self.brokers = brokers
        self._config = dict(client_config or {})
        host, _, port = bootstrap.split(",")[0].rpartition(":")
        self._host, self._port = host or "127.0.0.1", int(port)
        self._client: object | None = None
        self.refused: str | None = None  # a broker answered and refused the client's credentials

    def __call__(self) -> bool:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        if not _port_open(self._host, self._port):
            return False
        if self.brokers > 1 and not all(
            (listed_brokers(a) or 0) >= self.brokers for a in self.bootstrap.split(",")
        ):
            return False
        if self._client is None:
            self._client = AdminClient(
                {
                    **self._config,
                    "bootstrap.servers": self.bootstrap,
                    "log_level": 0,  # refusals while starting are expected, not news
                    "reconnect.backoff.ms": 50,
                    "reconnect.backoff.max.ms": 200,
                    "error_cb": self._error,
                }
            )
        try:
            metadata = self._client.list_topics(timeout=1.0)  # type: ignore[attr-defined]
        except KafkaException:
            self._client.poll(0)  # type: ignore[attr-defined]  # its error callbacks: a refusal says why
            return False
        return len(metadata.brokers) >= self.brokers

    def _error(self, err: Any) -> None:
        from confluent_kafka import KafkaError

        if err.code() in (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED):
            self.refused = err.str()


def kafka_answers(bootstrap: str, client_config: Mapping[str, Any] | None = None) -> bool:
    """One-shot check that a broker at ``bootstrap`` serves metadata (to a client with
    ``client_config``: a secured broker refuses one without its security settings)."""
    return MetadataProbe(bootstrap, client_config=client_config)()


def kafka_refusal(bootstrap: str, client_config: Mapping[str, Any] | None = None) -> tuple[bool, str | None]:
    """``kafka_answers``, and when it does not, the broker's refusal of the client's
    credentials if that is why (None: nothing answered)."""
    probe = MetadataProbe(bootstrap, client_config=client_config)
    ok = probe()
    return ok, None if ok else probe.refused
