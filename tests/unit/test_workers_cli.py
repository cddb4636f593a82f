"""``clipstream worker`` argument handling and registry look-up, with a fake registry."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner

from clipstream.errors import ConfigError
from clipstream.settings import Settings
from clipstream.testing.models import make_profile_model
from workers import cli


@dataclass
class FakeModelConfig:
    path: Path
    version: str
    replicas: int = 3
    previous_versions: tuple[str, ...] = ()
    previous_paths: tuple[str, ...] = ()
    location: str = ""


@dataclass
class FakeView:
    models: dict[str, FakeModelConfig] = field(default_factory=dict)


def fake_registry(monkeypatch: pytest.MonkeyPatch, models: dict[str, FakeModelConfig]) -> list[str]:
    calls: list[str] = []

    class RegistryFollower:
        def __init__(self, settings: object) -> None:
            calls.append("init")

        def start(self) -> "RegistryFollower":
            calls.append("start")
            return self

        def wait_ready(self, timeout_s: float) -> FakeView:
            return FakeView(models)

        def view(self) -> FakeView:
            return FakeView(models)

        def stop(self) -> None:
            calls.append("stop")

    monkeypatch.setattr(cli, "RegistryFollower", RegistryFollower)
    return calls


def resolve(settings: Settings, name: str, version: str | None, timeout_s: float) -> tuple[Path, str | None, int]:
    """(folder, version, replicas) of a model, as the ``worker`` command looks it up."""
    return cli.model_folder(settings, name, cli.registered(settings, name, timeout_s), version)  # type: ignore[arg-type]


def test_registry_lookup_current_previous_and_sibling(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    v2 = make_profile_model(tmp_path, "sim", "2")
    v1 = make_profile_model(tmp_path / "old", "sim", "1")
    v3 = make_profile_model(tmp_path, "sim", "3")
    calls = fake_registry(monkeypatch, {"sim": FakeModelConfig(v2, "2", 3, ("1",), (str(v1),), str(v2))})
    settings = Settings(model_repository=None)
    assert resolve(settings, "sim", None, 1) == (v2, "2", 3)
    assert resolve(settings, "sim", "1", 1) == (v1, "1", 3)
    assert resolve(settings, "sim", "3", 1) == (v3, "3", 3)
    with pytest.raises(ConfigError, match="version 9"):
        resolve(settings, "sim", "9", 1)
    with pytest.raises(ConfigError, match="not in the registry"):
        resolve(settings, "nope", None, 0.2)
    assert calls.count("start") == calls.count("stop") == 5  # the follower is always stopped


def test_registry_location_resolves_against_this_hosts_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    here = tmp_path / "mounted-here"
    v2, v3 = make_profile_model(here, "sim", "2"), make_profile_model(here, "sim", "3")
    fake_registry(monkeypatch, {"sim": FakeModelConfig(Path("elsewhere"), "2", 1, location="sim/2")})
    settings = Settings(model_repository=str(here))
    assert resolve(settings, "sim", None, 1) == (v2, "2", 1)
    assert resolve(settings, "sim", "3", 1) == (v3, "3", 1)  # a sibling version
    with pytest.raises(ConfigError, match="CLIPSTREAM_MODEL_REPOSITORY is not set"):
        resolve(Settings(model_repository=None), "sim", None, 1)


def test_cli_reports_a_bad_model_folder_and_exits_1(tmp_path: Path) -> None:
    (tmp_path / "model.yaml").write_text("backend: tensorflow\n")
    result = CliRunner().invoke(cli.worker, ["--model", "m", "--path", str(tmp_path)])
    assert result.exit_code == 1
    assert "backend must be one of" in result.output


def test_cli_help_names_the_options() -> None:
    result = CliRunner().invoke(cli.worker, ["--help"])
    assert result.exit_code == 0
    for option in ("--model", "--version", "--replica", "--replicas", "--path"):
        assert option in result.output
