"""``clipstream selector``: run the model selection layer (dispatch, join, learn)."""

from __future__ import annotations

import logging
import sys

import click

from clipstream.errors import ClipstreamError
from clipstream.settings import get_settings, settings_or_exit
from selector.process import serve
from selector.settings import SelectorSettings
from topics.stage import exit_code, stop_on_signals


@click.command()
@click.option("--group", default=None, help="consumer group (default CLIPSTREAM_SELECTOR_GROUP); learners use <group>.learn")
@click.option("--learn/--no-learn", default=True, show_default=True, help="also consume feedback and update the policy state")
@click.option("--learn-only", is_flag=True, help="only learn from feedback (no dispatch/join)")
@click.option("--log-level", default="WARNING", show_default=True)
def selector(group: str | None, learn: bool, learn_only: bool, log_level: str) -> None:
    """Select models for queries, join their predictions by the deadline, learn from feedback."""

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    ss = settings_or_exit(SelectorSettings)
    if group:
        ss = ss.model_copy(update={"group": group})
    stop = stop_on_signals()
    try:
        serve(get_settings(), ss, learn=learn or learn_only, join=not learn_only, stop=stop)
    except ClipstreamError as exc:
        click.echo(f"error: selector: {exc}", err=True)
        sys.exit(1)
    sys.exit(exit_code())
