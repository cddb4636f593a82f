"""``clipstream topics create``: create the core topics (and a model's) ahead of time."""

from __future__ import annotations

import click

from clipstream.settings import get_settings, settings_or_exit
from topics.admin import ensure_stage_topics


@click.group()
def topics() -> None:
    """Topic catalogue."""


@topics.command("create")
@click.option("--model", "models", multiple=True, help="also create this model's topics")
@click.option("--replicas", default=1, show_default=True)
def create(models: tuple[str, ...], replicas: int) -> None:
    """Create the core topics (idempotent)."""
    made = ensure_stage_topics(settings_or_exit(get_settings), {model: replicas for model in models})
    click.echo(f"topics ready ({len(made)} created or grown)")
