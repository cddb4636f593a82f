"""The launcher against real processes: a private broker + Redis for up/down, and the session's.

The up/down test uses its own state dir and free ports, never the session infra, so stopping
it cannot disturb other tests.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from clipstream.testing.procs import wait_until

from clipstream.errors import InfraError
from clipstream.infra import launcher, pid_alive
from clipstream.infra.kafka import kafka_answers
from clipstream.infra.redis import redis_answers
from clipstream.settings import Settings

pytestmark = pytest.mark.integration



def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def test_up_twice_is_one_broker_and_down_stops_it(tmp_path: Path) -> None:
    """With CLIPSTREAM_REDIS_PASSWORD set, the Redis it starts asks for that password, which is
    in a file only the owner reads and never on the command line that any user's ps shows."""
    password = 'p"w\\ d \u00e9'
    settings = Settings(state_dir=tmp_path / "state", redis_password=password)
    try:
        first = launcher.up(settings, free_ports=True, progress=lambda _: None)
        assert first.running and first.kafka_pid and first.redis_pid
        assert kafka_answers(first.kafka_bootstrap) and redis_answers(first.redis_url, password)
        assert not redis_answers(first.redis_url)  # NOAUTH: a client without the password is refused
        with pytest.raises(redis.AuthenticationError):
            redis.Redis.from_url(first.redis_url, password="wrong").ping()
        secret = tmp_path / "state" / "redis" / "secret.conf"
        assert secret.stat().st_mode & 0o077 == 0
        assert password.encode() not in Path(f"/proc/{first.redis_pid}/cmdline").read_bytes()

        second = launcher.up(settings, free_ports=True, progress=lambda _: None)
        assert (second.kafka_pid, second.redis_pid) == (first.kafka_pid, first.redis_pid)
        assert second.env() == first.env()
        now = launcher.status(settings)
        assert now.running and now.kafka_pid == first.kafka_pid
        assert (tmp_path / "state" / "kafka.pid").read_text().strip() == str(first.kafka_pid)
    finally:
        stopped = launcher.down(settings)
    assert stopped == [f"kafka (pid {first.kafka_pid})", f"redis (pid {first.redis_pid})"]
    wait_until(lambda: not pid_alive(first.kafka_pid), 10, "the broker to exit")
    wait_until(lambda: not pid_alive(first.redis_pid), 10, "redis to exit")
    after = launcher.status(settings)
    assert not after.kafka_running and not after.redis_running and after.kafka_pid is None
    assert launcher.down(settings) == []


def test_a_restart_keeps_the_free_ports_and_the_learnt_weights(tmp_path: Path) -> None:
    """A user who exported the printed settings after a ``--free-ports`` start keeps them, and
    the policy weights learnt before ``down`` are there after the next ``up``."""
    settings = Settings(state_dir=tmp_path / "state")
    weights = b'{"policy": "exp4", "models": ["a", "b"], "log_w": [0.0, -3.5], "n_observed": 40}'
    try:
        first = launcher.up(settings, free_ports=True, progress=lambda _: None)
        before = redis.Redis.from_url(first.redis_url)
        before.set("cs:state:digits:__global__", weights)
        before.set("cs:cache:gone", b"x", px=200)  # a cache entry whose time runs out meanwhile
        before.close()
        launcher.down(settings)
        wait_until(lambda: not pid_alive(first.kafka_pid) and not pid_alive(first.redis_pid), 20, "both to exit")
        second = launcher.up(settings, free_ports=True, progress=lambda _: None)
        assert second.kafka_pid != first.kafka_pid
        assert (second.kafka_bootstrap, second.redis_url) == (first.kafka_bootstrap, first.redis_url)
        assert kafka_answers(second.kafka_bootstrap) and redis_answers(second.redis_url)
        after = redis.Redis.from_url(second.redis_url)
        assert after.get("cs:state:digits:__global__") == weights
        wait_until(lambda: after.get("cs:cache:gone") is None, 5, "the expired cache entry to be gone")
        after.close()
    finally:
        launcher.down(settings)


