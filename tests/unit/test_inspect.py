"""`clipstream inspect`: what each model serves and where, whether its workers have it loaded,
each app's learnt weights, read from the batches, the workers' word and the policy state."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from clipstream.cli import main
from clipstream.settings import Settings
from registry.topic import RegistryView
from tests.unit.test_cli_input_errors import NoKafka, _model_dir
from tests.unit.test_registry_verbs import _model


def test_inspect_shows_each_models_input(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A Kafka client builds its Tensor from the model's input: inspect names it, so the user
    need not open model.yaml."""
    from registry.spec import load_spec

    spec = load_spec(_model_dir(tmp_path))
    NoKafka(RegistryView(models={"m": _model(spec=spec)})).install(monkeypatch)
    shown = CliRunner().invoke(main, ["inspect"])
    assert shown.exit_code == 0 and f"input={spec.input.dtype}{list(spec.input.shape)}" in shown.output, shown.output
    as_json = CliRunner().invoke(main, ["inspect", "--json"])
    assert '"dtype": "%s"' % spec.input.dtype in as_json.output


def test_inspect_of_an_empty_registry_says_so_and_how_to_fill_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing printed at all reads as a command that reached nothing, or a wrong prefix."""
    NoKafka(RegistryView()).install(monkeypatch)
    shown = CliRunner().invoke(main, ["inspect"])
    assert shown.exit_code == 0, shown.output
    assert "holds no app or model: `clipstream apply -f FILE`" in shown.output and "topic prefix" in shown.output
    assert json.loads(CliRunner().invoke(main, ["inspect", "--json"]).output)["apps"] == {}


def test_inspect_shows_the_version_that_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry names version 2 at once; batches go to it once its workers are ready. Until
    then the last batch on each partition still carries version 1, and inspect says so."""
    from schemas import Batch, encode
    from topics.catalogue import Catalogue

    import time

    from clipstream.loaded import key_of, word

    fake = NoKafka(RegistryView(models={"m": _model(version="2", replicas=2)})).install(monkeypatch)
    topic = Catalogue.from_settings(Settings()).batches("m").name

    def batch(version: str, replica: int) -> bytes:
        return encode(Batch(batch_id="b-1", model="m", version=version, replica=replica, created_us=1, items=[]))

    fake.tails[topic] = {0: batch("1", 0), 1: batch("1", 1), 2: batch("3", 2)}  # 2: a removed replica
    # no worker has said it is loaded (no `up` running): the last batches are history
    shown = CliRunner().invoke(main, ["inspect"]).output
    assert " last served=1 NOT LOADED: model m: no worker has said" in shown and "not yet" not in shown, shown
    fake.hashes = {key_of(Settings().topic_prefix, "m"): {b"1:0": word(True, time.time()).encode()}}
    shown = CliRunner().invoke(main, ["inspect"])
    assert shown.exit_code == 0 and "serving=1 (not yet version 2: its workers are not ready" in shown.output
    fake.tails[topic] = {0: batch("2", 0), 1: batch("1", 1)}  # moving: one partition handed over
    assert "serving=1,2 (not yet version 2" in CliRunner().invoke(main, ["inspect"]).output
    fake.tails[topic] = {0: batch("2", 0), 1: batch("2", 1)}
    shown = CliRunner().invoke(main, ["inspect"])
    assert "serving=2" in shown.output and "not yet" not in shown.output
    as_json = json.loads(CliRunner().invoke(main, ["inspect", "--json"]).output)
    assert as_json["models"]["m"]["serving"] == {"0": "2", "1": "2"}
    fake.tails.clear()
    assert "serving=none (no batch sent yet)" in CliRunner().invoke(main, ["inspect"]).output


