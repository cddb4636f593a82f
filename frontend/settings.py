"""The REST gateway's own knobs, read from ``CLIPSTREAM_GATEWAY_*`` variables.

Kafka and Redis addresses stay in ``clipstream.settings.Settings``; only what is particular to
the gateway lives here, so a worker never parses gateway options.
"""

from __future__ import annotations

import secrets
from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


def _random_instance() -> str:
    # a fresh reply topic per process unless the operator pins one (restarts then reuse it)
    return secrets.token_hex(6)


class GatewaySettings(BaseSettings):
    """Where the gateway listens, what it admits, and how long it waits past an SLO."""

    model_config = SettingsConfigDict(env_prefix="CLIPSTREAM_GATEWAY_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 8080
    # comma-separated in the environment; empty = no authentication
    api_keys: Annotated[tuple[str, ...], NoDecode] = ()
    max_body_bytes: int = Field(1 << 20, gt=0)
    # predict requests waiting for a reply at once; beyond this: 503 + Retry-After
    max_inflight: int = Field(4096, gt=0)
    # learn the limit below max_inflight from how the pipeline keeps up (frontend/admission.py):
    # under overload the excess gets a quick 503 instead of a default after the SLO
    adaptive_admission: bool = True
    admission_initial: int = Field(16, gt=0)
    admission_floor: int = Field(4, gt=0)
    # an answer in time with every model's prediction but slower than this share of the SLO
    # counts towards a cut (queueing); a straggler cutoff's answer never does (docs/design/0015)
    admission_slow_fraction: float = Field(0.6, gt=0)
    # how long past the deadline a reply may still be taken: the selector answers 3-10 ms before
    # it (its reply budget), so this only covers a reply hop that runs long (docs/design/0006)
    reply_margin_ms: float = Field(5.0, ge=0)
    # two wake-ups in a row this much later than asked cut the admission limit (while it is in
    # use); three in a row refuse new predictions (503) until the loop catches up. Kept small, so the gateway
    # sheds load before a saturated machine makes callers wait past their SLO (docs/design/0008)
    max_loop_lag_ms: float = Field(5.0, gt=0)
    instance: str = Field(default_factory=_random_instance)
    retry_after_s: int = Field(1, ge=0)
    # how long /feedback waits for the broker's acknowledgement before answering 503
    feedback_ack_timeout_s: float = Field(5.0, gt=0)
    log_level: str = "warning"
    # libuv's event loop when installed (false: asyncio's own); see frontend.gateway_cli
    uvloop: bool = True

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(k.strip() for k in value.split(",") if k.strip())
        return value


def get_gateway_settings(**overrides: object) -> GatewaySettings:
    """Fresh gateway settings from the environment, with explicit overrides on top."""
    return GatewaySettings(**overrides)  # type: ignore[arg-type]
