"""The nodes of the local Kafka: one node, or a cluster of combined broker+controller nodes.

Every node of a cluster is both a broker and a controller-quorum voter: the fewest JVMs for a
small machine, and a quorum of three keeps its majority (and so a controller) when any one node
dies. All nodes are formatted with one cluster id. The single node keeps the layout it always
had (``<state_dir>/kafka``); a cluster of n lives under ``<state_dir>/kafka-x<n>/node-<i>``, so
a state dir that once ran another size never mixes data dirs of two quorums.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from clipstream.infra import kafka as kafka_mod
from clipstream.infra.kafka import BrokerFiles
from topics.catalogue import min_insync_for, replication_for

HOST = "127.0.0.1"

# Failure detection on a local cluster. A SIGKILLed node stays in the ISR of its partitions,
# and acks=all writes to them wait, until the controller fences it (no heartbeat for
# broker.session.timeout.ms, 9 s by default) or its leader drops it as a lagging follower
# (replica.lag.time.max.ms, 30 s by default): shorter bounds keep that stall to a few seconds.
# When the dead node was the quorum's controller, the others first notice (no fetch answered
# for controller.quorum.fetch.timeout.ms) and elect a new one (a split vote retries after the
# election timeout), and the new controller gives every broker a full session before it fences
# any: those bounds are halved too (docs/design/0070).
FAILURE_DETECTION: dict[str, str] = {
    "broker.heartbeat.interval.ms": "500",
    "broker.session.timeout.ms": "2000",
    "controller.quorum.fetch.timeout.ms": "1000",
    "controller.quorum.election.timeout.ms": "500",
    "replica.lag.time.max.ms": "10000",
}


@dataclass(frozen=True)
class Node:
    """One node's identity and ports (client listener and controller listener)."""

    node_id: int
    port: int
    controller_port: int

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"


def fixed_nodes(base_port: int, brokers: int) -> list[Node]:
    """Nodes on fixed ports: node i (from 1) listens on ``base + 2(i-1)``, its controller on the
    next port, so one node keeps the broker's usual pair (9092, 9093)."""
    return [Node(i, base_port + 2 * (i - 1), base_port + 2 * (i - 1) + 1) for i in range(1, brokers + 1)]