def test_inspect_does_not_take_a_retired_replica_for_one_that_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scaled back up to two replicas: partition 1's last record is the retirement of the
    replica an earlier scale-down removed, so the new replica has served nothing yet."""
    import time

    from clipstream.loaded import key_of, word
    from schemas import Batch, encode
    from topics.catalogue import Catalogue
    from topics.markers import RETIRE_PREFIX, handover

    fake = NoKafka(RegistryView(models={"m": _model(version="2", replicas=2)})).install(monkeypatch)
    topic = Catalogue.from_settings(Settings()).batches("m").name
    live = encode(Batch(batch_id="b-1", model="m", version="2", replica=0, created_us=1, items=[]))
    fake.tails[topic] = {0: live, 1: encode(handover("m", "2", 1, f"{RETIRE_PREFIX}b-1", 1))}
    fake.hashes = {key_of(Settings().topic_prefix, "m"): {b"2:0": word(True, time.time()).encode()}}
    shown = CliRunner().invoke(main, ["inspect"]).output
    assert "serving=2 (replica 1: no batch yet, its worker may still be starting)" in shown, shown
    assert json.loads(CliRunner().invoke(main, ["inspect", "--json"]).output)["models"]["m"]["serving"] == {"0": "2"}


def test_inspect_tells_a_loaded_replica_waiting_for_traffic_from_one_still_starting(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Right after a scale-up to three replicas, only replica 0 has had a batch: replica 1 says
    it has the version loaded and waits only for traffic; replica 2 has said nothing. A group's
    replica counts as loaded when every member model has it loaded."""
    import time

    from clipstream.loaded import key_of, word
    from registry.groups import groups_of
    from schemas import Batch, encode
    from topics.catalogue import Catalogue

    members = {n: replace(_model(version="2", replicas=3), name=n, group="g") for n in ("a", "b")}
    view = RegistryView(models={"m": _model(version="2", replicas=3), **members}, groups=groups_of(members))
    fake = NoKafka(view).install(monkeypatch)
    catalogue = Catalogue.from_settings(Settings())
    for name, version in (("m", "2"), ("g", view.groups["g"].version)):
        fake.tails[catalogue.batches(name).name] = {0: encode(Batch(batch_id="b-1", model=name, version=version,
                                                                   replica=0, created_us=1, items=[]))}
    loaded = word(True, time.time()).encode()
    prefix = Settings().topic_prefix
    fake.hashes = {key_of(prefix, "m"): {b"2:0": loaded, b"2:1": loaded},
                   key_of(prefix, "a"): {b"2:0": loaded, b"2:1": loaded, b"2:2": loaded},
                   key_of(prefix, "b"): {b"2:0": loaded, b"2:1": loaded}}
    lines = {line.split(":")[0]: line for line in CliRunner().invoke(main, ["inspect"]).output.splitlines()}
    for name, version in (("model m", "2"), ("group g", view.groups["g"].version)):
        assert lines[name].endswith(f"serving={version} (replica 1: loaded, no batch sent to it yet) (replica 2: no batch yet, "
                                    "its worker may still be starting)"), lines[name]
    as_json = json.loads(CliRunner().invoke(main, ["inspect", "--json"]).output)
    assert as_json["models"]["m"]["loaded_replicas"] == [0, 1] and as_json["models"]["a"]["loaded_replicas"] == [0, 1, 2]


def test_inspect_shows_each_apps_learnt_weights_and_each_models_knobs(monkeypatch: pytest.MonkeyPatch) -> None:
    from registry.topic import AppConfig

    app = AppConfig(name="digits", policy="exp4", slo_ms=50, default_output=None, models=("m", "n"))
    model = replace(_model(), max_batch_size=8, batch_delay_ms=20.0)
    fake = NoKafka(RegistryView(apps={"digits": app}, models={"m": model})).install(monkeypatch)
    fake.redis["cs:state:digits:__global__"] = json.dumps(
        {"policy": "exp4", "models": ["m", "n"], "log_w": [0.0, -math.log(3)], "n_observed": 9}).encode()
    shown = CliRunner().invoke(main, ["inspect"]).output
    assert "weights: m=0.75 n=0.25 (from 9 feedbacks)" in shown and "max_batch_size=8 batch_delay_ms=20" in shown, shown
    as_json = json.loads(CliRunner().invoke(main, ["inspect", "--json"]).output)
    assert as_json["apps"]["digits"]["weights"] == {"m": 0.75, "n": 0.25}
    assert as_json["apps"]["digits"]["feedbacks_learnt"] == 9
    # the state was last taught by version 2 of m; version 1 serves again (rolled back)
    fake.redis["cs:state:digits:__global__"] = json.dumps(
        {"policy": "exp4", "models": ["m", "n"], "log_w": [-10.0, 0.0], "versions": {"m": "2"},
         "left": {"m@1": math.log(3)}}).encode()
    assert "weights: m=0.75 n=0.25" in CliRunner().invoke(main, ["inspect"]).output
    assert as_json["models"]["m"]["max_batch_size"] == 8 and as_json["models"]["m"]["latency_objective_ms"] is None


