"""The selector's own knobs (``CLIPSTREAM_SELECTOR_*``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from clipstream.saver import GATHER_S
from clipstream.settings import Settings
from topics.stage import IDLE_POLL_S


class SelectorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CLIPSTREAM_SELECTOR_", extra="ignore")

    # dispatch+join group, learners use <group>.learn; unset: named after the topic prefix
    # (``join_group``), so pipelines under other prefixes on one cluster never share it
    group: str | None = None
    answered_capacity: int = 100_000  # answered ids remembered to count late predictions ...
    answered_window_s: float = Field(60.0, gt=0)  # ... for at most this long after their deadline
    max_poll_s: float = IDLE_POLL_S  # longest poll when nothing is due: how soon a stop is noticed
    drain_max: int = 500  # records taken per poll once one has arrived
    learn_global: bool = True  # feedback with a context also teaches the app's global state
    registry_timeout_s: float = 30.0
    # the straggler cutoff fires this long before the deadline: the reply's Kafka hop back
    # to the gateway must fit in the caller's SLO too. The budget follows the measured trip
    # (a quantile of the Responses' due-to-ack times and of the queries' crossings to the
    # selector, ``selector.reply_budget``) between this floor and the cap below, and takes at
    # most ``reply_budget_max_share`` of a query's SLO; a cap at or under the floor fixes it at
    # the floor (docs/design/0068)
    reply_budget_ms: float = Field(3.0, ge=0)
    reply_budget_max_ms: float = Field(40.0, ge=0)
    reply_budget_max_share: float = Field(0.2, gt=0, le=1)
    # of the acknowledgements, the budget learns from the answers made at the cutoff alone (most
    # answers complete early, at quiet moments, and say little about the cutoff's trips): the
    # 95th percentile of their trips, from when they were due, keeps all but their slowest
    # twentieth within the SLO (docs/design/0006). The queries' crossings take the same quantile
    # (docs/design/0068)
    reply_budget_quantile: float = Field(0.95, gt=0, le=1)
    # above 0, a model is asked only when the time a query has left is at least this quantile of
    # its dispatch-to-prediction trips of the last second (0.5: its typical trip fits). In
    # sustained overload the requests it would not get come back too late or expire in the
    # batcher; near capacity it skips models that would often have answered in time.
    # 0: ask every model (docs/design/0057, 0059, 0061)
    hopeless_quantile: float = Field(0.0, ge=0, lt=1)
    # the join group's failure detection: a killed member's partitions move to the others once
    # the broker has missed its heartbeats this long (a killed static member comes back sooner:
    # docs/design/0022). It outlasts the move of the group's coordinator when its broker dies
    # (docs/design/0035); 6 s is the least a broker accepts by default
    session_timeout_ms: int = Field(10_000, gt=0)
    heartbeat_interval_ms: int = Field(500, gt=0)  # how soon a survivor hears of the rebalance
    # answered queries' offsets are committed this often: a killed member's successor answers
    # again at most this much of what it had answered (its readers drop the second Response)
    commit_interval_ms: int = Field(1_000, gt=0)
    # policy import paths (``pkg.module:Class``) an App record may name besides exp3, exp4 and
    # single, comma-separated; anything else is refused (docs/design/0029)
    policy_imports: Annotated[tuple[str, ...], NoDecode] = ()
    # a context's learned state (cs:state:<app>:<context>) lives this long after its last
    # feedback, and an app keeps at most this many: callers name contexts (docs/design/0031)
    context_state_ttl_s: int = Field(30 * 86400, gt=0)
    max_contexts: int = Field(100_000, gt=0)
    # answered queries' predictions are stored for feedback in one Redis round trip per this
    # many ms (0: one per wake-up of the writer), off the answer path (clipstream.saver)
    save_gather_ms: float = Field(GATHER_S * 1000, ge=0, le=1000)
    # a policy state read (or learnt here) this many ms ago is used as it is, with no Redis
    # round trip; another member's feedback reaches this one's answers at most this late
    # (0: every poll group reads Redis; docs/design/0054)
    state_fresh_ms: float = Field(250.0, ge=0, le=10_000)
    # an ensemble's requests for one query: one record on the first model's topic that names the
    # others (``ModelRequest.also``; the batcher that reads it serves them, or forwards what it
    # does not serve), or one record per model for batchers that run a process per model
    # (``up`` sets it from CLIPSTREAM_UP_BATCHERS; docs/design/0082)
    fan_out: Literal["grouped", "per-model"] = "grouped"

    def join_group(self, settings: Settings) -> str:
        """The join group: ``group``, else ``<prefix>-selector`` (``clipstream-selector`` under
        the default prefix, as before the name followed it)."""
        return self.group or (settings.topic_prefix.rstrip(".") or "clipstream") + "-selector"

    @field_validator("policy_imports", mode="before")
    @classmethod
    def _split_imports(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(p.strip() for p in value.split(",") if p.strip())
        return value

    @model_validator(mode="after")
    def _heartbeats_fit(self) -> "SelectorSettings":
        if self.heartbeat_interval_ms * 3 > self.session_timeout_ms:
            raise ValueError(
                f"CLIPSTREAM_SELECTOR_HEARTBEAT_INTERVAL_MS ({self.heartbeat_interval_ms}) must be at most a third of "
                f"CLIPSTREAM_SELECTOR_SESSION_TIMEOUT_MS ({self.session_timeout_ms}), so one late heartbeat does not "
                "cost a member its partitions")
        return self
