"""What `clipstream up` checks and says when its start goes wrong: a taken gateway port fails at
once, before anything is applied or started; a stage that exits before it is ready is quoted
with this run's output only; and a worker's failure says how to get out of a model that does
not load.

No Kafka or Redis: the port check runs before them, and the stages here are small child
processes (one a real worker, which fails loading its model before it needs a broker)."""

from __future__ import annotations

import os
import re
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import clipstream.front_ports as ports
import clipstream.up as up_module
from clipstream.errors import ClipstreamError
from clipstream.pipeline import Pipeline, stage_argv
from clipstream.supervise import Stage, Supervisor, tail
from clipstream.testing.models import make_python_model
from clipstream.testing.procs import wait_until
from frontend.gateway_cli import shared_socket

HOST = "127.0.0.1"


@pytest.fixture
def taken() -> Iterator[int]:
    """A port something listens on, as another server would."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        sock.listen(1)
        yield int(sock.getsockname()[1])


@pytest.fixture
def app_file(tmp_path: Path) -> Path:
    path = tmp_path / "app.yaml"
    path.write_text("apps: []\nmodels: []\n")
    return path


def _nothing_may_start(monkeypatch: pytest.MonkeyPatch) -> None:
    def started(*_: Any, **__: Any) -> None:
        raise AssertionError("up went on past a taken gateway port")

    for name in ("_ensure_infra", "apply_file", "Supervisor"):
        monkeypatch.setattr(up_module, name, started)
    monkeypatch.delenv("CLIPSTREAM_GATEWAY_HOST", raising=False)


def test_a_taken_gateway_port_fails_at_once_in_one_line(monkeypatch: pytest.MonkeyPatch, taken: int,
                                                         app_file: Path, tmp_path: Path) -> None:
    _nothing_may_start(monkeypatch)
    monkeypatch.setenv("CLIPSTREAM_GATEWAY_PORT", str(taken))  # the default port, from the environment
    result = CliRunner().invoke(up_module.up, ["-f", str(app_file), "--state-dir", str(tmp_path / "state")])
    assert result.exit_code == 1, result.output
    assert result.output == (f"error: port {taken} on {HOST} is in use (another clipstream up, or another server); "
                             "stop it, or pass --gateway-port P or --free-ports\n")

    asked = CliRunner().invoke(up_module.up, ["-f", str(app_file), "--gateway-port", str(taken), "--free-ports",
                                              "--state-dir", str(tmp_path / "state")])
    assert asked.exit_code == 1, asked.output  # a port asked for is kept, or fails: never moved
    assert asked.output == (f"error: port {taken} on {HOST} is in use (another clipstream up, or another server); "
                            "stop it, or pass another --gateway-port P\n")
    assert "Traceback" not in result.output + asked.output and not (tmp_path / "state").exists()


def test_a_wrong_app_file_fails_before_kafka_and_redis_start(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A misspelt key is named at once: nothing is started, and so nothing has to be stopped."""
    _nothing_may_start(monkeypatch)
    (tmp_path / "app.yaml").write_text("apps:\n  - {name: a, polcy: single, models: []}\nmodels: []\n")
    result = CliRunner().invoke(up_module.up, ["-f", str(tmp_path / "app.yaml"), "--free-ports",
                                               "--state-dir", str(tmp_path / "state")])
    assert result.exit_code == 1 and "did you mean `policy`" in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "state").exists()


def test_a_stages_bad_setting_stops_up_before_anything_starts(monkeypatch: pytest.MonkeyPatch, app_file: Path,
                                                                tmp_path: Path) -> None:
    """A gateway certificate without its key would fail the gateway once Kafka, Redis and every
    other stage were up: it fails up at once, with the setting named and no secret shown."""
    _nothing_may_start(monkeypatch)
    monkeypatch.setenv("CLIPSTREAM_GATEWAY_TLS_CERT", str(tmp_path / "cert.pem"))
    monkeypatch.setenv("CLIPSTREAM_GATEWAY_API_KEYS", "LEAKME")
    result = CliRunner().invoke(up_module.up, ["-f", str(app_file), "--free-ports", "--state-dir", str(tmp_path / "s")])
    assert result.exit_code == 2 and "TLS_CERT and CLIPSTREAM_GATEWAY_TLS_KEY go together" in result.output, \
        result.output
    assert "LEAKME" not in result.output and not (tmp_path / "s").exists()


