"""``clipstream topics create``: create the core topics (and a model's) ahead of time."""

from __future__ import annotations

import click

from clipstream.settings import get_settings
from topics.admin import ensure_core_topics, ensure_model_topics


@click.group()
def topics() -> None:
    """Topic catalogue."""


@topics.command("create")
@click.option("--model", "models", multiple=True, help="also create this model's topics")
@click.option("--replicas", default=1, show_default=True)
def create(models: tuple[str, ...], replicas: int) -> None:
    """Create the core topics (idempotent)."""
    settings = get_settings()
    made = ensure_core_topics(settings)
    for model in models:
        made += ensure_model_topics(settings, model, replicas)
    click.echo(f"topics ready ({len(made)} created or grown)")
