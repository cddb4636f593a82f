"""Connection settings shared by every stage, read from ``CLIPSTREAM_*`` variables.

Each stage keeps its own tuning knobs in its own small settings class (for example
``batchers.settings.BatcherSettings``) so that no module has to know every option.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "clipstream"


def _default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "clipstream"


MAX_RECORD_BYTES = 64 * 1024 * 1024  # the highest CLIPSTREAM_MAX_RECORD_BYTES


class Settings(BaseSettings):
    """Where Kafka and Redis are, and how to talk to them."""

    model_config = SettingsConfigDict(env_prefix="CLIPSTREAM_", extra="ignore")

    kafka_bootstrap: str = "127.0.0.1:9092"
    # a password in the URL (redis://:secret@host:6379/0) is moved to ``redis_password`` at
    # load, so the URL itself may be logged and printed
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_password: SecretStr | None = None
    topic_prefix: str = "clipstream."
    # partitions of the queries/predictions/feedback topics: the selector's parallelism
    selector_partitions: int = Field(4, ge=1)  # the queries, predictions, responses and feedback topics
    # copies of each topic clipstream creates; unset: min(3, the brokers the cluster lists),
    # so one local broker gets 1 and a cluster 3 (with min.insync.replicas 2)
    replication_factor: int | None = Field(default=None, ge=1)

    # passed through to every Kafka client (librdkafka names) when set
    kafka_security_protocol: str | None = None
    kafka_sasl_mechanism: str | None = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_ssl_ca_location: str | None = None
    kafka_ssl_certificate_location: str | None = None
    kafka_ssl_key_location: str | None = None
    # an asyncio stage's event loop polls its consumers itself, woken by librdkafka through a
    # pipe, instead of a thread per consumer (topics.wakeup); false: the thread
    kafka_loop_wakeup: bool = True
    # how often every Kafka client refreshes its topics' leaders (librdkafka's
    # ``topic.metadata.refresh.interval.ms``); unset: 500 ms when the bootstrap list names
    # several brokers, so that a failover reaches the clients sooner, else librdkafka's default
    # (docs/design/0081)
    kafka_metadata_refresh_ms: int | None = Field(default=None, gt=0)

    # local infrastructure (clipstream infra up)
    cache_dir: Path = _default_cache_dir()
    state_dir: Path = _default_state_dir()
    kafka_version: str = "3.9.1"
    kafka_port: int = 9092
    redis_port: int = 6379

    # the largest record a stage writes, a batch of inputs or of predictions: the topics
    # clipstream makes take it, a batch is cut to fit it, and an input that cannot fit even
    # alone is refused where it enters (topics.sizes, docs/design/0106)
    max_record_bytes: int = Field(8 * 1024 * 1024, ge=64 * 1024, le=MAX_RECORD_BYTES)

    # prediction cache and stored predictions (Redis TTLs, seconds)
    cache_ttl_s: int = 3600
    stored_predictions_ttl_s: int = 3600
    # socket timeout of every Redis command and connect: a frozen Redis costs a stage this
    # once, then it serves without Redis until a probe finds it back (clipstream.redisclient)
    redis_timeout_ms: float = Field(100.0, gt=0)

    # the model repository on this host: a folder or an fsspec URL (s3://bucket/models). The
    # registry names a model inside it by a relative location (logreg/1), which each host
    # resolves against its own root; unset: the registry holds absolute local paths
    # (registry/repository.py, docs/design/0019)
    model_repository: str | None = None


    @field_validator("redis_url")
    @classmethod
    def _a_redis_url(cls, value: str) -> str:
        """A URL redis-py takes, refused here rather than as a traceback from the first client."""
        if not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("a Redis URL starts redis://, rediss:// or unix:// (redis://HOST:6379/0)")
        return value

    @field_validator("kafka_security_protocol", "kafka_sasl_mechanism")
    @classmethod
    def _one_kafka_knows(cls, value: str | None, info: Any) -> str | None:
        """A value librdkafka would refuse, refused here with the ones it takes, not as a
        traceback from the first client."""
        known = KAFKA_CHOICES[info.field_name]
        if value is not None and value.upper() not in known:
            raise ValueError(f"{value!r} is not one of {', '.join(known)}")
        return value

    @field_validator("kafka_ssl_ca_location", "kafka_ssl_certificate_location", "kafka_ssl_key_location")
    @classmethod
    def _a_file(cls, value: str | None, info: Any) -> str | None:
        """A PEM file librdkafka will read, refused here by name rather than as its traceback."""
        if value is not None and not Path(value).is_file():
            hint = (" (the CA of a broker that `clipstream infra up --secure` started goes when it stops: use "
                    "the export line its next start prints)") if info.field_name == "kafka_ssl_ca_location" else ""
            raise ValueError(f"no such file {value}{hint}")
        return value

    @model_validator(mode="after")
    def _password_out_of_the_url(self) -> "Settings":
        url, password = split_url_password(self.redis_url)
        if password is not None:
            self.redis_url = url
            if self.redis_password is None:
                self.redis_password = SecretStr(password)
        return self

    def secret_env(self) -> dict[str, str]:
        """The secrets as ``CLIPSTREAM_*`` variables, for a child process to inherit."""
        env = {}
        if self.redis_password is not None:
            env["CLIPSTREAM_REDIS_PASSWORD"] = self.redis_password.get_secret_value()
        if self.kafka_sasl_password is not None:
            env["CLIPSTREAM_KAFKA_SASL_PASSWORD"] = self.kafka_sasl_password.get_secret_value()
        return env


def split_url_password(url: str) -> tuple[str, str | None]:
    """``url`` without its password, and the password (None when it has none): the one before
    the host, or redis-py's ``?password=``."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url, None
    query = parse_qsl(parts.query, keep_blank_values=True)
    in_query = [v for k, v in query if k == "password"]
    if password is None and not in_query:
        return url, None
    port = parts.port  # not a number: a ValueError, which the settings' check reports without the URL
    user = parts.username or ""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = (f"{user}@" if user else "") + host + (f":{port}" if port else "")
    rest = urlencode([(k, v) for k, v in query if k != "password"])
    out = urlunsplit((parts.scheme, netloc, parts.path, rest, parts.fragment))
    if not netloc and url.startswith(f"{parts.scheme}://"):  # unix:///path keeps its form
        out = f"{parts.scheme}://" + out[len(parts.scheme) + 1:]
    return out, password or in_query[-1]


