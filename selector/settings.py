"""The selector's own knobs (``CLIPSTREAM_SELECTOR_*``)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class SelectorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CLIPSTREAM_SELECTOR_", extra="ignore")

    group: str = "clipstream-selector"  # dispatch+join group; learners use <group>.learn
    answered_capacity: int = 100_000  # answered ids remembered to count late predictions
    max_poll_s: float = 0.1  # longest poll when nothing is due (how fast a stop is noticed)
    drain_max: int = 500  # records taken per poll once one has arrived
    learn_global: bool = True  # feedback with a context also teaches the app's global state
    registry_timeout_s: float = 30.0
    # the straggler cutoff fires this long before the deadline: the reply's Kafka hop back
    # to the gateway must fit in the caller's SLO too. The budget follows the measured trip
    # (a quantile of the Responses' due-to-ack times, ``selector.reply_budget``) between
    # this floor and the cap below; a cap at or under the floor fixes it at the floor
    reply_budget_ms: float = Field(3.0, ge=0)
    reply_budget_max_ms: float = Field(10.0, ge=0)
    # the budget learns from the answers made at the cutoff alone (most answers complete early,
    # at quiet moments, and say little about the cutoff's trips): the 95th percentile of their
    # trips, from when they were due, keeps all but their slowest twentieth within the SLO
    # (docs/design/0006)
    reply_budget_quantile: float = Field(0.95, gt=0, le=1)