def test_inspect_shows_the_weights_over_the_models_the_app_links_now(monkeypatch: pytest.MonkeyPatch) -> None:
    from registry.topic import AppConfig

    app = AppConfig(name="digits", policy="exp3", slo_ms=50, default_output=None, models=("m", "o"))
    fake = NoKafka(RegistryView(apps={"digits": app}, models={"m": _model(), "o": _model()})).install(monkeypatch)
    # stored before n was unlinked and o linked: the selector chooses between m and o now
    fake.redis["cs:state:digits:__global__"] = json.dumps(
        {"policy": "exp3", "models": ["m", "n"], "log_w": [0.0, -10.0], "n_observed": 5}).encode()
    assert "weights: m=0.50 o=0.50 (from 5 feedbacks)" in CliRunner().invoke(main, ["inspect"]).output
    # n linked again in place of o: it has its own weight back, as the selector gives it
    fake.redis["cs:state:digits:__global__"] = json.dumps(
        {"policy": "exp3", "models": ["m", "o"], "log_w": [0.0, 0.0], "left": {"n@-": -math.log(3)}}).encode()
    linked_again = replace(app, models=("m", "n"))
    fake.view = RegistryView(apps={"digits": linked_again}, models={"m": _model(), "n": _model()})
    assert "weights: m=0.75 n=0.25" in CliRunner().invoke(main, ["inspect"]).output


def test_inspect_says_which_models_no_replica_has_loaded_and_why(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from clipstream.loaded import key_of, word

    view = RegistryView(models={"m": _model(), "ok": _model()})
    fake = NoKafka(view).install(monkeypatch)
    prefix = Settings().topic_prefix
    fake.hashes = {key_of(prefix, "m"): {b"1:0": word(False, time.time(), "ImportError: no module xgb").encode()},
                   key_of(prefix, "ok"): {b"1:0": word(True, time.time(), device="cuda").encode(),
                                          b"1:1": word(True, time.time(), device="cpu").encode()}}
    shown = CliRunner().invoke(main, ["inspect"])
    lines = {line.split(":")[0]: line for line in shown.output.splitlines()}
    assert lines["model m"].endswith("NOT LOADED: model m version 1 replica 0 did not load: ImportError: no module xgb")
    assert "NOT LOADED" not in lines["model ok"] and lines["model ok"].endswith(" device=cpu,cuda"), shown.output
    assert "device=" not in lines["model m"]
    as_json = json.loads(CliRunner().invoke(main, ["inspect", "--json"]).output)
    assert as_json["models"]["ok"]["not_loaded"] is None and "xgb" in as_json["models"]["m"]["not_loaded"]
    assert as_json["models"]["ok"]["devices"] == ["cpu", "cuda"] and as_json["models"]["m"]["devices"] == []
    assert as_json["models"]["ok"]["running"] is True and as_json["models"]["m"]["running"] is False


def test_inspect_names_a_new_versions_failure_to_load_while_the_old_one_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from clipstream.loaded import key_of, word

    fake = NoKafka(RegistryView(models={"m": _model(version="2")})).install(monkeypatch)
    fake.hashes = {key_of(Settings().topic_prefix, "m"): {
        b"1:0": word(True, time.time(), device="cpu").encode(),
        b"2:0": word(False, time.time(), "model.yaml: device cuda was requested but no usable CUDA device").encode()}}
    line = CliRunner().invoke(main, ["inspect"]).output.strip()
    assert line.endswith(" device=cpu VERSION 2 FAILED TO LOAD: replica 0 did not load it: model.yaml: device cuda "
                         "was requested but no usable CUDA device"), line
    model = json.loads(CliRunner().invoke(main, ["inspect", "--json"]).output)["models"]["m"]
    assert model["running"] is True and model["not_loaded"] is None and "no usable CUDA" in model["failed_to_load"]
    assert model["devices"] == ["cpu"]
    from schemas import Batch, encode
    from topics.catalogue import Catalogue

    fake.tails[Catalogue.from_settings(Settings()).batches("m").name] = {
        0: encode(Batch(batch_id="b-1", model="m", version="1", replica=0, created_us=1, items=[]))}
    line = CliRunner().invoke(main, ["inspect"]).output.strip()  # version 1's batches: not "waiting" for 2
    assert " serving=1 (version 2 did not load) device=cpu VERSION 2 FAILED TO LOAD" in line and "not yet" not in line