def redacted_url(url: str, password: SecretStr | str | None = None) -> str:
    """``url`` as it may be printed: a password, in it or beside it, shows as ``***``."""
    url, inline = split_url_password(url)
    if inline is None and not password:
        return url
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, f"{parts.username or ''}:***@{host}", parts.path, parts.query, parts.fragment))


def get_settings(**overrides: object) -> Settings:
    """Fresh settings from the environment, with explicit overrides on top."""
    return Settings(**overrides)  # type: ignore[arg-type]


T = TypeVar("T")


KAFKA_CHOICES = {"kafka_security_protocol": ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"),
                 "kafka_sasl_mechanism": ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "OAUTHBEARER")}
SECRET_WORDS = ("key", "password", "secret", "token")  # a setting named so is never printed, nor what is under it


def _shown_setting(title: str, loc: tuple[Any, ...], value: Any) -> str:
    """A bad setting as an error names it: its name and value, but neither for a secret (an
    API key is also the name of its entry in ``app_keys``), a Redis URL with its password
    hidden, and only the settings' name for a check across several (its value holds them all)."""
    if not loc:
        return title
    name = str(loc[0])
    if any(word in name for word in SECRET_WORDS):
        return f"{name} (its value not shown)"
    if name == "redis_url" and isinstance(value, str):
        return f"{name} = {redacted_url(value)!r}"
    return f"{'.'.join(str(part) for part in loc)} = {value!r}"


def settings_or_exit(make: Callable[[], T], env_prefix: str | None = None) -> T:
    """``make()`` for a stage's command: a bad ``CLIPSTREAM_*`` value (pydantic names it in a
    ValueError) ends the process with that message and exit code 2, not a traceback. The
    variable is named by its settings' ``env_prefix`` (``make``'s, when it is the class)."""
    config = getattr(make, "model_config", None) if isinstance(make, type) else None
    prefix = env_prefix or (config.get("env_prefix") if config else None)  # to name the variable
    try:
        return make()
    except ValidationError as exc:  # one line per bad value, not pydantic's four
        prefix = prefix or ("CLIPSTREAM_" if exc.title == "Settings" else None)
        for err in exc.errors():
            loc = err["loc"]
            var = f"{prefix}{str(loc[0]).upper()}" if prefix and loc else "the CLIPSTREAM_* variable that sets it"
            print(f"error: setting {_shown_setting(exc.title, loc, err.get('input'))}: {err['msg']}; fix {var}",
                  file=sys.stderr, flush=True)
        sys.exit(2)
    except ValueError as exc:  # pydantic-settings could not parse a variable (JSON) before any check
        field = re.search(r'field "(\w+)"', str(exc))
        if prefix and field:
            print(f"error: {prefix}{field.group(1).upper()} could not be read: a list or a mapping is written as JSON "
                  "(its value not shown)", file=sys.stderr, flush=True)
        else:
            print(f"error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
