"""The infra launcher's pure logic: generated files, ports, state, error messages.

No process is started here; the real broker and Redis are exercised in
tests/integration/test_infra.py.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner

from clipstream.cli import main
from clipstream.errors import InfraError
from clipstream.infra import kafka, launcher, process_start_ticks, require_binary
from clipstream.infra import redis as infra_redis
from clipstream.settings import Settings


def _props(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line and line[0] != "#")


def test_pom_pins_broker_and_logging_binding() -> None:
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    root = ET.fromstring(kafka.render_pom("3.9.1"))
    deps = {
        (d.findtext("m:groupId", namespaces=ns), d.findtext("m:artifactId", namespaces=ns)): (
            d.findtext("m:version", namespaces=ns)
        )
        for d in root.iterfind("m:dependencies/m:dependency", ns)
    }
    assert deps == {
        ("org.apache.kafka", "kafka_2.13"): "3.9.1",
        ("org.slf4j", "slf4j-reload4j"): "1.7.36",
    }
    plugin = root.find("m:build/m:plugins/m:plugin", ns)
    assert plugin is not None
    assert plugin.findtext("m:version", namespaces=ns) == kafka.DEPENDENCY_PLUGIN_VERSION


def test_server_properties_single_node_kraft_on_loopback(tmp_path: Path) -> None:
    text = kafka.render_server_properties(
        port=19092, controller_port=19093, data_dir=tmp_path / "data", extra={"num.partitions": "3"}
    )
    props = _props(text)
    assert props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19092"
    assert props["log.dirs"] == str(tmp_path / "data")
    assert props["auto.create.topics.enable"] == "false"
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert props["offsets.topic.replication.factor"] == "1"
    assert props["num.partitions"] == "3"  # extra settings win over the dev defaults
    assert props["metadata.max.idle.interval.ms"] == "30000"  # no no-op record every 500 ms


def test_broker_files_and_command(tmp_path: Path) -> None:
    files = kafka.write_broker_files(tmp_path, 19092, 19093)
    assert _props(files.config.read_text())["log.dirs"] == str(files.data_dir)
    log4j = _props(files.log4j.read_text())
    assert log4j["log4j.appender.file.File"] == str(tmp_path / "kafka.log")
    argv = kafka.broker_command("/usr/bin/java", tmp_path / "libs", files)
    assert argv[0] == "/usr/bin/java" and argv[-2:] == ["kafka.Kafka", str(files.config)]
    assert "-Xmx512m" in argv and f"-Dlog4j.configuration=file:{files.log4j}" in argv
    assert argv[argv.index("-cp") + 1] == str(tmp_path / "libs" / "*")


def test_broker_jvm_options_follow_kafkas_own_variables() -> None:
    assert kafka.broker_jvm_opts({}) == [*kafka.BROKER_HEAP_OPTS, *kafka.BROKER_PERFORMANCE_OPTS]
    opts = kafka.broker_jvm_opts({"KAFKA_HEAP_OPTS": "-Xmx2g -Xms2g",
                                  "KAFKA_JVM_PERFORMANCE_OPTS": "-XX:+UseG1GC -XX:MaxGCPauseMillis=20"})
    assert opts == ["-Xmx2g", "-Xms2g", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20"]
    # one set alone replaces only its own half
    assert kafka.broker_jvm_opts({"KAFKA_HEAP_OPTS": "-Xmx1g"}) == ["-Xmx1g", *kafka.BROKER_PERFORMANCE_OPTS]


def test_cluster_id_is_a_kafka_uuid() -> None:
    ids = {kafka.random_cluster_id() for _ in range(200)}
    assert len(ids) == 200
    for cid in ids:
        assert len(cid) == 22 and not cid.startswith("-")
        assert len(base64.urlsafe_b64decode(cid + "==")) == 16


def test_redis_command_never_evicts_state_and_snapshots_in_the_state_dir(tmp_path: Path) -> None:
    argv = infra_redis.redis_command("/usr/bin/redis-server", 16379, tmp_path)
    pairs = dict(zip(argv[1::2], argv[2::2], strict=True))
    assert pairs["--maxmemory-policy"] == "volatile-lru"
    assert pairs["--save"] == "60 1" and pairs["--dir"] == str(tmp_path / "redis")
    assert pairs["--bind"] == "127.0.0.1" and pairs["--port"] == "16379"
    assert pairs["--logfile"] == str(tmp_path / "redis.log")


def test_pick_free_ports_are_distinct_and_bindable() -> None:
    ports = launcher.pick_free_ports(3)
    assert len(set(ports)) == 3
    assert all(launcher.port_is_free(p) for p in ports)


def test_plan_ports_fixed_and_free(tmp_path: Path) -> None:
    kafka_port, redis_port = launcher.pick_free_ports(2)
    fixed = Settings(kafka_port=kafka_port, redis_port=redis_port, state_dir=tmp_path)
    planned = launcher.plan_ports(fixed, free_ports=False, need_kafka=False)
    assert planned == {"redis": redis_port}
    free = launcher.plan_ports(fixed, free_ports=True)
    assert set(free) == {"kafka", "controller", "redis"} and len(set(free.values())) == 3


def test_free_ports_keep_the_last_ones_while_free(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path)
    first = launcher.plan_ports(settings, free_ports=True)
    assert launcher.plan_ports(settings, free_ports=True, last=first) == first
    with socket.socket() as busy:  # the last Redis port is taken since: only it moves
        busy.bind(("127.0.0.1", first["redis"]))
        busy.listen()
        again = launcher.plan_ports(settings, free_ports=True, last=first)
    assert again["redis"] != first["redis"]
    assert {k: again[k] for k in ("kafka", "controller")} == {k: first[k] for k in ("kafka", "controller")}
    assert len(set(again.values())) == 3


def test_free_ports_never_give_a_kept_port_twice(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path)
    last = {"kafka": launcher.pick_free_ports(1)[0]}  # only one name remembered: the others are new
    for _ in range(20):
        ports = launcher.plan_ports(settings, free_ports=True, last=last)
        assert ports["kafka"] == last["kafka"] and len(set(ports.values())) == 3


def test_plan_ports_names_the_busy_port(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        settings = Settings(redis_port=port, state_dir=tmp_path)
        with pytest.raises(InfraError, match=rf"port {port} \(redis\).*--free-ports"):
            launcher.plan_ports(settings, free_ports=False, need_kafka=False)


@pytest.fixture
def empty_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A PATH on which no binary exists."""
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))


