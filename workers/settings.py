"""The worker's own knobs (env prefix ``CLIPSTREAM_WORKER_``).

Connection settings (Kafka, Redis, topic prefix) live in ``clipstream.settings.Settings``;
these are the ones only a model container cares about: which device, how many threads,
and how the poll loop trades latency against CPU.
"""

from __future__ import annotations

from typing import Literal

from pydantic_settings import BaseSettings, SettingsConfigDict


class WorkerSettings(BaseSettings):
    """Operator overrides for one worker process."""

    model_config = SettingsConfigDict(env_prefix="CLIPSTREAM_WORKER_", extra="ignore")

    # auto: CUDA when it is really usable, else CPU; cpu/cuda force one (cuda fails if absent)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # intra-op threads of the framework; None: model.yaml `threads:` or the framework default
    threads: int | None = None
    # how long one consume() waits for a batch: short, so SIGTERM is honoured promptly
    poll_timeout_s: float = 0.1
    # batches read and checked ahead of the device (one runs while these wait): 1 keeps the
    # device busy without taking batches another replica could have had sooner
    prefetch_batches: int = 1
    # offsets are committed at most this often (a crash redoes up to this much, as duplicates)
    commit_interval_s: float = 0.2
    # how long stopping (or recovering from a failed delivery) waits for the broker's acks
    flush_timeout_s: float = 30.0
    # how long start-up may wait for the broker and the partition
    start_timeout_s: float = 60.0
