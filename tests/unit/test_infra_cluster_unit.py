"""The 3-broker cluster's pure logic: node layout, server.properties of node i of n, quorum
voters, replication settings, ports, the recorded state and what `infra status` prints.

No broker starts here; tests/integration/test_cluster.py runs a real cluster.
"""

from __future__ import annotations

import json
import os
import socket
import signal
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from clipstream.cli import main
from clipstream.errors import InfraError
from clipstream.infra import cluster, kafka, launcher, proc_stat_fields, process_start_ticks
from clipstream.infra.readiness import listed_brokers
from clipstream.settings import Settings
from topics.admin import replication_factor
from topics.catalogue import durability_config, min_insync_for, replication_for
from topics.client import producer_config


def _props(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line and line[0] != "#")


def test_fixed_ports_keep_the_single_brokers_pair_and_step_by_two() -> None:
    assert cluster.fixed_nodes(9092, 1) == [cluster.Node(1, 9092, 9093)]
    nodes = cluster.fixed_nodes(9092, 3)
    assert [(n.node_id, n.port, n.controller_port) for n in nodes] == [
        (1, 9092, 9093), (2, 9094, 9095), (3, 9096, 9097)
    ]  # fmt: skip
    assert cluster.bootstrap(nodes) == "127.0.0.1:9092,127.0.0.1:9094,127.0.0.1:9096"
    assert cluster.quorum_voters(nodes) == "1@127.0.0.1:9093,2@127.0.0.1:9095,3@127.0.0.1:9097"
    assert cluster.nodes_from_ports([10, 11, 20, 21]) == [cluster.Node(1, 10, 11), cluster.Node(2, 20, 21)]
    with pytest.raises(ValueError, match="port pair per node"):
        cluster.nodes_from_ports([10, 11, 20])


def test_server_properties_of_node_2_of_3(tmp_path: Path) -> None:
    nodes = cluster.fixed_nodes(19092, 3)
    props = _props(cluster.render_node_properties(nodes[1], nodes, tmp_path / "data"))
    assert props["node.id"] == "2" and props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:19093,2@127.0.0.1:19095,3@127.0.0.1:19097"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19094,CONTROLLER://127.0.0.1:19095"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19094"
    assert props["log.dirs"] == str(tmp_path / "data")
    # replicated like clipstream's own topics, internal ones included
    for key in ("default.replication.factor", "offsets.topic.replication.factor",
                "transaction.state.log.replication.factor"):
        assert props[key] == "3", key
    assert props["min.insync.replicas"] == props["transaction.state.log.min.isr"] == "2"
    assert props["unclean.leader.election.enable"] == "false"
    assert int(props["broker.session.timeout.ms"]) < 9000  # fenced sooner than Kafka's default
    # a dead controller is noticed, and a split vote retried, sooner than by Kafka's defaults
    assert int(props["controller.quorum.fetch.timeout.ms"]) < 2000
    assert int(props["controller.quorum.election.timeout.ms"]) < 1000
    # four heartbeats missed in a row before a fence: one late beat never fences a live node
    assert int(props["broker.session.timeout.ms"]) >= 4 * int(props["broker.heartbeat.interval.ms"])
    assert props["auto.create.topics.enable"] == "false"  # the dev defaults still apply


def test_one_node_is_rendered_as_before(tmp_path: Path) -> None:
    (node,) = cluster.fixed_nodes(19092, 1)
    ours = cluster.render_node_properties(node, [node], tmp_path / "d")
    assert ours == kafka.render_server_properties(port=19092, controller_port=19093, data_dir=tmp_path / "d")
    assert _props(ours)["offsets.topic.replication.factor"] == "1" and cluster.cluster_properties(1) == {}


def test_node_files_keep_the_single_layout_and_separate_cluster_sizes(tmp_path: Path) -> None:
    assert cluster.node_files(tmp_path, 1, 1) == kafka.BrokerFiles.under(tmp_path)
    files = cluster.write_node_files(tmp_path, cluster.fixed_nodes(19092, 3))
    assert [f.data_dir for f in files] == [tmp_path / "kafka-x3" / f"node-{i}" / "data" for i in (1, 2, 3)]
    assert _props(files[2].config.read_text())["node.id"] == "3"
    assert _props(files[2].log4j.read_text())["log4j.appender.file.File"] == str(files[2].log)
    assert cluster.node_files(tmp_path, 1, 5).data_dir.parent.parent.name == "kafka-x5"


def test_every_node_is_formatted_with_the_cluster_id_already_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = cluster.write_node_files(tmp_path, cluster.fixed_nodes(19092, 3))
    files[1].data_dir.mkdir(parents=True)
    (files[1].data_dir / "meta.properties").write_text("version=1\ncluster.id=abcDEF\nnode.id=2\n")
    assert kafka.formatted_cluster_id(files[1]) == "abcDEF" and kafka.formatted_cluster_id(files[0]) is None
    used: dict[int, str | None] = {}

    def fake_format(java: str, libs: Path, f: kafka.BrokerFiles, cluster_id: str | None = None) -> bool:
        used[files.index(f)] = cluster_id
        return f is not files[1]

    monkeypatch.setattr(kafka, "format_storage", fake_format)
    formatted = cluster.format_nodes("java", tmp_path, files)
    assert used == {0: "abcDEF", 1: "abcDEF", 2: "abcDEF"}
    assert formatted == [files[0].data_dir, files[2].data_dir]