@pytest.mark.usefixtures("empty_path")
def test_missing_binaries_say_how_to_install(tmp_path: Path) -> None:
    with pytest.raises(InfraError, match=r"`mvn` was not found.*apt-get install -y .*maven"):
        kafka.fetch_jars(Settings(cache_dir=tmp_path / "cache"), progress=lambda _: None)
    with pytest.raises(InfraError, match=r"apt-get install -y redis-server"):
        launcher.up(Settings(state_dir=tmp_path / "state"), free_ports=True, progress=print)
    with pytest.raises(InfraError, match=r"`java` was not found.*openjdk-17"):
        require_binary("java", kafka.JAVA_HINT)
    assert not launcher.status(Settings(state_dir=tmp_path / "state")).kafka_running


@pytest.mark.usefixtures("empty_path")
def test_cached_jars_need_neither_maven_nor_network(tmp_path: Path) -> None:
    settings = Settings(cache_dir=tmp_path / "cache")
    home = kafka.kafka_home(settings)
    (home / "libs").mkdir(parents=True)
    (home / "libs" / "kafka_2.13-3.9.1.jar").write_bytes(b"")
    (home / kafka.MARKER).write_text(json.dumps({"pom_sha256": "from an older pom"}))
    assert not kafka.jars_ready(settings)  # a changed pom means fetching again
    with pytest.raises(InfraError, match="mvn"):
        kafka.fetch_jars(settings, progress=lambda _: None)
    pom_sha = hashlib.sha256(kafka.render_pom("3.9.1").encode()).hexdigest()
    (home / kafka.MARKER).write_text(json.dumps({"pom_sha256": pom_sha}))
    assert kafka.fetch_jars(settings, progress=pytest.fail) == home / "libs"


def test_status_without_state_reports_settings_addresses(tmp_path: Path) -> None:
    settings = Settings(kafka_bootstrap="h:1", redis_url="redis://h:2/0", state_dir=tmp_path)
    result = launcher.status(settings)
    assert (result.kafka_running, result.redis_running, result.running) == (False, False, False)
    assert result.env() == {
        "CLIPSTREAM_KAFKA_BOOTSTRAP": "h:1",
        "CLIPSTREAM_REDIS_URL": "redis://h:2/0",
    }
    assert launcher.down(settings) == []


def test_recorded_pid_must_match_its_start_time() -> None:
    me = os.getpid()
    ticks = process_start_ticks(me)
    assert launcher.is_ours_and_alive({"pid": me, "start_ticks": ticks})
    if ticks is not None:  # Linux: a reused pid (other start time) is not ours to signal
        assert not launcher.is_ours_and_alive({"pid": me, "start_ticks": ticks + 1})
    assert not launcher.is_ours_and_alive(None)


@pytest.mark.usefixtures("empty_path")
def test_cli_error_is_one_line_and_exit_code_1(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["infra", "up", "--free-ports", "--state-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert result.stderr.strip().count("\n") == 0
    assert result.stderr.startswith("error: ") and "redis-server" in result.stderr
    assert "Traceback" not in result.output
