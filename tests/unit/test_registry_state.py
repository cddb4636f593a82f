"""Folding registry records into a view, and app files (no broker)."""

from __future__ import annotations

from pathlib import Path

import pytest

from clipstream.errors import ConfigError, DecodeError
from registry.appfile import load_app_file
from registry.topic import RegistryState, RegistryWriter
from schemas import App, Link, Model, encode

MODEL_YAML = """backend: python
class: m:M
input: {dtype: float32, shape: [4]}
output: {kind: class_scores, labels: [0, 1]}
"""


def _model_dir(tmp_path: Path, name: str) -> Path:
    d = tmp_path / "models" / name / "1"
    d.mkdir(parents=True)
    (d / "model.yaml").write_text(MODEL_YAML)
    return d


def _app(name="digits", policy="exp4"):
    return encode(App(name=name, policy=policy, slo_ms=50.0, default_output=-1, updated_us=1))


def _link(app, model, us, linked=True):
    return encode(Link(app=app, model=model, linked=linked, updated_us=us))


def test_links_keep_their_order_and_unlinking_removes(tmp_path):
    state = RegistryState()
    state.apply("app:digits", _app())
    state.apply("link:digits:b", _link("digits", "b", 1))
    state.apply("link:digits:a", _link("digits", "a", 2))
    assert state.view().apps["digits"].models == ("b", "a")
    state.apply("link:digits:b", _link("digits", "b", 3, linked=False))
    assert state.view().apps["digits"].models == ("a",)
    state.apply("app:digits", None)
    assert "digits" not in state.view().apps


def test_model_spec_is_loaded_and_errors_are_kept(tmp_path):
    good = _model_dir(tmp_path, "good")
    state = RegistryState()
    for name, path in (("good", good), ("bad", tmp_path / "nowhere")):
        state.apply(
            f"model:{name}",
            encode(Model(name=name, version="1", path=str(path), replicas=2, updated_us=1)),
        )
    view = state.view()
    assert view.models["good"].spec.output.labels == (0, 1)
    assert view.models["good"].replicas == 2
    assert view.models["bad"].spec is None and "model.yaml" in view.models["bad"].spec_error


def test_app_file_resolves_paths_relative_to_the_file(tmp_path):
    _model_dir(tmp_path, "logreg")
    f = tmp_path / "app.yaml"
    f.write_text(
        "apps:\n  - {name: digits, policy: exp4, slo_ms: 50, default_output: -1, models: [logreg]}\n"
        "models:\n  - {name: logreg, version: '1', path: models/logreg/1, replicas: 2}\n"
    )
    spec = load_app_file(f)
    assert spec.models[0]["path"] == str((tmp_path / "models/logreg/1").resolve())
    assert spec.apps[0]["models"] == ["logreg"] and spec.apps[0]["default_output"] == -1


@pytest.mark.parametrize(
    "text, reason",
    [
        ("apps:\n  - {name: a, models: [missing]}\n", "not under `models:`"),
        ("apps:\n  - {name: a, policy: bogus}\n", "policy must be"),
        ("models:\n  - {name: m, path: nowhere}\n", "model.yaml"),
        ("apps: [\n", "not valid YAML"),
        ("- 1\n", "expected `apps:`"),
    ],
)
def test_bad_app_files(tmp_path, text, reason):
    f = tmp_path / "app.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=reason):
        load_app_file(f)


def test_an_app_file_names_every_model_it_links_but_does_not_declare(tmp_path):
    _model_dir(tmp_path, "good")
    f = tmp_path / "app.yaml"
    f.write_text("apps:\n  - {name: t1, models: [good, ghost, other]}\n"
                 "models:\n  - {name: good, path: models/good/1}\n")
    with pytest.raises(ConfigError) as exc:
        load_app_file(f)
    assert "links models 'ghost', 'other', not under `models:`: add them there" in str(exc.value)
    assert "clipstream link t1 ghost; clipstream link t1 other" in str(exc.value) and "good" not in str(exc.value)


