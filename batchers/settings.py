"""The batcher's own knobs, read from ``CLIPSTREAM_BATCHER_*`` variables.

Command-line options and the model's registry entry override these; they are the defaults
for a model that says nothing (Clipper's 20 ms objective, a 2 ms batch delay).
"""

from __future__ import annotations

from pydantic import model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from clipstream.errors import ConfigError
from registry.limits import KNOBS, check_knob


class BatcherSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CLIPSTREAM_BATCHER_", extra="ignore")

    latency_objective_ms: float = 20.0
    max_batch_size: int = 256  # AIMD's cap
    batch_delay_ms: float = 2.0  # delayed batching; 0 disables it
    aimd_step: int = 1
    aimd_start: int = 1
    aimd_fill: float = 1.0
    max_in_flight: int = 2  # batches outstanding per replica (credit)
    # a busy replica's next batch goes shortly before its last one should be done (lead: the
    # larger of this and a tenth of the service time), not as soon as credit allows
    just_in_time: bool = True
    credit_lead_ms: float = 3.0
    credit_timeout_ms: float = 5000.0  # reclaim credit of a batch never reported
    cache: bool = True
    # the longest the broker holds the batcher's fetch when nothing arrives
    fetch_max_wait_ms: int = 500
    uvloop: bool = True  # libuv's event loop when installed (false: asyncio's own)
    # drop a queued request as soon as its replica could not finish it by its deadline
    drop_hopeless: bool = True
    # ... counting this for the prediction's trip from the worker back to the selector
    hopeless_margin_ms: float = 3.0
    registry_timeout_s: float = 30.0
    # a new model version's batches wait this long at most for its workers' ready markers
    version_switch_timeout_s: float = 180.0
    stats_log_interval_s: float = 5.0  # 0 disables the periodic per-replica stats line
    # batcher members (one consumer group on requests.<model>; docs/design/0024): a member that
    # stops heartbeating loses its partitions after this long (it outlasts a coordinator's move:
    # docs/design/0035), and requests done are committed this often (a replay redoes at most that much)
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 500
    commit_interval_ms: int = 1_000

    @model_validator(mode="after")
    def _knobs_within_the_registrys_bounds(self) -> "BatcherSettings":
        """The defaults a model that says nothing takes are held to the bounds its own would be."""
        for key in KNOBS:
            try:
                check_knob(key, getattr(self, key), f"CLIPSTREAM_BATCHER_{key.upper()}")
            except ConfigError as exc:
                raise ValueError(str(exc)) from None
        return self
