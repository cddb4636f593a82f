"""A bad CLIPSTREAM_* value stops a stage at once with the setting's name, not a traceback."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from clipstream.cli import main


@pytest.mark.parametrize(("args", "env", "name"), [
    (["selector"], {"CLIPSTREAM_SELECTOR_REPLY_BUDGET_QUANTILE": "2"}, "reply_budget_quantile"),
    (["batcher", "--model", "m"], {"CLIPSTREAM_BATCHER_MAX_IN_FLIGHT": "many"}, "max_in_flight"),
    (["worker", "--model", "m"], {"CLIPSTREAM_WORKER_THREADS": "many"}, "threads"),
])
def test_bad_setting_is_named_and_exits_2(args: list[str], env: dict[str, str], name: str) -> None:
    result = CliRunner().invoke(main, args, env=env)
    assert result.exit_code == 2, result.output
    assert "error:" in result.output and name in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


@pytest.mark.parametrize(("env", "said"), [
    ({"CLIPSTREAM_GATEWAY_API_KEYS": "LEAKME-1", "CLIPSTREAM_GATEWAY_APP_KEYS": '{"LEAKME-2": ["digits"]}',
      "CLIPSTREAM_GATEWAY_TLS_CERT": "/tmp/cert.pem"}, "TLS_CERT and CLIPSTREAM_GATEWAY_TLS_KEY go together"),
    ({"CLIPSTREAM_GATEWAY_APP_KEYS": '{"LEAKME-3": "digits"}'}, "setting app_keys (its value not shown)"),
    ({"CLIPSTREAM_REDIS_URL": "redis://:LEAKME-4@127.0.0.1:x/0"}, "Port could not be cast to integer"),
])
def test_a_bad_setting_never_prints_a_secret(env: dict[str, str], said: str) -> None:
    """An API key is both a value and, in app_keys, the name of an entry; a check across
    several settings is given all of them: none of it is printed."""
    result = CliRunner().invoke(main, ["gateway"], env=env)
    assert result.exit_code == 2 and said in result.output, result.output
    assert "LEAKME" not in result.output, result.output


def test_a_kafka_setting_librdkafka_would_refuse_is_one_line_naming_the_choices() -> None:
    result = CliRunner().invoke(main, ["inspect"], env={"CLIPSTREAM_KAFKA_SECURITY_PROTOCOL": "bogus"})
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "kafka_security_protocol = 'bogus': Value error, 'bogus' is not one of PLAINTEXT, SSL, SASL_PLAINTEXT, " \
           "SASL_SSL" in result.output, result.output


def test_a_kafka_certificate_file_that_is_not_there_is_one_line_naming_it() -> None:
    """librdkafka's own refusal is a traceback naming no setting; a CA that ``infra up
    --secure`` made is gone once its broker stops, so the line says where the next one is."""
    result = CliRunner().invoke(main, ["inspect"], env={"CLIPSTREAM_KAFKA_SSL_CA_LOCATION": "/nonexist/ca.pem"})
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "kafka_ssl_ca_location = '/nonexist/ca.pem': Value error, no such file /nonexist/ca.pem (the CA of" \
        in result.output and "fix CLIPSTREAM_KAFKA_SSL_CA_LOCATION" in result.output, result.output
    key = CliRunner().invoke(main, ["inspect"], env={"CLIPSTREAM_KAFKA_SSL_KEY_LOCATION": "/nonexist/k.pem"})
    assert key.exit_code == 2 and "no such file /nonexist/k.pem;" in key.output, key.output


def test_a_redis_url_redis_py_would_refuse_is_one_line() -> None:
    result = CliRunner().invoke(main, ["inspect"], env={"CLIPSTREAM_REDIS_URL": "foo"})
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "redis_url = 'foo': Value error, a Redis URL starts redis://, rediss:// or unix://" in result.output


def test_a_bad_setting_names_its_variable_and_a_json_one_that_does_not_parse_too() -> None:
    bad = CliRunner().invoke(main, ["gateway"], env={"CLIPSTREAM_GATEWAY_APP_KEYS": '{"LEAKME-5": "digits"}'})
    assert bad.exit_code == 2 and "fix CLIPSTREAM_GATEWAY_APP_KEYS" in bad.output and "LEAKME" not in bad.output, \
        bad.output
    unparsed = CliRunner().invoke(main, ["gateway"], env={"CLIPSTREAM_GATEWAY_APP_KEYS": '{"LEAKME-6": ["a"'})
    assert unparsed.exit_code == 2 and "LEAKME" not in unparsed.output, unparsed.output
    assert "error: CLIPSTREAM_GATEWAY_APP_KEYS could not be read: a list or a mapping is written as JSON" \
        in unparsed.output, unparsed.output
    worker = CliRunner().invoke(main, ["worker", "--model", "m"], env={"CLIPSTREAM_WORKER_THREADS": "many"})
    assert "fix CLIPSTREAM_WORKER_THREADS" in worker.output, worker.output

