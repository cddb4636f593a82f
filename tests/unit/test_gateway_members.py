"""Gateway members on one port: ``up`` names them and gives each its own reply topic, and their
sockets share the port (``SO_REUSEPORT``), so connections keep landing while one restarts."""

from __future__ import annotations

import socket

from clipstream.pipeline import gateway_stages
from frontend.gateway_cli import shared_socket


def test_one_gateway_keeps_its_name_and_several_share_the_port_with_reply_topics_of_their_own() -> None:
    ((name, argv),) = gateway_stages(1, "8080")
    assert name == "gateway" and "gateway" in argv
    assert "--reuse-port" not in argv and "--instance" not in argv  # a random instance, a port of its own
    stages = gateway_stages(2, "8080")
    assert [name for name, _ in stages] == ["gateway-1", "gateway-2"]
    instances = [argv[argv.index("--instance") + 1] for _, argv in stages]
    assert len(set(instances)) == 2 and all("--reuse-port" in argv for _, argv in stages)


def test_a_connection_lands_on_the_member_left_when_the_other_closes() -> None:
    first = shared_socket("127.0.0.1", 0, 16)
    port = first.getsockname()[1]
    second = shared_socket("127.0.0.1", port, 16)  # a plain bind would fail: address in use
    try:
        first.close()  # the killed member
        second.setblocking(True)
        second.settimeout(5)
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            conn, _ = second.accept()
            assert conn.getsockname()[1] == port  # the member left took the connection
            conn.close()
    finally:
        second.close()
