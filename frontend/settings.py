"""The REST gateway's own knobs, read from ``CLIPSTREAM_GATEWAY_*`` variables.

Kafka and Redis addresses stay in ``clipstream.settings.Settings``; only what is particular to
the gateway lives here, so a worker never parses gateway options.
"""

from __future__ import annotations

import secrets
import ssl
from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


def _random_instance() -> str:
    # a fresh reply topic per process unless the operator pins one (restarts then reuse it)
    return secrets.token_hex(6)


class GatewaySettings(BaseSettings):
    """Where the gateway listens, what it admits, and how long it waits past an SLO."""

    model_config = SettingsConfigDict(env_prefix="CLIPSTREAM_GATEWAY_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 8080
    # the Open Inference Protocol over gRPC on this port too (0 = any free one); unset = none
    grpc_port: int | None = Field(None, ge=0, le=65535)
    # comma-separated in the environment; empty (and no app_keys) = no authentication
    api_keys: Annotated[tuple[str, ...], NoDecode] = Field((), repr=False)
    # keys that reach only some apps' routes: JSON in the environment, {"key": ["app", ...]}
    app_keys: dict[str, tuple[str, ...]] = Field(default_factory=dict, repr=False)
    max_body_bytes: int = Field(1 << 20, gt=0)
    # a request body must arrive within this many seconds of its headers, else 408: a caller
    # trickling its body holds no admission slot, and not a connection for long either
    body_timeout_s: float = Field(10.0, gt=0)
    # a request's line and headers: at most this many bytes (else 431), arriving within this many
    # seconds of their first byte (else 408). nginx allows 32 KiB; an API key takes well under 1
    max_head_bytes: int = Field(32 * 1024, gt=0)
    head_timeout_s: float = Field(10.0, gt=0)
    # serve HTTPS with this certificate chain and key (PEM files); both or neither
    tls_cert: Path | None = None
    tls_key: Path | None = None
    # predict requests waiting for a reply at once; beyond this: 503 + Retry-After
    max_inflight: int = Field(4096, gt=0)
    # learn the limit below max_inflight from how the pipeline keeps up (frontend/admission.py):
    # under overload the excess gets a quick 503 instead of a default after the SLO
    adaptive_admission: bool = True
    admission_initial: int = Field(16, gt=0)
    admission_floor: int = Field(4, gt=0)
    # an answer in time with every model's prediction but slower than this share of the SLO
    # counts towards a cut (queueing); a straggler cutoff's answer never does (docs/design/0015,
    # 0074: at 0.6 the gateway refused callers whose answers came well within the SLO)
    admission_slow_fraction: float = Field(0.8, gt=0)
    # at the limit, a predict request waits this share of its app's SLO for a slot before its
    # 503: a pause of the pipeline fills the limit for a moment (docs/design/0089); 0: at once
    admission_queue_share: float = Field(0.5, ge=0, lt=1)
    # how long past the deadline a reply may still be taken: the selector answers 3-40 ms before
    # it (its reply budget), so this only covers a reply hop that runs long (docs/design/0006, 0068)
    reply_margin_ms: float = Field(5.0, ge=0)
    # two wake-ups in a row this much later than asked cut the admission limit (while it is in
    # use); three in a row refuse new predictions (503) until the loop catches up. Kept small, so the gateway
    # sheds load before a saturated machine makes callers wait past their SLO (docs/design/0008)
    max_loop_lag_ms: float = Field(5.0, gt=0)
    # an app tolerates a loop this share of its SLO late, never less than max_loop_lag_ms: 5 ms
    # was set for a 50 ms SLO, and a 150 ms SLO has room for three times that (docs/design/0075)
    loop_lag_slo_share: float = Field(0.1, ge=0)
    # a ``single`` app's query goes to its model straight and the prediction comes back here,
    # not through the selector (docs/design/0083); false: every query through the selector
    direct: bool = True
    instance: str = Field(default_factory=_random_instance)
    retry_after_s: int = Field(1, ge=0)
    # how long /feedback waits for the broker's acknowledgement before answering 503
    feedback_ack_timeout_s: float = Field(5.0, gt=0)
    # the query ids answered lately that /feedback knows are being stored (a few seconds' worth)
    answered_memory: int = Field(65_536, ge=0)
    log_level: str = "warning"
    # libuv's event loop when installed (false: asyncio's own); see frontend.gateway_cli
    uvloop: bool = True

    @model_validator(mode="after")
    def _tls_pair(self) -> "GatewaySettings":
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("CLIPSTREAM_GATEWAY_TLS_CERT and CLIPSTREAM_GATEWAY_TLS_KEY go together: set both or neither")
        for name, path in (("TLS_CERT", self.tls_cert), ("TLS_KEY", self.tls_key)):
            if path is not None and not path.is_file():
                raise ValueError(f"CLIPSTREAM_GATEWAY_{name}: no such file {path}")
        if self.tls_cert is not None and self.tls_key is not None:
            _check_pair(self.tls_cert, self.tls_key)
        return self

    @property
    def scheme(self) -> str:
        return "https" if self.tls_cert is not None else "http"

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        if isinstance(value, str):
            keys = tuple(k.strip() for k in value.split(",") if k.strip())
            if value and not keys:  # a key list that lost its keys must not leave the gateway open
                raise ValueError("CLIPSTREAM_GATEWAY_API_KEYS holds no key (only commas or spaces): set the keys, "
                                 "comma-separated, or unset it to serve without keys")
            return keys
        return value

    @field_validator("app_keys")
    @classmethod
    def _no_blank_key(cls, value: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        if any(not key.strip() for key in value):
            raise ValueError("CLIPSTREAM_GATEWAY_APP_KEYS has an empty key: each key must be a secret of its own")
        return value


def _check_pair(cert: Path, key: Path) -> None:
    """Load the certificate chain and key as the server will, so a swapped, mismatched or
    encrypted pair is refused before any stage starts, naming both variables."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key, password=lambda: b"")  # never a prompt: an encrypted key fails
    except ssl.SSLError as exc:
        raise ValueError(f"CLIPSTREAM_GATEWAY_TLS_CERT ({cert}) and CLIPSTREAM_GATEWAY_TLS_KEY ({key}) are not a "
                         f"PEM certificate chain and its unencrypted private key ({exc.reason or exc}): check "
                         "that each names the right file, and that the key is the certificate's") from None


def get_gateway_settings(**overrides: object) -> GatewaySettings:
    """Fresh gateway settings from the environment, with explicit overrides on top."""
    return GatewaySettings(**overrides)  # type: ignore[arg-type]