def test_free_ports_moves_the_gateway_off_a_taken_default_port(monkeypatch: pytest.MonkeyPatch, taken: int) -> None:
    monkeypatch.delenv("CLIPSTREAM_GATEWAY_HOST", raising=False)
    monkeypatch.setenv("CLIPSTREAM_GATEWAY_PORT", str(taken))
    port = ports.choose_http_port(None, free_ports=True)
    assert port is not None and port != taken
    assert ports.bind_once(HOST, port) == port  # free indeed
    monkeypatch.setenv("CLIPSTREAM_GATEWAY_PORT", "80a")
    with pytest.raises(ClipstreamError, match=r"CLIPSTREAM_GATEWAY_PORT='80a' is not a port.*--gateway-port P"):
        ports.choose_http_port(None, free_ports=False)


def test_the_check_leaves_the_port_to_gateways_that_share_it_and_sees_another_ups(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CLIPSTREAM_GATEWAY_HOST", raising=False)
    port = ports.bind_once(HOST, 0)
    assert ports.choose_http_port(port, free_ports=False) == port
    # CLIPSTREAM_UP_GATEWAYS=2: both bind the port after the check (SO_REUSEPORT), as the gateways do
    first, second = shared_socket(HOST, port, 8), shared_socket(HOST, port, 8)
    try:  # another up's gateways, sharing the port among themselves, hold it against this one
        with pytest.raises(ports.GatewayPortTaken, match=f"port {port} on {HOST} is in use"):
            ports.choose_http_port(port, free_ports=False)
    finally:
        first.close()
        second.close()


# prints its line, then exits only once ``up``'s tee has written it to the log (no race with the quote)
FAILING_CHILD = '''
import sys, time
from pathlib import Path
print("error: address already in use", flush=True)
deadline = time.monotonic() + 30
while b"already in use" not in Path(sys.argv[1]).read_bytes() and time.monotonic() < deadline:
    time.sleep(0.01)
sys.exit(3)
'''


def test_a_stage_that_exits_before_ready_is_quoted_with_this_runs_output_only(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    earlier = "ready: gateway http://127.0.0.1:8080\n" * 3  # what earlier runs left in the log
    (logs / "gateway.log").write_text(earlier)
    sup = Supervisor(logs, report=lambda _: None)
    sup.add("gateway", [sys.executable, "-c", FAILING_CHILD, str(logs / "gateway.log")], {})
    with pytest.raises(ClipstreamError) as failed:
        sup.wait_ready(60)
    message = str(failed.value)
    assert message.startswith(f"stage gateway exited with code 3 before it was ready; see {logs / 'gateway.log'}:\n")
    assert message.endswith(":\nerror: address already in use") and "ready: gateway" not in message
    assert (logs / "gateway.log").read_text().startswith(earlier)  # earlier runs' lines are kept
    assert tail(logs / "gateway.log", lines=2) == "ready: gateway http://127.0.0.1:8080\nerror: address already in use"


def test_a_worker_whose_model_does_not_load_says_to_deploy_a_fix_roll_back_or_remove_it(tmp_path: Path) -> None:
    folder = make_python_model(tmp_path / "models", "sumnet", "class Model:\n    pass\n", labels=[0, 1],
                               class_name="NoSuchModel", shape=(2,))
    sup = Supervisor(tmp_path / "logs", report=lambda _: None)
    pipeline = Pipeline(sup, {})
    sup.hint = pipeline.hint
    sup.add("worker-sumnet-v1-0", stage_argv("worker", "--model", "sumnet", "--version", "1", "--path", str(folder)),
            {**os.environ, "PYTHONUNBUFFERED": "1"})
    log = tmp_path / "logs" / "worker-sumnet-v1-0.log"
    # the worker's reason in the log before the quote is taken: its last line may be teed just after it exits
    wait_until(lambda: log.exists() and b"NoSuchModel" in log.read_bytes(), 120, "the worker to say why its model did not load")
    with pytest.raises(ClipstreamError) as failed:
        sup.wait_ready(120)
    first = str(failed.value).splitlines()[0]
    assert first.startswith("stage worker-sumnet-v1-0 exited with code 1 before it was ready; if its model does "
                            "not load or keeps failing, fix the model and deploy it as a new version (clipstream deploy-model "
                            "sumnet PATH --version N), roll it back (clipstream rollback sumnet), or remove it "
                            "(clipstream remove-model sumnet --unlink, and take it out of the app file); see "), first
    assert "NoSuchModel" in str(failed.value)  # the worker's own reason, quoted from its log
    gateway = Stage("gateway", stage_argv("gateway"), {}, tmp_path / "gateway.log")
    assert pipeline.hint(gateway) == ""  # only a worker's model is fixed that way
    pipeline.app_file = "app.yaml"  # while up starts from a file, the file is where the fix goes
    worker = sup.stages["worker-sumnet-v1-0"]
    assert pipeline.hint(worker).startswith("; app.yaml is applied at every start: fix the model's `path:`")
    assert pipeline.hint(gateway) == ""  # a gateway's port, say, is not fixed in the app file


@pytest.mark.parametrize(("named", "kafka_ok", "redis_ok", "reason"), [
    ({"CLIPSTREAM_KAFKA_BOOTSTRAP": "k1:9092,k2:9092"}, False, True,
     "Kafka at k1:9092,k2:9092 (CLIPSTREAM_KAFKA_BOOTSTRAP) does not answer"),
    ({"CLIPSTREAM_KAFKA_BOOTSTRAP": "k1:9092"}, True, False,
     "Redis at redis://127.0.0.1:6379/0 does not answer, and up starts a local one only together"),
    ({"CLIPSTREAM_REDIS_URL": "redis://r:6379/0"}, True, False,
     "Redis at redis://r:6379/0 (CLIPSTREAM_REDIS_URL) does not answer"),
])
def test_a_kafka_or_redis_named_on_purpose_is_never_swapped_for_a_local_one(
        monkeypatch: pytest.MonkeyPatch, named: dict[str, str], kafka_ok: bool, redis_ok: bool, reason: str) -> None:
    from clipstream.settings import Settings

    for var in ("CLIPSTREAM_KAFKA_BOOTSTRAP", "CLIPSTREAM_REDIS_URL"):
        monkeypatch.delenv(var, raising=False)
    for var, value in named.items():
        monkeypatch.setenv(var, value)
    asked: list[dict[str, Any]] = []
    monkeypatch.setattr(up_module, "kafka_refusal", lambda bootstrap, config: (asked.append(config) or kafka_ok, None))
    monkeypatch.setattr(up_module, "_redis_answers", lambda settings: redis_ok)
    monkeypatch.setattr(up_module.launcher, "up", lambda *a, **k: pytest.fail("a local Kafka and Redis were started"))
    monkeypatch.setattr(up_module.launcher, "status", lambda *a, **k: pytest.fail("the local ones were looked for"))
    with pytest.raises(ClipstreamError, match=re.escape(reason)):
        up_module._ensure_infra(Settings(), free_ports=True)
    assert asked and asked[0]["bootstrap.servers"] == Settings().kafka_bootstrap


def test_up_says_when_it_uses_a_kafka_and_redis_it_did_not_start(monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Left by an `infra up`, or by an `up` killed outright: used, and said, with how to stop them,
    as this up's Ctrl-C will not."""
    from clipstream.infra.launcher import InfraStatus
    from clipstream.settings import Settings

    for var in ("CLIPSTREAM_KAFKA_BOOTSTRAP", "CLIPSTREAM_REDIS_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(up_module, "kafka_refusal", lambda bootstrap, config: (False, None))
    monkeypatch.setattr(up_module, "_redis_answers", lambda settings: False)
    monkeypatch.setattr(up_module.launcher, "up", lambda *a, **k: pytest.fail("a second Kafka and Redis were started"))
    recorded = InfraStatus("127.0.0.1:40001", "redis://127.0.0.1:40002/0", kafka_running=True, redis_running=True,
                           state_dir=Path("/s"))
    monkeypatch.setattr(up_module.launcher, "status", lambda settings: recorded)
    settings, started, note = up_module._ensure_infra(Settings(), free_ports=True)
    assert not started and settings.kafka_bootstrap == "127.0.0.1:40001"
    # said by up once it holds the topic prefix: a second up, refused, must not point at them
    assert note == "using the Kafka and Redis recorded in /s, which this up did not start (`clipstream infra " \
                   "down --state-dir /s` stops them)" and capsys.readouterr().out == ""


def test_a_secured_kafka_is_asked_with_its_security_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from clipstream.settings import Settings

    monkeypatch.setenv("CLIPSTREAM_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("CLIPSTREAM_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
    asked: list[dict[str, Any]] = []
    monkeypatch.setattr(up_module, "kafka_refusal", lambda bootstrap, config: (asked.append(config) or True, None))
    monkeypatch.setattr(up_module, "_redis_answers", lambda settings: True)
    settings = Settings()
    assert up_module._ensure_infra(settings, free_ports=False) == (settings, False, None)
    assert asked[0]["security.protocol"] == "SASL_SSL" and asked[0]["sasl.mechanism"] == "SCRAM-SHA-512"


def test_up_says_how_other_commands_reach_the_infra_it_moved() -> None:
    from clipstream.settings import Settings
    from clipstream.up import cli_exports

    own = Settings(_env_file=None)
    assert cli_exports(own, own) == ""  # the defaults reach it: nothing to say
    moved = own.model_copy(update={"kafka_bootstrap": "127.0.0.1:53911", "redis_url": "redis://:pw@127.0.0.1:41231/0",
                                   "state_dir": Path("/tmp/my state")})
    assert cli_exports(moved, own) == ("export CLIPSTREAM_KAFKA_BOOTSTRAP=127.0.0.1:53911 "
                                       "CLIPSTREAM_REDIS_URL='redis://:***@127.0.0.1:41231/0' "
                                       "CLIPSTREAM_STATE_DIR='/tmp/my state'")


def test_up_names_the_gateway_https_when_it_has_a_certificate() -> None:
    from clipstream.up import gateway_url

    assert gateway_url({}, 8080) == "http://127.0.0.1:8080"
    tls = {"CLIPSTREAM_GATEWAY_TLS_CERT": "/c.pem", "CLIPSTREAM_GATEWAY_TLS_KEY": "/k.pem", "CLIPSTREAM_GATEWAY_HOST": "0.0.0.0"}
    assert gateway_url(tls, 8443) == "https://0.0.0.0:8443"


def test_the_grpc_port_is_off_unless_asked_and_checked_before_anything_starts(
        monkeypatch: pytest.MonkeyPatch, taken: int) -> None:
    monkeypatch.delenv("CLIPSTREAM_GATEWAY_HOST", raising=False)
    monkeypatch.delenv("CLIPSTREAM_GATEWAY_GRPC_PORT", raising=False)
    assert ports.choose_grpc_port(None, free_ports=False) is None
    chosen = ports.choose_grpc_port(0, free_ports=False)  # one free port, which every gateway then shares
    assert chosen is not None and chosen > 0 and ports.bind_once(HOST, chosen) == chosen
    monkeypatch.setenv("CLIPSTREAM_GATEWAY_GRPC_PORT", str(taken))
    with pytest.raises(ports.GatewayPortTaken, match=f"gRPC port {taken} on {HOST} is in use.*--grpc-port P"):
        ports.choose_grpc_port(None, free_ports=False)
    moved = ports.choose_grpc_port(None, free_ports=True)
    assert moved is not None and moved != taken
    with pytest.raises(ports.GatewayPortTaken, match="--grpc-port P"):
        ports.choose_grpc_port(taken, free_ports=True)  # a port asked for is kept, or fails: never moved
    monkeypatch.setenv("CLIPSTREAM_GATEWAY_GRPC_PORT", "x1")
    with pytest.raises(ClipstreamError, match=r"CLIPSTREAM_GATEWAY_GRPC_PORT='x1' is not a port.*--grpc-port P"):
        ports.choose_grpc_port(None, free_ports=False)


def test_stopping_says_the_infrastructure_went_too_only_when_up_started_it(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Once ``up`` stops the Kafka it started, ``inspect`` has nothing to read: the last lines
    say so, and how to keep them."""
    from clipstream.settings import Settings

    downs: list[Settings] = []
    monkeypatch.setattr(up_module.launcher, "down", downs.append)
    up_module._Run(Settings(), started_infra=False).clean_up()
    assert capsys.readouterr().err == "stopping...\nstopped\n" and not downs
    up_module._Run(Settings(), started_infra=True).clean_up()
    said = capsys.readouterr().err.splitlines()
    assert len(downs) == 1 and said[0] == "stopping..." and said[-1] == "stopped"
    assert said[1].startswith("stopped Kafka and Redis too") and "`clipstream infra up` before `up`" in said[1]