def test_busy_port_names_the_port_and_starts_nothing(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        (redis_port,) = launcher.pick_free_ports(1)
        settings = Settings(kafka_port=port, redis_port=redis_port, state_dir=tmp_path)
        with pytest.raises(InfraError, match=rf"port {port} \(kafka\).*--free-ports"):
            launcher.up(settings, progress=lambda _: None)
    result = launcher.status(settings)
    assert result.kafka_pid is None and result.redis_pid is None


def test_die_with_parent_stops_children_of_a_killed_parent(tmp_path: Path) -> None:
    code = (
        "import sys, pathlib; from clipstream.infra import spawn_detached; "
        "p = spawn_detached(['sleep', '60'], pathlib.Path(sys.argv[1]), die_with_parent=True); "
        "print(p.pid, flush=True); sys.stdin.read()"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path / "out")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert pid_alive(child)
    parent.kill()  # no teardown runs, as when a test session is killed
    parent.wait(timeout=10)
    wait_until(lambda: not pid_alive(child), 10, "the orphaned child to exit")


def test_session_broker_answers_metadata(infra: launcher.InfraStatus) -> None:
    from confluent_kafka.admin import AdminClient

    metadata = AdminClient({"bootstrap.servers": infra.kafka_bootstrap}).list_topics(timeout=10)
    assert len(metadata.brokers) == 1


def test_session_redis_pings_and_evicts_only_ttl_keys(redis_client) -> None:  # noqa: ANN001
    assert redis_client.ping() is True
    reply = redis_client.config_get("maxmemory-policy")  # str or bytes, by redis-py version
    text = {_text(key): _text(value) for key, value in reply.items()}
    assert text == {"maxmemory-policy": "volatile-lru"}


def test_subprocesses_inherit_the_session_infra(
    infra: launcher.InfraStatus, settings: Settings
) -> None:
    code = (
        "from clipstream.settings import Settings as S; "
        "s = S(); print(s.kafka_bootstrap, s.redis_url)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ
    ).stdout.split()
    assert out == [infra.kafka_bootstrap, infra.redis_url]
    assert settings.kafka_bootstrap == infra.kafka_bootstrap
    assert settings.topic_prefix.startswith("t") and settings.topic_prefix.endswith(".")


def test_a_command_finds_the_kafka_and_redis_recorded_in_the_state_dir(
    infra: launcher.InfraStatus, settings: Settings
) -> None:
    """After `infra up --free-ports`, `CLIPSTREAM_STATE_DIR` alone leads a registry verb and
    `inspect` to that Kafka and Redis, as `up` finds them; a Kafka named on purpose is kept."""
    if infra.state_dir is None:
        pytest.skip("the session's Kafka and Redis were given by the environment, not started here")
    env = {k: v for k, v in os.environ.items() if k not in ("CLIPSTREAM_KAFKA_BOOTSTRAP", "CLIPSTREAM_REDIS_URL")}
    env.update(CLIPSTREAM_STATE_DIR=str(infra.state_dir), CLIPSTREAM_TOPIC_PREFIX=settings.topic_prefix)
    cli = [sys.executable, "-m", "clipstream.cli"]
    made = subprocess.run([*cli, "register-app", "found", "--slo-ms", "40"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert made.returncode == 0, made.stderr
    shown = subprocess.run([*cli, "inspect"], capture_output=True, text=True, env=env, timeout=120)
    assert shown.returncode == 0 and "app found: policy=" in shown.stdout, shown.stdout + shown.stderr
    assert "Redis did not answer" not in shown.stderr
    env["CLIPSTREAM_KAFKA_BOOTSTRAP"] = "127.0.0.1:1"
    named = subprocess.run([*cli, "inspect"], capture_output=True, text=True, env=env, timeout=120)
    assert named.returncode != 0 and "127.0.0.1:1" in named.stdout + named.stderr


def test_a_state_dir_that_leads_nowhere_is_said(tmp_path: Path) -> None:
    """A mistyped CLIPSTREAM_STATE_DIR, or one set beside a named Kafka or Redis, is not passed
    over in silence: the command says which Kafka it went to instead."""
    env = {k: v for k, v in os.environ.items() if k not in ("CLIPSTREAM_KAFKA_BOOTSTRAP", "CLIPSTREAM_REDIS_URL")}
    env.update(CLIPSTREAM_STATE_DIR=str(tmp_path / "nothing-here"), CLIPSTREAM_TOPIC_PREFIX="t-nowhere.")
    cli = [sys.executable, "-m", "clipstream.cli", "inspect"]
    alone = subprocess.run(cli, capture_output=True, text=True, env=env, timeout=120)
    assert f"warning: no Kafka or Redis recorded in CLIPSTREAM_STATE_DIR={tmp_path / 'nothing-here'} runs" \
        in alone.stderr, alone.stderr
    beside = subprocess.run(cli, capture_output=True, text=True, env={**env, "CLIPSTREAM_REDIS_URL": "redis://127.0.0.1:1/0"},
                            timeout=120)
    assert "warning: CLIPSTREAM_STATE_DIR is not read for Kafka and Redis" in beside.stderr, beside.stderr
    # both named, as the export line up prints names them with its state dir: nothing to warn of
    both = subprocess.run(cli, capture_output=True, text=True, timeout=120, env={
        **env, "CLIPSTREAM_REDIS_URL": "redis://127.0.0.1:1/0", "CLIPSTREAM_KAFKA_BOOTSTRAP": "127.0.0.1:1"})
    assert "CLIPSTREAM_STATE_DIR" not in both.stderr, both.stderr


def test_status_from_another_state_dir_says_the_named_kafka_and_redis_answer(
    infra: launcher.InfraStatus, tmp_path: Path
) -> None:
    """A shell that ran `up`'s export line but not from its state dir: the Kafka and Redis it
    names answer, so "start them" would be wrong; the line says which state dir to use."""
    env = dict(os.environ, CLIPSTREAM_KAFKA_BOOTSTRAP=infra.kafka_bootstrap, CLIPSTREAM_REDIS_URL=infra.redis_url)
    done = subprocess.run([sys.executable, "-m", "clipstream.cli", "infra", "status", "--state-dir", str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1 and "start them with" not in done.stderr, done.stderr
    assert f"Kafka at {infra.kafka_bootstrap} (CLIPSTREAM_KAFKA_BOOTSTRAP) and Redis at " in done.stderr, done.stderr
    assert f"answer, but were not started from {tmp_path}: set CLIPSTREAM_STATE_DIR" in done.stderr, done.stderr
