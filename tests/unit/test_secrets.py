"""Secrets stay secret: the Redis password (in the URL or beside it), the Kafka SASL password
and the gateway's API keys never show in a repr or a printed URL, yet reach the clients."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from clipstream.redisclient import client_options
from clipstream.settings import Settings, redacted_url, split_url_password
from frontend.settings import GatewaySettings
from topics.client import common_config


def test_a_password_in_the_redis_url_is_moved_out_of_it() -> None:
    s = Settings(redis_url="redis://:hunter2@10.0.0.5:6380/1", kafka_sasl_password="s3cret",
                 kafka_sasl_username="svc", kafka_sasl_mechanism="SCRAM-SHA-512")
    assert s.redis_url == "redis://10.0.0.5:6380/1"
    assert "hunter2" not in repr(s) and "s3cret" not in repr(s) and "hunter2" not in str(s.model_dump())
    assert client_options(s)["password"] == "hunter2"
    assert common_config(s)["sasl.password"] == "s3cret"
    assert s.secret_env() == {"CLIPSTREAM_REDIS_PASSWORD": "hunter2", "CLIPSTREAM_KAFKA_SASL_PASSWORD": "s3cret"}
    assert redacted_url(s.redis_url, s.redis_password) == "redis://:***@10.0.0.5:6380/1"


def test_redaction_of_urls() -> None:
    assert redacted_url("redis://user:pw@host:1/0") == "redis://user:***@host:1/0"
    assert redacted_url("redis://host:1/0") == "redis://host:1/0"
    assert split_url_password("redis://u:p@[::1]:6379/2") == ("redis://u@[::1]:6379/2", "p")
    assert split_url_password("unix:///tmp/redis.sock") == ("unix:///tmp/redis.sock", None)
    # redis-py's own ?password= is a password too: moved out, and never printed
    s = Settings(redis_url="redis://127.0.0.1:6379/0?password=s3cretQ&health_check_interval=2")
    assert s.redis_url == "redis://127.0.0.1:6379/0?health_check_interval=2"
    assert client_options(s)["password"] == "s3cretQ" and "s3cretQ" not in redacted_url(s.redis_url, s.redis_password)
    assert "s3cretQ" not in redacted_url("unix:///tmp/r.sock?password=s3cretQ")
    assert split_url_password("unix:///tmp/r.sock?password=x&db=2") == ("unix:///tmp/r.sock?db=2", "x")


def test_the_redis_password_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLIPSTREAM_REDIS_PASSWORD", "from-env")
    s = Settings()
    assert client_options(s)["password"] == "from-env" and "from-env" not in repr(s)
    assert "password" not in client_options(Settings(redis_password=None))


def _self_signed(folder: Path, name: str = "") -> tuple[Path, Path]:
    cert, key = folder / f"cert{name}.pem", folder / f"key{name}.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_gateway_keys_are_not_in_its_repr_and_tls_comes_in_pairs_that_load(tmp_path: Path) -> None:
    gw = GatewaySettings(api_keys="k-global", app_keys={"k-app": ["a"]})  # type: ignore[arg-type]
    assert "k-global" not in repr(gw) and "k-app" not in repr(gw) and gw.scheme == "http"
    cert, key = _self_signed(tmp_path)
    assert GatewaySettings(tls_cert=cert, tls_key=key).scheme == "https"
    with pytest.raises(ValueError, match="go together"):
        GatewaySettings(tls_cert=cert)
    with pytest.raises(ValueError, match="no such file"):
        GatewaySettings(tls_cert=cert, tls_key=tmp_path / "missing.pem")
    # swapped, or a key of another certificate: refused before the server starts, naming both
    with pytest.raises(ValueError, match="TLS_CERT .* and CLIPSTREAM_GATEWAY_TLS_KEY .* are not a PEM"):
        GatewaySettings(tls_cert=key, tls_key=cert)
    _, other = _self_signed(tmp_path, "2")
    with pytest.raises(ValueError, match="the key is the certificate's"):
        GatewaySettings(tls_cert=cert, tls_key=other)


@pytest.mark.parametrize("keys", [",", " ", " , ,"])
def test_a_key_list_with_no_key_in_it_is_refused_not_taken_as_no_keys(monkeypatch: pytest.MonkeyPatch, keys: str) -> None:
    """A secret that went missing on its way into the variable must not leave the gateway open."""
    monkeypatch.setenv("CLIPSTREAM_GATEWAY_API_KEYS", keys)
    with pytest.raises(ValueError, match="CLIPSTREAM_GATEWAY_API_KEYS holds no key .* unset it to serve without keys"):
        GatewaySettings()
    monkeypatch.setenv("CLIPSTREAM_GATEWAY_API_KEYS", "")  # empty: as unset, no keys
    assert GatewaySettings().api_keys == ()
    monkeypatch.setenv("CLIPSTREAM_GATEWAY_API_KEYS", " a , b ")
    assert GatewaySettings().api_keys == ("a", "b")
    monkeypatch.delenv("CLIPSTREAM_GATEWAY_API_KEYS")
    with pytest.raises(ValueError, match="APP_KEYS has an empty key"):
        GatewaySettings(app_keys={" ": ["a"]})  # type: ignore[dict-item]


def test_a_scram_password_is_given_to_the_storage_tool_in_a_file_only_the_owner_reads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Not on its command line, which any local user's `ps` shows while it runs."""
    import os
    import stat
    import subprocess

    from clipstream.infra import kafka

    files = kafka.BrokerFiles.under(tmp_path)
    files.config.parent.mkdir(parents=True, exist_ok=True)
    calls: list[tuple[list[str], int, str]] = []  # argv, the argument file's mode and text

    def run(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        argfile = Path(argv[-1].removeprefix("@"))
        calls.append((argv, stat.S_IMODE(os.stat(argfile).st_mode), argfile.read_text()))
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(kafka.subprocess, "run", run)
    assert kafka.format_storage("java", tmp_path, files, scram=["SCRAM-SHA-512=[name=u,password=Pw-9_x]"])
    ((argv, mode, text),) = calls
    assert not any("Pw-9_x" in a for a in argv) and argv[-1].startswith("@") and mode == 0o600
    assert '"kafka.tools.StorageTool"' in text and '"--add-scram"\n"SCRAM-SHA-512=[name=u,password=Pw-9_x]"' in text
    assert not Path(argv[-1].removeprefix("@")).exists()  # removed once the tool is done
