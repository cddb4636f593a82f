"""``clipstream deadletters``: the newest records the stages could not use, with why and where from."""

from __future__ import annotations

import datetime as dt
import json
import sys

import click
from confluent_kafka import KafkaException

from clipstream.errors import ClipstreamError
from clipstream.settings import get_settings, settings_or_exit
from schemas import DeadLetter
from topics.deadletters import STAGES, latest


@click.command()
@click.option("-n", "--count", type=click.IntRange(1, 10_000), default=20, show_default=True,
              help="How many of the newest dead letters to show (of --stage, if given).")
@click.option("--stage", default=None, type=click.Choice(STAGES),
              help="Only those from this stage; -n then counts that stage's records.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.option("--timeout", "timeout_s", type=float, default=10.0, show_default=True, help="Seconds to wait for Kafka.")
def deadletters(count: int, stage: str | None, as_json: bool, timeout_s: float) -> None:
    """Show the newest dead letters, oldest first, one per line: the time (UTC), the stage, the
    source topic[partition]@offset, the query id and the reason; the same record refused for the
    same reason again is counted on its first line."""
    settings = settings_or_exit(get_settings)
    try:
        found = latest(settings, count, timeout_s, stage=stage)
    except (KafkaException, ClipstreamError) as exc:
        click.echo(f"error: cannot read the deadletter topic at {settings.kafka_bootstrap}: {exc}", err=True)
        sys.exit(1)
    if as_json:
        for d in found:
            click.echo(json.dumps({"stage": d.stage, "reason": d.reason, "source": _where(d), "query_id": d.query_id,
                                   "created_us": d.created_us, "payload_bytes": len(d.payload or b"")}))
        return
    # one line for the same record refused for the same reason more than once: every stage
    # that follows the registry refuses a bad registry record on its own
    lines: dict[tuple[str, str, str, str], list[int]] = {}
    for d in found:
        lines.setdefault((d.stage, _where(d), d.query_id or "-", d.reason), []).append(d.created_us)
    for (stage_, where, query, reason), times in lines.items():
        again = f"  ({len(times)} times, the last at {_utc(times[-1])})" if len(times) > 1 else ""
        click.echo(f"{_utc(times[0])}  {stage_:<8}  {where}  query={query}  {reason}{again}")
    if not found:
        click.echo("no dead letters")


def _where(d: DeadLetter) -> str:
    return f"{d.source_topic}[{d.source_partition}]@{d.source_offset}" if d.source_topic else "-"


def _utc(created_us: int) -> str:
    return dt.datetime.fromtimestamp(created_us / 1e6, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
