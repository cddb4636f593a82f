"""``clipstream topics create``: create the core topics (and a model's) ahead of time."""

from __future__ import annotations

import sys

import click

from clipstream.errors import ClipstreamError, ConfigError
from clipstream.settings import Settings, get_settings, settings_or_exit
from topics.admin import ensure_stage_topics


@click.group()
def topics() -> None:
    """Topic catalogue."""


def _check_partitions(settings: Settings) -> None:
    """Refuse ``CLIPSTREAM_SELECTOR_PARTITIONS`` below 1 here: the settings accept any integer, and
    an existing topic is never shrunk, so 0 would otherwise be reported as success."""
    if settings.selector_partitions < 1:
        raise ConfigError(f"CLIPSTREAM_SELECTOR_PARTITIONS is {settings.selector_partitions}: the queries, "
                          "predictions, responses and feedback topics need at least 1 partition; "
                          "set it to 1 or more (default 4)")


@topics.command("create")
@click.option("--model", "models", multiple=True, help="also create this model's topics")
@click.option("--replicas", type=click.IntRange(min=1), default=1, show_default=True,
              help="model replicas: the partitions of each --model's batches.<model> topic, one per replica "
                   "(not the replication factor; that is CLIPSTREAM_REPLICATION_FACTOR)")
def create(models: tuple[str, ...], replicas: int) -> None:
    """Create the core topics (idempotent)."""
    settings = settings_or_exit(get_settings)
    try:
        _check_partitions(settings)
        made = ensure_stage_topics(settings, {model: replicas for model in models})
    except ClipstreamError as exc:  # Kafka away, too few brokers, a bad setting: one line, no traceback
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    click.echo(f"topics ready ({len(made)} created or grown)")
