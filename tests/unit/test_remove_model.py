"""`clipstream remove-model`: a model an app links is refused unless --unlink is given; with it,
the links go before the model, and the model's cached predictions, of every version, go too."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from redis.exceptions import ConnectionError as RedisConnectionError

import frontend.cli as registry_cli
from clipstream.cachekey import forget_model, key_of
from clipstream.cli import main
from registry.topic import AppConfig, ModelConfig, RegistryView
from tests.unit.test_cli_input_errors import NoKafka, _one_line_error


class Keys:
    """The two Redis calls ``forget_model`` makes, over a set of key names."""

    def __init__(self, *keys: str) -> None:
        self.keys = set(keys)
        self.unlinks: list[int] = []

    def scan_iter(self, match: str, count: int) -> Iterator[str]:
        yield from sorted(k for k in self.keys if fnmatch.fnmatchcase(k, match))

    def unlink(self, *names: bytes | str) -> int:
        self.unlinks.append(len(names))
        gone = self.keys & {str(n) for n in names}
        self.keys -= gone
        return len(gone)


def _view(*links: tuple[str, tuple[str, ...]]) -> RegistryView:
    models = {n: ModelConfig(name=n, version="1", path=Path(f"/m/{n}/1"), location=f"/m/{n}/1")
              for n in ("m", "other")}
    apps = {a: AppConfig(name=a, policy="exp4", slo_ms=50.0, default_output=None, models=ms) for a, ms in links}
    return RegistryView(apps=apps, models=models)


def test_forget_model_deletes_every_version_of_that_model_only_in_chunks() -> None:
    mine = [key_of("m", v, f"{i:040x}") for v in ("1", "2", None) for i in range(5)]
    others = [key_of("m2", "1", "0" * 40), key_of("other", "1", "0" * 40), "cs:pred:q1"]
    keys = Keys(*mine, *others)
    assert forget_model(keys, "m", chunk=4) == 15
    assert keys.keys == set(others)
    assert keys.unlinks == [4, 4, 4, 3]


def test_a_linked_model_is_refused_without_unlink_and_nothing_is_written(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = NoKafka(_view(("b", ("m", "other")), ("a", ("m",)))).install(monkeypatch)
    result = CliRunner().invoke(main, ["remove-model", "m"])
    _one_line_error(result, 1, "model m is linked to a, b: unlink it first (clipstream link a m --unlink), "
                               "or give --unlink")
    assert fake.writes == []


def test_an_unknown_model_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = NoKafka(_view()).install(monkeypatch)
    _one_line_error(CliRunner().invoke(main, ["remove-model", "ghost"]), 1, "no model 'ghost' in the registry")
    assert fake.writes == []


def test_unlink_removes_the_links_first_then_the_model_and_its_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = NoKafka(_view(("b", ("m", "other")), ("a", ("m",)))).install(monkeypatch)
    keys = Keys(key_of("m", "1", "a" * 40), key_of("other", "1", "a" * 40))
    monkeypatch.setattr(registry_cli, "sync_client", lambda settings: keys)
    result = CliRunner().invoke(main, ["remove-model", "m", "--unlink"])
    assert result.exit_code == 0, result.output
    assert fake.writes == [("delete", ("link:a:m",)), ("delete", ("link:b:m",)), ("delete", ("model:m",))]
    assert "unlinked m from a (no model left: a's queries get its default output until one is linked)" in result.output
    assert "unlinked m from b\n" in result.output
    assert "model m removed" in result.output and "1 cached predictions of m deleted" in result.output
    assert keys.keys == {key_of("other", "1", "a" * 40)}


def test_a_redis_away_leaves_the_removal_done_and_names_the_keys_to_delete(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = NoKafka(_view()).install(monkeypatch)

    class Away(Keys):
        def scan_iter(self, match: str, count: int) -> Iterator[str]:
            raise RedisConnectionError("Connection refused")

    monkeypatch.setattr(registry_cli, "sync_client", lambda settings: Away())
    result = CliRunner().invoke(main, ["remove-model", "m"])
    assert result.exit_code == 0, result.output
    assert fake.writes == [("delete", ("model:m",))]
    assert "warning: Redis at CLIPSTREAM_REDIS_URL did not answer (Connection refused), so m's cached " \
           "predictions may stay (delete the keys cs:cache:m:* before deploying m again), and the apps may " \
           "keep their learnt weights for m" in result.output