def test_a_record_of_the_wrong_type_is_a_decode_error_and_changes_nothing():
    state = RegistryState()
    state.apply("app:digits", _app())
    with pytest.raises(DecodeError, match="expected a App record, got a Link"):
        state.apply("app:digits", _link("digits", "a", 2))
    with pytest.raises(DecodeError, match="unknown registry key"):
        state.apply("thing:x", _app())
    assert state.view().apps["digits"].policy == "exp4"


def test_models_of_a_group_make_one_served_unit_whose_version_follows_theirs(tmp_path):
    state = RegistryState()
    path = str(_model_dir(tmp_path, "m"))
    for name, version, replicas in (("a", "1", 1), ("b", "2", 2), ("c", "1", 1)):
        state.apply(f"model:{name}", encode(Model(name=name, version=version, path=path, replicas=replicas,
                                                  latency_objective_ms=30.0 if name == "a" else None,
                                                  group=None if name == "c" else "g", updated_us=1)))
    view = state.view()
    g = view.groups["g"]
    assert [m.name for m in g.members] == ["a", "b"] and g.member_versions == {"a": "1", "b": "2"}
    assert (g.replicas, g.latency_objective_ms, g.max_batch_size) == (2, 30.0, None)
    assert g.spec is not None and g.spec.input.shape == (4,)
    assert sorted(view.served()) == ["c", "g"]  # a and b are served as g
    first = g.version
    state.apply("model:b", encode(Model(name="b", version="3", path=path, group="g", updated_us=2)))
    assert state.view().groups["g"].version != first  # a member's new version is a new group version
    state.apply("model:b", encode(Model(name="b", version="2", path=path, group="g", updated_us=3)))
    assert state.view().groups["g"].version == first  # rolled back: the same group version again


def test_an_app_file_groups_models_that_take_the_same_input(tmp_path):
    _model_dir(tmp_path, "a")
    other = _model_dir(tmp_path, "other")
    (other / "model.yaml").write_text(MODEL_YAML.replace("shape: [4]", "shape: [8]"))
    f = tmp_path / "app.yaml"
    models = ("models:\n  - {name: a, path: models/a/1, group: g}\n"
              "  - {name: b, path: models/a/1, group: g}\n")
    f.write_text(models)
    assert [m.get("group") for m in load_app_file(f).models] == ["g", "g"]
    f.write_text(models + "  - {name: c, path: models/other/1, group: g}\n")
    with pytest.raises(ConfigError, match="group 'g': model c takes .* must take the same input"):
        load_app_file(f)
    f.write_text(models + "  - {name: g, path: models/a/1}\n")
    with pytest.raises(ConfigError, match="group 'g' has the name of a model"):
        load_app_file(f)


@pytest.mark.parametrize("slo_ms", [0.0, -1.0, float("nan"), float("inf"), 1e12])
def test_the_writer_refuses_an_slo_no_query_could_keep(slo_ms: float) -> None:
    writer = object.__new__(RegistryWriter)  # the check comes before any Kafka work
    writer._put = lambda *a: pytest.fail("written")  # type: ignore[method-assign]
    with pytest.raises(ConfigError, match="slo_ms must be more than 0 and at most 3,600,000 ms"):
        writer.app("a", "exp4", slo_ms)


@pytest.mark.parametrize(("replicas", "knobs", "says"), [
    (100_000, {}, "replicas must be from 1 to 256"),
    (0, {}, "replicas must be from 1 to 256"),
    (1, {"max_batch_size": 0}, "max_batch_size must be at least 1"),
    (1, {"batch_delay_ms": -1.0}, "batch_delay_ms must be at least 0"),
    (1, {"latency_objective_ms": -5.0}, "latency_objective_ms must be more than 0"),
])
def test_the_writer_refuses_counts_and_times_past_their_bounds(replicas: int, knobs: dict, says: str) -> None:
    writer = object.__new__(RegistryWriter)
    writer._put = lambda *a: pytest.fail("written")  # type: ignore[method-assign]
    with pytest.raises(ConfigError, match=says):
        writer.model("m", "1", "/models/m/1", replicas, **knobs)