def nodes_from_ports(ports: Sequence[int]) -> list[Node]:
    """Nodes from a flat list of ports: (client, controller) for node 1, node 2, ..."""
    if len(ports) % 2 or not ports:
        raise ValueError(f"need a (client, controller) port pair per node, got {len(ports)} ports")
    return [Node(i // 2 + 1, ports[i], ports[i + 1]) for i in range(0, len(ports), 2)]


def quorum_voters(nodes: Sequence[Node]) -> str:
    """``controller.quorum.voters``: every node votes."""
    return ",".join(f"{n.node_id}@{HOST}:{n.controller_port}" for n in nodes)


def bootstrap(nodes: Sequence[Node]) -> str:
    """The bootstrap list a client is given: every node, so any one of them may be down."""
    return ",".join(n.address for n in nodes)


def cluster_properties(brokers: int) -> dict[str, str]:
    """Broker settings that follow from the cluster's size, on top of the dev defaults.

    One node keeps the dev defaults (a single copy of everything). A cluster replicates the
    internal topics (consumer offsets, transaction state) as clipstream's own topics are
    replicated, and detects a dead node within seconds.
    """
    if brokers <= 1:
        return {}
    rf = replication_for(brokers)
    isr = str(min_insync_for(rf))
    return {
        "default.replication.factor": str(rf),
        "min.insync.replicas": isr,
        "offsets.topic.replication.factor": str(rf),
        "transaction.state.log.replication.factor": str(rf),
        "transaction.state.log.min.isr": isr,
        "unclean.leader.election.enable": "false",  # never elect a replica missing acked records
        **FAILURE_DETECTION,
    }


# the quorum controller's line for each new Raft epoch (log4j, Kafka 3.9)
_EPOCH_LEADER = re.compile(r"In the new epoch (\d+), the leader is (\d+)\.")


def _log_texts(logs: Sequence[Path]) -> list[str]:
    """The text of each node's log that can be read (a node not started yet has none)."""
    texts = []
    for log in logs:
        try:
            texts.append(log.read_text(errors="replace"))
        except OSError:
            continue
    return texts


def quorum_leader(logs: Sequence[Path]) -> int | None:
    """The node the controller quorum last elected, from the nodes' own logs (the latest epoch
    any of them saw a leader in); None if none has seen one. Losing that node costs a cluster
    an election before the fencing of the dead node can even start."""
    latest: tuple[int, int] | None = None
    for text in _log_texts(logs):
        for epoch, leader in _EPOCH_LEADER.findall(text):
            if latest is None or int(epoch) > latest[0]:
                latest = (int(epoch), int(leader))
    return None if latest is None else latest[1]


# log4j's stamp on each line of a node's log, in the node's local time, and the two steps of a
# node's death that the cluster takes on its own: a new controller, and the dead node fenced
_STAMP = r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] INFO \[QuorumController id=\d+\] "
_ACTIVE = re.compile(_STAMP + r"Becoming the active controller", re.M)
_FENCED = re.compile(_STAMP + r"Fencing broker (\d+) because its session has timed out", re.M)


@dataclass(frozen=True)
class Failover:
    """When the cluster took its own steps after a node died, in epoch seconds: the first
    controller to become active since, if any (one does only when the dead node led the
    quorum), and the fence of the dead node (None: not yet). What remains of a gap in answers
    after the fence is the clients finding the new leaders."""

    controller_at: float | None
    fenced_at: float | None


def failover(logs: Sequence[Path], node_id: int, since: float) -> Failover:
    """The steps of ``node_id``'s death after ``since`` (epoch seconds), from the nodes' logs."""
    def stamp(text: str) -> float:
        return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()

    active: list[float] = []
    fenced: list[float] = []
    for text in _log_texts(logs):
        active += map(stamp, _ACTIVE.findall(text))
        fenced += [stamp(at) for at, node in _FENCED.findall(text) if int(node) == node_id]
    return Failover(min((t for t in active if t >= since), default=None),
                    min((t for t in fenced if t >= since), default=None))


def node_files(state_dir: Path, node_id: int, brokers: int) -> BrokerFiles:
    """Where node ``node_id`` of a ``brokers``-node Kafka keeps its files."""
    if brokers <= 1:
        return BrokerFiles.under(state_dir)
    home = state_dir / f"kafka-x{brokers}" / f"node-{node_id}"
    return BrokerFiles(
        config=home / "server.properties",
        log4j=home / "log4j.properties",
        data_dir=home / "data",
        log=home / "kafka.log",
        out=home / "kafka.out",
    )


def render_node_properties(
    node: Node, nodes: Sequence[Node], data_dir: Path, extra: Mapping[str, str] | None = None
) -> str:
    """server.properties of one node of ``nodes``."""
    return kafka_mod.render_server_properties(
        port=node.port,
        controller_port=node.controller_port,
        data_dir=data_dir,
        node_id=node.node_id,
        voters=quorum_voters(nodes),
        extra={**cluster_properties(len(nodes)), **(extra or {})},
    )


def write_node_files(state_dir: Path, nodes: Sequence[Node]) -> list[BrokerFiles]:
    """Write every node's server.properties and log4j.properties; return their files."""
    written = []
    for node in nodes:
        files = node_files(state_dir, node.node_id, len(nodes))
        files.config.parent.mkdir(parents=True, exist_ok=True)
        files.config.write_text(render_node_properties(node, nodes, files.data_dir))
        files.log4j.write_text(kafka_mod.render_log4j(files.log))
        written.append(files)
    return written


def format_nodes(java: str, libs: Path, all_files: Sequence[BrokerFiles]) -> list[Path]:
    """Format the nodes not formatted yet, with the cluster id of any that are (else a new
    one); return the data dirs formatted now. The formatting JVMs run side by side: each
    spends its seconds starting up, not working."""
    known = [cid for files in all_files if (cid := kafka_mod.formatted_cluster_id(files))]
    cluster_id = known[0] if known else kafka_mod.random_cluster_id()
    with ThreadPoolExecutor(max_workers=len(all_files) or 1) as pool:
        done = list(pool.map(lambda f: kafka_mod.format_storage(java, libs, f, cluster_id), all_files))
    return [files.data_dir for files, formatted in zip(all_files, done, strict=True) if formatted]
