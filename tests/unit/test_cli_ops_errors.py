"""Operator-facing CLI failures and corner cases found in a walkthrough: each says what went
wrong in one line, or does what its help says."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

import confluent_kafka
import pytest
from click.testing import CliRunner

import topics.admin
from clipstream.settings import Settings
from topics import deadletters_cli
from topics.deadletters import STAGES, dead_letter_value, latest


class _Msg:
    """A consumed record: just what ``latest`` reads."""

    def __init__(self, offset: int, value: bytes) -> None:
        self._offset, self._value = offset, value

    def error(self) -> None:
        return None

    def offset(self) -> int:
        return self._offset

    def partition(self) -> int:
        return 0

    def topic(self) -> str:
        return "p.deadletter"

    def value(self) -> bytes:
        return self._value

    def timestamp(self) -> tuple[int, int]:
        return (1, 0)


class _Consumer:
    """One partition of the given values; ``consume`` hands out from the assigned offset on."""

    def __init__(self, values: list[bytes]) -> None:
        self.values = values
        self.pos = 0

    def list_topics(self, topic: str, timeout: float) -> Any:
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None, partitions={0: None})})

    def assign(self, tps: list[Any]) -> None:
        self.pos = tps[0].offset

    def consume(self, n: int, timeout: float) -> list[_Msg]:
        got = [_Msg(o, self.values[o]) for o in range(self.pos, min(len(self.values), self.pos + n))]
        self.pos += len(got)
        return got

    def close(self) -> None:
        pass


@pytest.fixture
def topic_of(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Make ``latest`` read the given stages' dead letters (oldest first) from a fake consumer."""

    def install(stages: list[str], values: list[bytes] | None = None) -> None:
        values = values or [dead_letter_value(stage=s, reason=f"r{i}") for i, s in enumerate(stages)]
        monkeypatch.setattr(confluent_kafka, "Consumer", lambda conf: _Consumer(values))
        monkeypatch.setattr(topics.admin, "watermarks", lambda c, tp, t=0: (0, len(values)))

    return install


def test_deadletters_count_is_of_the_asked_stage(topic_of: Any) -> None:
    topic_of(["batcher", "batcher"] + ["selector"] * 10)
    found = latest(Settings(topic_prefix="p."), 3, 2.0, stage="batcher")
    assert [(d.stage, d.reason) for d in found] == [("batcher", "r0"), ("batcher", "r1")]
    newest = latest(Settings(topic_prefix="p."), 3, 2.0, stage="selector")
    assert [d.reason for d in newest] == ["r9", "r10", "r11"]
    assert [d.reason for d in latest(Settings(topic_prefix="p."), 2, 2.0)] == ["r10", "r11"]


def test_deadletters_cli_stage_and_count(topic_of: Any) -> None:
    topic_of(["worker"] + ["gateway"] * 5)
    out = CliRunner().invoke(deadletters_cli.deadletters, ["--stage", "worker", "-n", "3"])
    assert out.exit_code == 0, out.output
    assert "worker" in out.output and "r0" in out.output and "no dead letters" not in out.output


def test_deadletters_show_a_record_refused_by_every_stage_once(topic_of: Any) -> None:
    """Each stage following the registry refuses a bad registry record itself: one line, counted."""
    bad = dict(stage="registry", reason="registry record refused: bad", source=("p.registry", 0, 7))
    topic_of([], [dead_letter_value(**bad)] * 4 + [dead_letter_value(stage="worker", reason="other")]
             + [dead_letter_value(**{**bad, "source": ("p.registry", 0, 8)})])
    out = CliRunner().invoke(deadletters_cli.deadletters, [])
    lines = out.output.splitlines()
    assert out.exit_code == 0 and len(lines) == 3, out.output
    assert "p.registry[0]@7" in lines[0] and re.search(r"  \(4 times, the last at [-0-9]+ [:0-9]+\)$", lines[0])
    assert "other" in lines[1] and "p.registry[0]@8" in lines[2] and "times" not in lines[2]
    as_json = CliRunner().invoke(deadletters_cli.deadletters, ["--json"])
    assert len(as_json.output.splitlines()) == 6  # every record, for scripts


def test_deadletters_unknown_stage_lists_the_names() -> None:
    out = CliRunner().invoke(deadletters_cli.deadletters, ["--stage", "batchr"])
    assert out.exit_code == 2
    assert all(name in out.output for name in STAGES)
    assert "Traceback" not in out.output


def test_topics_create_kafka_away_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from clipstream.errors import InfraError
    from topics import cli as topics_cli

    def away(settings: Settings, models: Any) -> list[str]:
        raise InfraError("Kafka at 127.0.0.1:1 does not answer (timed out); start it with `clipstream infra up`")

    monkeypatch.setattr(topics_cli, "ensure_stage_topics", away)
    out = CliRunner().invoke(topics_cli.topics, ["create"])
    assert out.exit_code == 1
    assert out.output.startswith("error: Kafka at 127.0.0.1:1 does not answer") and out.output.count("\n") == 1
    assert out.exc_info is not None and out.exc_info[0] is SystemExit


