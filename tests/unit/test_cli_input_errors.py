"""A user's mistake (an app file's field, a CLI option, a CLIPSTREAM_* value) is one line that
names it, checked before any Kafka work; infrastructure failures say what to do next."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner, Result

import frontend.cli as registry_cli
import frontend.inspect_cli as inspect_cli
import frontend.serving as serving
import topics.tail as tail
from clipstream.cli import main
from clipstream.errors import ConfigError, InfraError
from clipstream.infra import kafka as kafka_mod
from clipstream.infra import secure
from clipstream.settings import Settings
from frontend.gateway_cli import _serve, bind_failure
from registry.appfile import check_default_output, check_policy, load_app_file
from registry.topic import AppConfig, ModelConfig, RegistryFollower, RegistryView, RegistryWriter, wait_for

MODEL_YAML = """backend: python
class: m:M
input: {dtype: float32, shape: [4]}
output: {kind: class_scores, labels: [0, 1]}
"""


def _model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "models" / "m" / "1"
    d.mkdir(parents=True)
    (d / "model.yaml").write_text(MODEL_YAML)
    return d


class NoKafka:
    """Stands in for every registry call that would reach Kafka; records what was asked."""

    def __init__(self, view: RegistryView | None = None) -> None:
        self.view = view
        self.topics: list[tuple[str, int]] = []
        self.writes: list[tuple[str, tuple[Any, ...]]] = []
        self.tails: dict[str, dict[int, bytes]] = {}  # topic -> partition -> its last record
        self.knobs: list[dict[str, Any]] = []  # the keyword arguments of each write
        self.redis: dict[str, bytes] = {}  # what Redis holds (policy states), for inspect
        self.hashes: dict[str, dict[bytes, bytes]] = {}  # the workers' word on their models (clipstream.loaded)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> NoKafka:
        fake = self

        class Writer:
            def __init__(self, settings: Settings) -> None:
                if fake.view is None:
                    raise AssertionError("the registry was written to")

            def __enter__(self) -> Writer:
                return self

            def __exit__(self, *exc: object) -> None:
                pass

            def __getattr__(self, verb: str) -> Any:
                return lambda *args, **kwargs: (fake.writes.append((verb, args)), fake.knobs.append(kwargs))

        def read_view(settings: Settings, timeout_s: float = 30.0) -> RegistryView:
            if fake.view is None:
                raise AssertionError("the registry was read")
            return fake.view

        def ensure_model_topics(settings: Settings, name: str, replicas: int) -> None:
            if fake.view is None:
                raise AssertionError("topics were created")
            fake.topics.append((name, replicas))

        def last_records(settings: Settings, topic: str, partitions: int, timeout_s: float = 10.0) -> dict[int, bytes]:
            return {p: v for p, v in fake.tails.get(topic, {}).items() if p < partitions}

        class Redis:
            def mget(self, keys: list[str]) -> list[bytes | None]:
                return [fake.redis.get(k) for k in keys]

            def hgetall(self, key: str) -> dict[bytes, bytes]:
                return fake.hashes.get(key, {})

            def close(self) -> None:
                pass

        monkeypatch.setattr(tail, "last_records", last_records)
        monkeypatch.setattr(serving, "sync_client", lambda settings: Redis())
        monkeypatch.setattr(registry_cli, "RegistryWriter", Writer)
        monkeypatch.setattr(registry_cli, "read_view", read_view)
        monkeypatch.setattr(inspect_cli, "read_view", read_view)
        monkeypatch.setattr(registry_cli, "ensure_model_topics", ensure_model_topics)
        return self


def _one_line_error(result: Result, code: int, *fragments: str) -> None:
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]


# 1. app files: each field's type is checked, and the message names the field


@pytest.mark.parametrize(
    ("model", "app", "reason"),
    [
        ("replicas: two", "", "models[0].replicas must be an integer, not 'two'"),
        ("replicas: 0", "", "models[0].replicas must be from 1 to 256, not 0"),
        ("replicas: 100000", "", "models[0].replicas must be from 1 to 256, not 100000: each replica is a worker"),
        ("max_batch_size: 0", "", "models[0].max_batch_size must be at least 1 and at most 65,536, not 0"),
        ("max_batch_size: 100000000", "", "models[0].max_batch_size must be at least 1 and at most 65,536"),
        ("batch_delay_ms: -1", "", "models[0].batch_delay_ms must be at least 0 and at most 60,000, not -1"),
        ("latency_objective_ms: 0", "", "models[0].latency_objective_ms must be more than 0 and at most 60,000"),
        ("replicas: true", "", "models[0].replicas must be an integer, not True"),
        ("max_batch_size: 1.5", "", "models[0].max_batch_size must be an integer"),
        ("latency_objective_ms: soon", "", "models[0].latency_objective_ms must be a number"),
        ("", "policy: 5", "apps[0].policy must be exp3, exp4, single or pkg.module:Class, not 5"),
        ("", "policy: exp5", "apps[0].policy must be exp3, exp4, single or pkg.module:Class, not 'exp5'"),
        ("", "slo_ms: fast", "apps[0].slo_ms must be a number, not 'fast'"),
        ("", "slo_ms: 0", "apps[0].slo_ms must be more than 0 and at most 3,600,000 ms (an hour), not 0"),
        ("", "slo_ms: 1e12", "apps[0].slo_ms must be a number, not '1e12' (YAML reads an exponent without a dot"),
        ("", "slo_ms: 1000000000000", "apps[0].slo_ms must be more than 0 and at most 3,600,000 ms (an hour), not 1e+12"),
        ("", "slo_ms: .nan", "apps[0].slo_ms must be a number"),
        ("", "default_output: [1, 2]", "apps[0].default_output must be null, a boolean, a number or a string"),
        ("", "default_output: {a: 1}", "apps[0].default_output must be null, a boolean, a number or a string"),
        ("", "policy_config: 5", "apps[0].policy_config must be a mapping"),
        ("", "policy_config: {eta: big}", "apps[0].policy_config.eta must be a number, not 'big'"),
        ("", "models: m", "apps[0].models must be a list, not 'm'"),
    ],
)
def test_an_app_file_field_of_the_wrong_type_is_named(tmp_path: Path, model: str, app: str, reason: str) -> None:
    _model_dir(tmp_path)
    f = tmp_path / "app.yaml"
    f.write_text(f"apps:\n  - {{name: a, models: [m], {app}}}\nmodels:\n  - {{name: m, path: models/m/1, {model}}}\n")
    with pytest.raises(ConfigError) as caught:
        load_app_file(f)
    assert str(caught.value).startswith(f"{f}: {reason}"), caught.value


def test_a_list_where_apps_or_models_go_is_named(tmp_path: Path) -> None:
    f = tmp_path / "app.yaml"
    f.write_text("models: 5\n")
    with pytest.raises(ConfigError, match=r"models must be a list, not 5"):
        load_app_file(f)


def test_good_values_of_every_type_pass(tmp_path: Path) -> None:
    _model_dir(tmp_path)
    f = tmp_path / "app.yaml"
    for value, expected in (("-1", -1), ("0.5", 0.5), ("true", True), ("cat", "cat"), ("null", None)):
        f.write_text(f"apps:\n  - {{name: a, models: [m], slo_ms: 20, policy: 'pkg.mod:P', default_output: {value}}}\n"
                     "models:\n  - {name: m, path: models/m/1, replicas: 3, max_batch_size: 8}\n")
        spec = load_app_file(f)
        assert spec.apps[0]["default_output"] == expected
        assert (spec.apps[0]["slo_ms"], spec.apps[0]["policy"]) == (20.0, "pkg.mod:P")
        assert (spec.models[0]["replicas"], spec.models[0]["max_batch_size"]) == (3, 8)


def test_the_shared_checks_name_where_the_value_came_from() -> None:
    assert check_policy("single") == "single" and check_policy("a.b:C") == "a.b:C"
    with pytest.raises(ConfigError, match=r"^--policy must be .*not 'exp5'$"):
        check_policy("exp5", "--policy")
    assert check_default_output(False) is False
    with pytest.raises(ConfigError, match=r"^x must be null, a boolean, a number or a string, not \[1\]$"):
        check_default_output([1], "x")


# 2. register-app: --default-output and --policy are checked before Kafka


@pytest.mark.parametrize(
    ("args", "code", "fragments"),
    [
        (["--default-output", "[1"], 1, ("--default-output '[1' is not valid YAML", "quote a string")),
        (["--default-output", "[1, 2]"], 1, ("--default-output '[1, 2]' must be null, a boolean",)),
        (["--policy", "exp5"], 1, ("--policy must be exp3, exp4, single or pkg.module:Class, not 'exp5'",)),
        (["--slo-ms", "0"], 2, ("--slo-ms",)),
    ],
)
def test_register_app_refuses_bad_options_before_kafka(
    monkeypatch: pytest.MonkeyPatch, args: list[str], code: int, fragments: tuple[str, ...]
) -> None:
    NoKafka().install(monkeypatch)
    result = CliRunner().invoke(main, ["register-app", "digits", *args])
    if code == 2:  # click's own usage error
        assert result.exit_code == 2 and all(f in result.output for f in fragments), result.output
    else:
        _one_line_error(result, code, *fragments)


def test_register_app_writes_the_parsed_default_output(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = NoKafka(RegistryView()).install(monkeypatch)
    result = CliRunner().invoke(main, ["register-app", "digits", "--policy", "single", "--default-output", "-1"])
    assert result.exit_code == 0, result.output
    assert fake.writes == [("app", ("digits", "single", 50.0, -1, None))]


# 3. link: the app and the model must be in the registry


def _view(*models: str, linked: tuple[str, ...] = ()) -> RegistryView:
    return RegistryView(
        apps={"digits": AppConfig(name="digits", policy="exp4", slo_ms=50.0, default_output=None, models=linked)},
        models={m: ModelConfig(name=m, version="1", path=Path("/m"), replicas=3) for m in models},
    )


def test_check_link_refuses_an_unknown_app_or_model() -> None:
    registry_cli.check_link(_view("logreg"), "digits", "logreg")
    with pytest.raises(registry_cli.ClipstreamError, match=r"^no model 'typo' in the registry: deploy it first "
                                                         r"with `clipstream deploy-model`$"):
        registry_cli.check_link(_view("logreg"), "digits", "typo")
    with pytest.raises(registry_cli.ClipstreamError, match=r"^no app 'nope' in the registry: .*register-app"):
        registry_cli.check_link(_view("logreg"), "nope", "logreg")
    # a model already gone can still be unlinked from the app that names it
    registry_cli.check_link(_view(linked=("gone",)), "digits", "gone", unlink=True)
    with pytest.raises(registry_cli.ClipstreamError, match="no model 'typo'"):
        registry_cli.check_link(_view(linked=("gone",)), "digits", "typo", unlink=True)


def test_check_link_refuses_a_model_whose_classes_are_not_the_apps() -> None:
    """The same labels in another order are fine (the selector reorders scores); others are not."""
    from registry.spec import ModelSpec, OutputSpec, TensorSpec

    def model(name: str, labels: tuple[object, ...]) -> ModelConfig:
        spec = ModelSpec(Path("/m"), "python", TensorSpec("float32", (4,)), OutputSpec("class_scores", labels))
        return ModelConfig(name=name, version="1", path=Path("/m"), spec=spec)

    view = RegistryView(
        apps={"iris": AppConfig(name="iris", policy="exp4", slo_ms=50.0, default_output=None, models=("lr",))},
        models={"lr": model("lr", ("setosa", "versicolor", "virginica")),
                "shuffled": model("shuffled", ("virginica", "setosa", "versicolor")),
                "ints": model("ints", (0, 1, 2))})
    registry_cli.check_link(view, "iris", "shuffled")
    with pytest.raises(registry_cli.ClipstreamError, match=r"cannot link 'ints' to 'iris': its labels \['0', '1', "
                                                         r"'2'\] are not those of 'lr'"):
        registry_cli.check_link(view, "iris", "ints")


def test_link_to_a_model_that_does_not_exist_writes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = NoKafka(_view("logreg")).install(monkeypatch)
    _one_line_error(CliRunner().invoke(main, ["link", "digits", "typo"]), 1, "no model 'typo' in the registry")
    assert fake.writes == []
    assert CliRunner().invoke(main, ["link", "digits", "logreg"]).exit_code == 0
    assert fake.writes == [("link", ("digits", "logreg"))]


# 4. deploy-model --replicas: at least 1, and an explicit 1 is obeyed


def test_deploy_model_refuses_zero_replicas_before_kafka(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    NoKafka().install(monkeypatch)
    result = CliRunner().invoke(main, ["deploy-model", "m", str(_model_dir(tmp_path)), "--replicas", "0"])
    assert result.exit_code == 2 and "--replicas" in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(main, ["set-replicas", "m", "0"])
    assert result.exit_code == 2 and "REPLICAS" in result.output


def test_deployed_replicas_keeps_the_current_number_unless_asked() -> None:
    current = ModelConfig(name="m", version="1", path=Path("/m"), replicas=3)
    assert registry_cli.deployed_replicas(None, current) == 3
    assert registry_cli.deployed_replicas(1, current) == 1
    assert registry_cli.deployed_replicas(None, None) == 1


@pytest.mark.parametrize(("args", "replicas"), [([], 3), (["--replicas", "1"], 1)])
def test_deploy_model_obeys_an_explicit_replicas_1(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, args: list[str], replicas: int
) -> None:
    fake = NoKafka(_view("m")).install(monkeypatch)
    result = CliRunner().invoke(main, ["deploy-model", "m", str(_model_dir(tmp_path)), "--version", "2", *args])
    assert result.exit_code == 0, result.output
    assert fake.topics == [("m", replicas)] and fake.writes[0][1][3] == replicas


# 5. a bad CLIPSTREAM_* value: one error naming the setting, exit 2, no traceback


@pytest.mark.parametrize(
    "args",
    [
        ["inspect"],
        ["link", "digits", "m"],
        ["register-app", "digits"],
        ["rollback", "m"],
        ["infra", "status"],
        ["infra", "down"],
        ["topics", "create"],
        ["up", "-f", "APP"],
    ],
)
def test_a_bad_setting_is_one_line_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, args: list[str]
) -> None:
    NoKafka().install(monkeypatch)
    monkeypatch.setattr("topics.cli.ensure_stage_topics", lambda *a: pytest.fail("Kafka was asked"))
    monkeypatch.setattr("clipstream.up._ensure_infra", lambda *a: pytest.fail("infra was started"))
    app = tmp_path / "app.yaml"
    app.write_text("apps: []\n")
    args = [str(app) if a == "APP" else a for a in args]
    result = CliRunner().invoke(main, args, env={"CLIPSTREAM_KAFKA_PORT": "abc",
                                                 "CLIPSTREAM_STATE_DIR": str(tmp_path)})
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    assert result.stderr.startswith("error:") and "kafka_port" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "'abc'" in result.stderr


# 6. failures that say what to do next


def test_rollback_without_an_earlier_version_says_how_to_make_one(monkeypatch: pytest.MonkeyPatch) -> None:
    NoKafka(_view("m")).install(monkeypatch)
    _one_line_error(CliRunner().invoke(main, ["rollback", "m"]), 1,
                    "model m has no earlier version to roll back to",
                    "clipstream deploy-model m PATH --version V")


def test_registry_timeouts_name_kafka_and_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    follower = RegistryFollower(Settings())
    with pytest.raises(InfraError, match=r"not read within 0s: Kafka at CLIPSTREAM_KAFKA_BOOTSTRAP must answer "
                                         r"\(check with `clipstream infra status`\)"):
        follower.wait_ready(0.01)

    class Ready:
        def __init__(self, settings: Settings, idle_poll_s: float) -> None:
            pass

        def start(self) -> Ready:
            return self

        def wait_ready(self, timeout_s: float) -> RegistryView:
            return RegistryView()

        def view(self) -> RegistryView:
            return RegistryView()

        def stop(self) -> None:
            pass

    monkeypatch.setattr("registry.topic.RegistryFollower", Ready)
    with pytest.raises(InfraError, match=r"expected state in time: Kafka at CLIPSTREAM_KAFKA_BOOTSTRAP must answer"):
        wait_for(Settings(), lambda view: False, timeout_s=0.01)

    writer = object.__new__(RegistryWriter)  # no broker: only its producer is used
    writer._producer = SimpleNamespace(flush=lambda timeout_s: 2)  # type: ignore[assignment]
    with pytest.raises(InfraError, match=r"^2 registry records not delivered within 1s: Kafka at "
                                         r"CLIPSTREAM_KAFKA_BOOTSTRAP must answer \(check with"):
        writer.flush(1.0)


def test_openssl_failure_is_its_last_line_and_a_next_step(tmp_path: Path) -> None:
    failing = [sys.executable, "-c", "import sys; sys.stderr.write('first\\nunable to write key\\n'); sys.exit(3)"]
    with pytest.raises(InfraError) as caught:
        secure._openssl(failing, tmp_path)
    message = str(caught.value)
    assert message.endswith(f"in {tmp_path}: unable to write key; check that {tmp_path} is writable and "
                            "`openssl version` runs, then retry")
    assert "[" not in message  # the line as text, not a Python list
    assert secure._openssl([sys.executable, "-c", "print('pem')"], tmp_path) == "pem\n"


def test_a_secured_broker_that_never_answers_names_its_log(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("confluent_kafka.admin.AdminClient", lambda config: None)
    files = kafka_mod.BrokerFiles.under(tmp_path)
    files.log.write_text("ERROR Address already in use\n")
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    broker = secure.SecureBroker("127.0.0.1:1234", tmp_path / "ca.pem", "u", proc, files)
    with pytest.raises(InfraError) as caught:
        secure._wait(broker, Settings(), timeout_s=5)
    message = str(caught.value)
    assert f"read its log {files.log} for why" in message and "another --port" in message
    assert message.endswith("Address already in use\n")


def test_a_failed_format_says_to_remove_the_data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    files = kafka_mod.BrokerFiles.under(tmp_path)
    monkeypatch.setattr(kafka_mod.subprocess, "run",
                        lambda argv, **kw: subprocess.CompletedProcess(argv, 1, "", "bad cluster id\n"))
    with pytest.raises(InfraError, match=rf"formatting Kafka storage in {files.data_dir} failed: bad cluster id; "
                                         rf"remove {files.data_dir} \(or run `clipstream infra down`\) and retry"):
        kafka_mod.format_storage("java", tmp_path, files)


def test_infra_status_says_how_to_start_what_is_not_running(tmp_path: Path) -> None:
    # a shell that names no Kafka or Redis (a test session's do, and those answer)
    unnamed = {"CLIPSTREAM_KAFKA_BOOTSTRAP": None, "CLIPSTREAM_REDIS_URL": None}
    result = CliRunner().invoke(main, ["infra", "status", "--state-dir", str(tmp_path)], env=unnamed)
    assert result.exit_code == 1
    assert f"start them with `clipstream infra up --state-dir {tmp_path}`" in result.stderr
    assert "start them" not in result.stdout  # stdout keeps the addresses scripts read


def test_a_taken_port_with_reuse_port_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        gw = SimpleNamespace(host="127.0.0.1", port=port)
        assert asyncio.run(_serve(gw, Settings(), reuse_port=True)) == 1
    err = capsys.readouterr().err
    assert err == (f"error: port {port} on 127.0.0.1 is in use (by something that does not share it with "
                   "--reuse-port): choose another with --port or stop what holds it\n")
    assert "check --host and --port" in bind_failure("10.255.255.1", 80, OSError(99, "Cannot assign"))


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--latency-objective-ms", "0"], "--latency-objective-ms must be more than 0"),
        (["--max-batch-size", "0"], "--max-batch-size must be at least 1"),
        (["--batch-delay-ms", "-1"], "--batch-delay-ms must be at least 0"),
        (["--replicas", "100000"], "--replicas must be from 1 to 256"),
    ],
)
def test_the_batcher_holds_its_options_to_the_registrys_bounds(
    monkeypatch: pytest.MonkeyPatch, args: list[str], fragment: str
) -> None:
    NoKafka().install(monkeypatch)
    result = CliRunner().invoke(main, ["batcher", "--model", "m", "--version", "1", "--replicas", "1", *args])
    _one_line_error(result, 1, fragment)


def test_the_batchers_defaults_are_held_to_the_same_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    from batchers.settings import BatcherSettings

    monkeypatch.setenv("CLIPSTREAM_BATCHER_MAX_BATCH_SIZE", "0")
    with pytest.raises(ValueError, match="CLIPSTREAM_BATCHER_MAX_BATCH_SIZE must be at least 1"):
        BatcherSettings()
