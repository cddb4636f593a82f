"""Folding registry records into a view, and app files (no broker)."""

from __future__ import annotations

from pathlib import Path

import pytest

from clipstream.errors import ConfigError, DecodeError
from registry.appfile import load_app_file
from registry.topic import RegistryState
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


def test_a_record_of_the_wrong_type_is_a_decode_error_and_changes_nothing():
    state = RegistryState()
    state.apply("app:digits", _app())
    with pytest.raises(DecodeError, match="expected a App record, got a Link"):
        state.apply("app:digits", _link("digits", "a", 2))
    with pytest.raises(DecodeError, match="unknown registry key"):
        state.apply("thing:x", _app())
    assert state.view().apps["digits"].policy == "exp4"