def test_topics_create_replicas_help_says_partitions_of_batches() -> None:
    from topics import cli as topics_cli

    text = " ".join(CliRunner().invoke(topics_cli.topics, ["create", "--help"]).output.split())
    assert "batches.<model>" in text and "not the replication factor" in text


def test_topics_create_refuses_zero_selector_partitions(monkeypatch: pytest.MonkeyPatch) -> None:
    from topics import cli as topics_cli

    called: list[Any] = []
    monkeypatch.setattr(topics_cli, "ensure_stage_topics", lambda s, m: called.append(m) or [])
    monkeypatch.setenv("CLIPSTREAM_SELECTOR_PARTITIONS", "0")
    out = CliRunner().invoke(topics_cli.topics, ["create"])
    assert out.exit_code == 2 and not called  # the settings refuse it, for every stage
    assert "selector_partitions = '0'" in out.output and "Traceback" not in out.output


def test_gateway_without_kafka_is_one_line_and_exit_3(monkeypatch: pytest.MonkeyPatch,
                                                       capfd: pytest.CaptureFixture[str]) -> None:
    import frontend.gateway
    from clipstream.errors import InfraError
    from frontend import gateway_cli

    async def away(state: Any, stack: Any) -> None:
        raise InfraError("Kafka at 127.0.0.1:1 does not answer (no); start it with `clipstream infra up`")

    monkeypatch.setattr(frontend.gateway, "_connect", away)
    monkeypatch.delenv("CLIPSTREAM_METRICS_PORT", raising=False)
    out = CliRunner().invoke(gateway_cli.gateway, ["--port", "0", "--host", "127.0.0.1"])
    seen = out.output + "".join(capfd.readouterr())
    assert out.exit_code == 3, seen
    assert "error: the gateway could not start: Kafka at 127.0.0.1:1 does not answer" in seen
    assert "Traceback" not in seen and "Application startup failed" not in seen
    assert [line for line in seen.splitlines() if line.strip()] == [
        line for line in seen.splitlines() if line.startswith("error: ")], seen


def test_gateway_startup_failure_names_an_unexpected_cause() -> None:
    from frontend.gateway import startup_failure

    line = startup_failure(TimeoutError("timed out"))
    assert "TimeoutError: timed out" in line and "clipstream infra status" in line and "\n" not in line


class _ExitedBroker:
    """A secure broker whose process has already ended: the command prints what it prints at
    start and then reports the exit."""

    bootstrap = "127.0.0.1:19093"
    files = SimpleNamespace(log="broker.log")
    process = SimpleNamespace(poll=lambda: 1)

    def client_env(self, password: str) -> dict[str, str]:
        return {"CLIPSTREAM_KAFKA_BOOTSTRAP": self.bootstrap, "CLIPSTREAM_KAFKA_SASL_PASSWORD": password}

    def stop(self) -> None:
        pass


@pytest.mark.parametrize("args", [["secure-broker"], ["up", "--secure"]])
def test_secure_broker_makes_the_state_dir_and_says_no_redis(monkeypatch: pytest.MonkeyPatch, tmp_path: Any,
                                                             args: list[str]) -> None:
    import clipstream.infra.secure
    from clipstream.infra import cli as infra_cli

    folders: list[Any] = []
    monkeypatch.setattr(clipstream.infra.secure, "start_secure_broker",
                        lambda settings, folder, *rest: folders.append(folder) or _ExitedBroker())
    monkeypatch.delenv("CLIPSTREAM_KAFKA_SASL_PASSWORD", raising=False)
    state = tmp_path / "not" / "yet"
    out = CliRunner().invoke(infra_cli.infra, [*args, "--state-dir", str(state)])
    assert not isinstance(out.exception, FileNotFoundError), out.output
    assert out.exit_code == 1 and "error: the broker exited" in out.output
    assert folders and folders[0].parent == state and state.is_dir()
    assert "starts no Redis" in out.output and "CLIPSTREAM_REDIS_URL" in out.output


@pytest.mark.parametrize("command", ["up", "down", "status", "secure-broker"])
def test_state_dir_help_names_the_real_default(command: str) -> None:
    from clipstream.infra import cli as infra_cli

    text = " ".join(CliRunner().invoke(infra_cli.infra, [command, "--help"]).output.split())
    assert "~/.local/state/clipstream" in text


def test_a_misspelt_command_is_told_the_one_meant() -> None:
    from clipstream.cli import main

    for typed, meant in (("inspekt", "'inspect'"), ("deadletter", "'deadletters'"), ("remove-modle", "'remove-model'")):
        result = CliRunner().invoke(main, [typed])
        assert result.exit_code == 2 and f"No such command {typed!r}. Did you mean {meant}" in result.output, result.output
    unknown = CliRunner().invoke(main, ["zzz"])
    assert unknown.exit_code == 2 and "No such command 'zzz'." in unknown.output and "Did you mean" not in unknown.output
    assert CliRunner().invoke(main, ["--help"]).exit_code == 0
