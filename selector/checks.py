"""What a query or a feedback record read from Kafka must be for the selector to serve it.

The gateway and ``frontend.producer`` check the same before they publish, but anyone with
write access to the topics can skip them, so the selector checks again: each refusal is a
reason for a dead letter (and, for a query that can be keyed, for its default Response).
Every check is a comparison or two: they run once per record on the dispatch and learn paths.
"""

from __future__ import annotations

from registry.topic import AppConfig
from schemas import QueryEvent
from topics.catalogue import Catalogue

# the longest SLO a caller may ask for (the selector cannot import ``frontend``, whose
# ``gateway_models.MAX_SLO_MS`` it mirrors; a unit test keeps the two equal)
MAX_SLO_MS = 60_000.0
MAX_SLO_US = int(MAX_SLO_MS * 1000)

# a Response is keyed by its query's id: without one no caller could ever match it
EMPTY_QUERY_ID = "bad query: empty query_id (no Response could be keyed to it)"


def reply_problem(ev: QueryEvent, catalogue: Catalogue) -> str | None:
    """Why a query's answer may not go where it asks, or None. Only ``responses`` and the reply
    topics take Responses: another topic named there (the registry, a model's requests) would
    get records its readers cannot use, and a partition ``responses`` lacks refuses the answer."""
    topic, part = ev.reply_topic, ev.reply_partition
    responses = catalogue.responses
    if topic is not None and topic != responses.name and not catalogue.is_reply(topic):
        return (f"bad query: reply_topic {topic!r} is neither {responses.name!r} nor a "
                f"reply topic ({catalogue.prefix}replies.<instance>)")
    if part is not None and part < 0:
        return f"bad query: reply_partition {part} is negative"
    if part is not None and topic == responses.name and part >= responses.partitions:
        return (f"bad query: reply_partition {part} is beyond {responses.name!r}, which has "
                f"{responses.partitions} partitions")
    return None


def deadline_problem(ev: QueryEvent, app: AppConfig, now_us: int) -> str | None:
    """Why a query's deadline is refused, or None: not after its creation, or further from it,
    or from ``now_us``, than any SLO the gateway or the producer lets a caller ask for (a slot
    in every stage is held that long; a sender whose clock runs ahead stamps a creation still
    to come). An app registered with a longer SLO is asked with it when the caller names none,
    so that one is allowed too (read only past the common bound: a comparison per query)."""
    span = ev.deadline_us - ev.created_us
    if span <= 0:  # no stage could ever serve it: a mistake of its sender's, not a backlog
        return f"bad query: its deadline_us is not after its created_us ({span / 1000:g} ms from it)"
    ahead = ev.deadline_us - now_us
    if span <= MAX_SLO_US and ahead <= MAX_SLO_US:
        return None
    longest = max(MAX_SLO_MS, float(app.slo_ms))
    if span <= longest * 1000 and ahead <= longest * 1000:
        return None
    if span >= ahead:
        return f"bad query: its deadline is {span / 1000:.0f} ms after its creation, beyond the longest SLO, {longest:g} ms"
    return (f"bad query: its deadline is {ahead / 1000:.0f} ms from now, beyond the longest SLO, {longest:g} ms "
            "(its created_us is ahead of this host's clock: is the sender's clock right?)")


def app_problem(query_id: str, claimed: str, stored: str | None) -> str | None:
    """Why a feedback may not teach the app its query was answered for, or None: it names
    another app, so its sender may hold a key for that app alone (app-scoped API keys)."""
    if stored and claimed != stored:
        return (f"feedback for another app: query {query_id!r} was answered for app {stored!r}, "
                f"and the feedback names app {claimed!r}")
    return None
