"""selector.kafka.Apps: one answer per registry view, rebuilt when the view changes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from clipstream.errors import ConfigError
from clipstream.testing.models import make_profile_model
from registry.spec import load_spec
from registry.topic import AppConfig, ModelConfig, RegistryView
from selector.kafka import Apps


def view_with(tmp_path: Path, policy: str = "single", policy_config: dict[str, float] | None = None) -> RegistryView:
    folder = make_profile_model(tmp_path, "logreg")  # a model.yaml with class scores, nothing to train
    model = ModelConfig(name="logreg", version="1", path=folder, spec=load_spec(folder))
    app = AppConfig(name="digits", policy=policy, slo_ms=50, default_output=-1,
                    policy_config=policy_config or {}, models=("logreg",))
    return RegistryView(apps={"digits": app}, models={"logreg": model})


def test_the_same_view_gives_the_same_answer_without_recomputing(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    view = view_with(tmp_path)
    apps = Apps(lambda: view)
    first = apps.get("digits")
    calls = []
    monkeypatch.setattr("selector.kafka.app_outputs", lambda *a: calls.append(a))
    assert apps.get("digits") is first
    assert calls == []  # the app's outputs were not recomputed for the same view


def test_a_new_view_with_the_same_config_keeps_the_policy(tmp_path: Path) -> None:
    views = [view_with(tmp_path)]
    apps = Apps(lambda: views[-1])
    _, policy, _ = apps.get("digits")
    views.append(RegistryView(apps=dict(views[0].apps), models=dict(views[0].models)))
    _, again, outputs = apps.get("digits")
    assert again is policy
    assert outputs.kind == "class_scores"


def test_a_new_view_with_another_config_rebuilds_the_policy(tmp_path: Path) -> None:
    views = [view_with(tmp_path, "exp3", {"eta": 0.1})]
    apps = Apps(lambda: views[-1])
    _, policy, _ = apps.get("digits")
    changed = replace(views[0].apps["digits"], policy_config={"eta": 0.5})
    views.append(RegistryView(apps={"digits": changed}, models=dict(views[0].models)))
    app, rebuilt, _ = apps.get("digits")
    assert rebuilt is not policy
    assert app.policy_config == {"eta": 0.5}


def test_an_app_that_goes_away_is_unknown_in_the_next_view(tmp_path: Path) -> None:
    views = [view_with(tmp_path)]
    apps = Apps(lambda: views[-1])
    apps.get("digits")
    views.append(RegistryView(apps={}, models=dict(views[0].models)))
    with pytest.raises(ConfigError, match="unknown app"):
        apps.get("digits")


def test_versions_follow_the_registry_view(tmp_path: Path) -> None:
    views = [view_with(tmp_path)]
    apps = Apps(lambda: views[-1])
    assert apps.versions("digits") == {"logreg": "1"}
    assert apps.versions("digits") is apps.versions("digits")  # worked out once per view
    model = replace(views[0].models["logreg"], version="2")
    views.append(replace(views[0], models={"logreg": model}))
    assert apps.versions("digits") == {"logreg": "2"}
    assert apps.versions("nope") == {}
