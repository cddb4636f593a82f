"""``clipstream batcher``: run one model's batcher (cache, deadline queue, AIMD, delayed batching).

Options left out are taken from the model's registry entry (version, replicas, serving knobs),
then from ``CLIPSTREAM_BATCHER_*`` defaults. With both --version and --replicas given, the
registry is not needed at all.
"""

from __future__ import annotations

from typing import Any

import click

from batchers.settings import BatcherSettings
from clipstream.errors import ClipstreamError, ConfigError
from clipstream.settings import get_settings, settings_or_exit
from topics.catalogue import check_name


def _from_registry(settings: Any, model: str, timeout_s: float) -> tuple[Any, Any]:
    """(follower, ModelConfig or None); imported lazily: frontend is another stage."""
    from frontend.registry import RegistryFollower

    follower = RegistryFollower(settings).start()
    view = follower.wait_ready(timeout_s)
    return follower, view.model(model)


@click.command("batcher")
@click.option("--model", "model_name", required=True, help="model name (its topics carry it)")
@click.option("--version", default=None, help="model version (part of the cache key)")
@click.option("--replicas", type=int, default=None, help="replicas = partitions of batches.<model>")
@click.option("--latency-objective-ms", type=float, default=None, help="AIMD objective [default 20]")
@click.option("--max-batch-size", type=int, default=None, help="AIMD cap")
@click.option("--batch-delay-ms", type=float, default=None, help="delayed batching wait; 0 disables")
@click.option("--no-cache", is_flag=True, help="no Redis cache lookups, no coalescing")
def batcher(
    model_name: str,
    version: str | None,
    replicas: int | None,
    latency_objective_ms: float | None,
    max_batch_size: int | None,
    batch_delay_ms: float | None,
    no_cache: bool,
) -> None:
    """Run the batcher of one model until interrupted."""
    from batchers.app import ModelSetup, run

    settings, bs = settings_or_exit(get_settings), settings_or_exit(BatcherSettings)
    try:
        check_name("model", model_name)
        follower, cfg = None, None
        if version is None or replicas is None:
            follower, cfg = _from_registry(settings, model_name, bs.registry_timeout_s)
            if cfg is None:
                raise ConfigError(
                    f"model {model_name!r} is not in the registry; deploy it first "
                    "or pass both --version and --replicas"
                )

        def pick(cli: Any, reg: Any, default: Any) -> Any:
            return cli if cli is not None else (reg if reg is not None else default)

        setup = ModelSetup(
            name=model_name,
            version=pick(version, cfg and cfg.version, None),
            replicas=max(1, int(pick(replicas, cfg and cfg.replicas, 1))),
            latency_objective_ms=float(pick(latency_objective_ms, cfg and cfg.latency_objective_ms,
                                            bs.latency_objective_ms)),
            max_batch_size=max(1, int(pick(max_batch_size, cfg and cfg.max_batch_size, bs.max_batch_size))),
            batch_delay_ms=max(0.0, float(pick(batch_delay_ms, cfg and cfg.batch_delay_ms, bs.batch_delay_ms))),
            cache=bs.cache and not no_cache,
            spec=cfg.spec if cfg is not None else None,
        )
        # follow the registry live only where it, not the command line, set the replicas
        run(settings, bs, setup, follower if replicas is None else None)
    except ClipstreamError as exc:
        raise click.ClickException(str(exc)) from exc
