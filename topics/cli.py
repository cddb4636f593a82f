"""``clipstream topics create``: create the core topics (and a model's) ahead of time."""

from __future__ import annotations

import sys

import click

from clipstream.errors import ClipstreamError
from clipstream.settings import get_settings, settings_or_exit
from topics.admin import ensure_stage_topics


@click.group()
def topics() -> None:
    """Create clipstream's topics ahead of the stages (each stage also creates the ones it uses)."""


@topics.command("create")
@click.option("--model", "models", multiple=True, help="also create this model's topics")
@click.option("--replicas", type=click.IntRange(min=1), default=1, show_default=True,
              help="model replicas: the partitions of each --model's batches.<model> topic, one per replica "
                   "(not the replication factor; that is CLIPSTREAM_REPLICATION_FACTOR)")
def create(models: tuple[str, ...], replicas: int) -> None:
    """Create the core topics (idempotent)."""
    if replicas != 1 and not models:
        click.echo("error: --replicas sets the partitions of a model's batches topic: name the model with --model",
                   err=True)
        sys.exit(2)
    settings = settings_or_exit(get_settings)
    try:
        made = ensure_stage_topics(settings, {model: replicas for model in models})
    except ClipstreamError as exc:  # Kafka away, too few brokers, a bad setting: one line, no traceback
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    click.echo(f"topics ready ({len(made)} created or grown)")