def test_replication_follows_the_cluster_size_unless_set() -> None:
    assert [replication_for(n) for n in (0, 1, 2, 3, 7)] == [1, 1, 2, 3, 3]
    assert [min_insync_for(rf) for rf in (1, 2, 3, 5)] == [1, 1, 2, 2]
    assert durability_config(1) == {} and durability_config(3) == {"min.insync.replicas": "2"}
    assert replication_factor(Settings(), 1) == 1 and replication_factor(Settings(), 3) == 3
    assert replication_factor(Settings(replication_factor=2), 3) == 2


def test_producers_wait_for_every_in_sync_replica_and_are_idempotent() -> None:
    conf = producer_config(Settings())
    assert conf["acks"] == "all" and conf["enable.idempotence"] is True
    assert producer_config(Settings(), acks=1)["acks"] == 1  # an explicit choice still wins


def test_plan_ports_of_a_cluster(tmp_path: Path) -> None:
    free = launcher.plan_ports(Settings(state_dir=tmp_path), free_ports=True, brokers=3)
    assert set(free) == {"kafka", "controller", "kafka-2", "controller-2", "kafka-3", "controller-3", "redis"}
    assert len(set(free.values())) == 7
    for _ in range(50):  # node 1's ports below it must be free, or the error names those first
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            port = busy.getsockname()[1]
            if not all(_free(p) for p in (port - 2, port - 1)):
                continue
            settings = Settings(kafka_port=port - 2, state_dir=tmp_path)  # node 2 takes `port`
            with pytest.raises(InfraError, match=rf"port {port} \(kafka node 2\).*--free-ports.*--kafka-port"):
                launcher.plan_ports(settings, free_ports=False, need_redis=False, brokers=3)
            return
    pytest.fail("no busy port with two free ports below it")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_a_node_that_does_not_answer_lists_no_brokers() -> None:
    (closed,) = launcher.pick_free_ports(1)
    assert listed_brokers(f"127.0.0.1:{closed}", timeout_s=0.2) is None
    with socket.socket() as silent:  # accepts (backlog) but never replies, as a starting JVM
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        assert listed_brokers(f"127.0.0.1:{silent.getsockname()[1]}", timeout_s=0.2) is None


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _record(state_dir: Path, pids: list[int]) -> None:
    nodes = [{"node_id": i, "pid": pid, "start_ticks": process_start_ticks(pid), "port": 100 + i,
              "controller_port": 200 + i} for i, pid in enumerate(pids, start=1)]
    state = {"kafka": {"bootstrap": ",".join(f"127.0.0.1:{100 + i}" for i in range(1, len(pids) + 1)),
                       "nodes": nodes}}
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / launcher.STATE_FILE).write_text(json.dumps(state))


def test_status_shows_every_node_and_a_dead_one(tmp_path: Path) -> None:
    _record(tmp_path, [os.getpid(), _dead_pid(), os.getpid()])
    result = launcher.status(Settings(state_dir=tmp_path))
    assert [(n.node_id, n.running) for n in result.kafka_nodes] == [(1, True), (2, False), (3, True)]
    assert not result.kafka_running and result.kafka_pid == os.getpid()
    out = CliRunner().invoke(main, ["infra", "status", "--state-dir", str(tmp_path)])
    assert out.exit_code == 1
    lines = out.stdout.splitlines()
    assert lines[0] == "kafka: 127.0.0.1:101,127.0.0.1:102,127.0.0.1:103 2 of 3 nodes running"
    assert lines[1] == f"kafka node 1: 127.0.0.1:101 running (pid {os.getpid()})"
    assert lines[2].startswith("kafka node 2: 127.0.0.1:102 not running (was pid ")


def _record_with_redis(state_dir: Path, redis_pid: int, redis_port: int) -> None:
    _record(state_dir, [os.getpid()])
    state = json.loads((state_dir / launcher.STATE_FILE).read_text())
    state["redis"] = launcher._entry(redis_pid, port=redis_port, url=f"redis://127.0.0.1:{redis_port}/0")
    (state_dir / launcher.STATE_FILE).write_text(json.dumps(state))


