"""Ports for ``infra up``: fixed ones from the settings (checked free), or free ones.

A Kafka of n nodes takes a (client, controller) pair per node: "kafka"/"controller" for node 1,
"kafka-<i>"/"controller-<i>" for node i; Redis takes one port.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path

from clipstream.errors import InfraError
from clipstream.infra import cluster
from clipstream.settings import Settings

LAST_PORTS_FILE = "free-ports.json"  # in the state dir


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when a server could listen on ``host:port`` now (TIME_WAIT leftovers don't count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def pick_free_ports(count: int, host: str = "127.0.0.1", keep: Sequence[int] = ()) -> list[int]:
    """``count`` distinct ports the kernel says are free (all bound at once, so distinct),
    none of them in ``keep``: ports already chosen, held bound meanwhile (one that cannot be
    bound is in use, so the kernel does not give it out either)."""
    held = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in keep]
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock, port in zip(held, keep, strict=True):
            with contextlib.suppress(OSError):
                sock.bind((host, port))
        for sock in socks:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in held + socks:
            sock.close()


def free_ports_like(names: Sequence[str], last: Mapping[str, int], host: str = "127.0.0.1") -> dict[str, int]:
    """Free ports for ``names``, taking again each port ``last`` gave the same name while it is
    still free: a Kafka and Redis started again with ``--free-ports`` keep their addresses, so
    the settings a user exported after the first start stay right."""
    kept = {name: last[name] for name in names if isinstance(last.get(name), int) and port_is_free(last[name], host)}
    if len(set(kept.values())) < len(kept):  # a hand-edited file naming one port twice
        kept = {}
    rest = [name for name in names if name not in kept]
    return {**kept, **dict(zip(rest, pick_free_ports(len(rest), host, keep=list(kept.values())), strict=True))}


_PORT_OPTION = {
    "kafka": "--kafka-port",
    "kafka controller": "--kafka-port (the controller uses the next port)",
    "redis": "--redis-port",
}


def kafka_port_names(brokers: int) -> list[str]:
    """Port names of the nodes: "kafka"/"controller" for node 1, "kafka-<i>"/"controller-<i>"."""
    names = ["kafka", "controller"]
    for i in range(2, brokers + 1):
        names += [f"kafka-{i}", f"controller-{i}"]
    return names


def _port_label(name: str) -> str:
    if name in ("kafka", "redis"):
        return name
    if name == "controller":
        return "kafka controller"
    kind, _, node = name.partition("-")
    return f"kafka node {node}" if kind == "kafka" else f"kafka controller of node {node}"


def plan_ports(
    settings: Settings,
    free_ports: bool,
    need_kafka: bool = True,
    need_redis: bool = True,
    brokers: int = 1,
    last: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """Ports for the components about to start: keys "kafka", "controller", "redis", and
    "kafka-<i>", "controller-<i>" for node i > 1 of a cluster.

    Fixed ports come from the settings (the controller takes the port after Kafka's, node i the
    pair at ``kafka_port + 2(i-1)``) and must be free; ``free_ports`` asks the kernel for
    unused ones instead, preferring those of ``last`` (the ports of the previous free start).
    """
    kafka_names = kafka_port_names(brokers) if need_kafka else []
    names = kafka_names + (["redis"] if need_redis else [])
    if free_ports:
        return free_ports_like(names, last or {})
    fixed = cluster.fixed_nodes(settings.kafka_port, brokers)
    pairs = [p for node in fixed for p in (node.port, node.controller_port)]
    wanted = dict(zip(kafka_port_names(brokers), pairs, strict=True))
    wanted["redis"] = settings.redis_port
    ports = {name: wanted[name] for name in names}
    for name, port in ports.items():
        label = _port_label(name)
        if not port_is_free(port):
            option = _PORT_OPTION.get(label, "--kafka-port (node i uses the pair from it + 2(i-1))")
            raise InfraError(
                f"port {port} ({label}) is already in use on 127.0.0.1: stop what holds it, "
                f"pass --free-ports, or choose another port with {option}"
            )
    return ports


def last_ports(state_dir: Path) -> dict[str, int]:
    """The free ports the last ``--free-ports`` start chose (``LAST_PORTS_FILE``), taken again."""
    try:
        data = json.loads((state_dir / LAST_PORTS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, int)} if isinstance(data, dict) else {}


def remember_ports(state_dir: Path, ports: dict[str, int]) -> None:
    """Keep the free ports chosen now, beside those of components still running on theirs."""
    (state_dir / LAST_PORTS_FILE).write_text(json.dumps({**last_ports(state_dir), **ports}, indent=1, sort_keys=True))