def test_status_names_a_stopped_redis_and_how_to_resume_it(tmp_path: Path) -> None:
    frozen = subprocess.Popen(["sleep", "60"])
    try:
        os.kill(frozen.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while proc_stat_fields(frozen.pid)[0] not in ("T", "t"):
            assert time.monotonic() < deadline, "the process never showed as stopped"
            time.sleep(0.01)
        _record_with_redis(tmp_path, frozen.pid, 1)
        out = CliRunner().invoke(main, ["infra", "status", "--state-dir", str(tmp_path)])
        assert out.exit_code == 1
        said = out.stdout.splitlines()[1]
        assert said.startswith(f"redis: redis://127.0.0.1:1/0 stopped (pid {frozen.pid}")
        assert f"kill -CONT {frozen.pid}" in said
    finally:
        frozen.kill()
        frozen.wait()


def test_status_names_a_redis_that_takes_connections_and_never_answers(tmp_path: Path) -> None:
    with socket.socket() as hung:  # takes the connection, as a hung server's kernel does, and says nothing
        hung.bind(("127.0.0.1", 0))
        hung.listen(8)
        _record_with_redis(tmp_path, os.getpid(), hung.getsockname()[1])
        out = CliRunner().invoke(main, ["infra", "status", "--state-dir", str(tmp_path)])
    assert out.exit_code == 1
    said = out.stdout.splitlines()[1]
    assert f"running (pid {os.getpid()}) but not answering: PING got no reply" in said and "infra down" in said


def test_up_refuses_another_size_while_a_cluster_runs(tmp_path: Path) -> None:
    _record(tmp_path, [os.getpid()] * 3)
    with pytest.raises(InfraError, match=r"a 3-broker Kafka is already running.*infra down"):
        launcher.up(Settings(state_dir=tmp_path), brokers=1, progress=lambda _: None)
    with pytest.raises(InfraError, match="--brokers must be 1 or more"):
        launcher.up(Settings(state_dir=tmp_path), brokers=0, progress=lambda _: None)
    result = CliRunner().invoke(main, ["infra", "up", "--brokers", "0", "--state-dir", str(tmp_path)])
    assert result.exit_code == 2 and "--brokers" in result.output


def test_the_record_keeps_node_1_where_one_broker_readers_look(tmp_path: Path) -> None:
    nodes = [{"node_id": i, "pid": 1000 + i, "start_ticks": None, "port": 100 + i, "controller_port": 200 + i}
             for i in (1, 2, 3)]
    launcher._save_state(tmp_path, {"kafka": {"bootstrap": "b", "nodes": nodes}})
    saved = json.loads((tmp_path / launcher.STATE_FILE).read_text())["kafka"]
    assert (saved["pid"], saved["port"], saved["controller_port"]) == (1001, 101, 201)
    assert (tmp_path / "kafka.pid").read_text().strip() == "1001"


def test_the_quorum_leader_is_the_one_of_the_latest_epoch_any_node_logged(tmp_path: Path) -> None:
    line = "[2026-01-01 00:00:0{s},000] INFO [QuorumController id={me}] In the new epoch {e}, the leader is {who}. (x)\n"
    none = "[2026-01-01 00:00:05,000] INFO [QuorumController id=2] In the new epoch 3, the leader is (none). (x)\n"
    logs = [tmp_path / f"node-{i}.log" for i in (1, 2, 3)]
    logs[0].write_text(line.format(s=1, me=1, e=1, who=1) + line.format(s=2, me=1, e=2, who=3))
    logs[1].write_text(line.format(s=1, me=2, e=2, who=3) + none + line.format(s=6, me=2, e=4, who=2))
    # node 3's log is missing (a node that never started): the others still tell
    assert cluster.quorum_leader(logs) == 2
    logs[1].write_text(none)
    assert cluster.quorum_leader(logs) == 3  # an epoch with no leader yet names none
    assert cluster.quorum_leader([tmp_path / "absent.log"]) is None


def test_a_failover_is_read_from_the_lines_after_the_death(tmp_path: Path) -> None:
    def at(clock: str) -> float:
        return datetime.strptime(f"2026-01-01 {clock}", "%Y-%m-%d %H:%M:%S,%f").timestamp()

    active = "[2026-01-01 {t}] INFO [QuorumController id={me}] Becoming the active controller at epoch 2, next write offset 9. (x)\n"
    fence = "[2026-01-01 {t}] INFO [QuorumController id={me}] Fencing broker {node} because its session has timed out. (x)\n"
    logs = [tmp_path / f"node-{i}.log" for i in (1, 2, 3)]
    logs[0].write_text(active.format(t="00:00:01,000", me=1) + fence.format(t="00:00:02,000", me=1, node=3))
    logs[1].write_text(active.format(t="00:00:11,250", me=2) + fence.format(t="00:00:13,500", me=2, node=3)
                       + fence.format(t="00:00:13,000", me=2, node=1))
    # node 1 died at 10 s: node 2 took over the quorum, and fenced it; the earlier lines and
    # the fence of another node are not this death's
    assert cluster.failover(logs, 1, at("00:00:10,000")) == cluster.Failover(at("00:00:11,250"), at("00:00:13,000"))
    assert cluster.failover(logs, 3, at("00:00:12,000")) == cluster.Failover(None, at("00:00:13,500"))
    assert cluster.failover(logs, 2, at("00:00:12,000")) == cluster.Failover(None, None)  # not fenced yet
