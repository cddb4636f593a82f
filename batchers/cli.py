"""``clipstream batcher``: run one model's batcher (cache, deadline queue, AIMD, delayed batching).

Options left out are taken from the model's registry entry (version, replicas, serving knobs),
then from ``CLIPSTREAM_BATCHER_*`` defaults. With both --version and --replicas given, the
registry is not needed at all.

``--model`` given several times runs one process for several models, each with its own queue,
AIMD and credit (Clipper keeps every model's batching queue in one process too); their versions
and replicas come from the registry, which the process then follows, and the serving options
given apply to every one of them.

Several processes for the same models share their work: each is a member of one consumer
group and owns some of every model's request partitions (docs/design/0024).
"""

from __future__ import annotations

import logging
import sys
from dataclasses import replace
from typing import Any

import click
from confluent_kafka import KafkaException

from batchers.app import run
from batchers.service import ModelSetup
from batchers.settings import BatcherSettings
from batchers.version import start_version
from clipstream.errors import ClipstreamError, ConfigError
from clipstream.settings import Settings, get_settings, settings_or_exit
from registry.groups import GroupConfig
from registry.limits import check_knob, check_replicas
from registry.topic import ModelConfig, RegistryFollower
from registry.versions import known_versions
from topics.catalogue import Catalogue, check_name
from topics.tail import served_versions


def _from_registry(settings: Any, models: list[str], timeout_s: float
                   ) -> tuple[RegistryFollower, dict[str, ModelConfig | GroupConfig | None]]:
    """(follower, name -> its ModelConfig, or GroupConfig for a group's name, or None)."""
    follower = RegistryFollower(settings).start()
    view = follower.wait_ready(timeout_s)
    return follower, {name: view.groups.get(name) or view.model(name) for name in models}


@click.command("batcher")
@click.option("--model", "model_names", required=True, multiple=True,
              help="model name (its topics carry it), or a group's (docs/design/0088); repeat it to "
                   "serve several in one process")
@click.option("--version", default=None, help="model version (part of the cache key)")
@click.option("--replicas", type=int, default=None, help="replicas = partitions of batches.<model>")
@click.option("--latency-objective-ms", type=float, default=None, help="AIMD objective [default 20]")
@click.option("--max-batch-size", type=int, default=None, help="AIMD cap")
@click.option("--batch-delay-ms", type=float, default=None, help="delayed batching wait; 0 disables")
@click.option("--no-cache", is_flag=True, help="no Redis cache lookups, no coalescing")
@click.option("--member", default=None,
              help="this member's stable name in the group of batchers for these models (static "
                   "membership: a restart gets its partitions back at once) [default: CLIPSTREAM_MEMBER]")
def batcher(
    model_names: tuple[str, ...],
    version: str | None,
    replicas: int | None,
    latency_objective_ms: float | None,
    max_batch_size: int | None,
    batch_delay_ms: float | None,
    no_cache: bool,
    member: str | None,
) -> None:
    """Run the batcher of one model (or of several, --model repeated) until interrupted."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings, bs = settings_or_exit(get_settings), settings_or_exit(BatcherSettings)
    try:
        for name in model_names:
            check_name("model", name)
        if len(set(model_names)) != len(model_names):
            raise ConfigError(f"--model names a model twice: {list(model_names)}")
        if len(model_names) > 1 and (version is not None or replicas is not None):
            raise ConfigError("--version and --replicas name one model's; with several --model the "
                              "registry gives each model's (deploy them first)")
        follower: RegistryFollower | None = None
        cfgs: dict[str, ModelConfig | GroupConfig | None] = {}
        if version is None or replicas is None:
            follower, cfgs = _from_registry(settings, list(model_names), bs.registry_timeout_s)
            missing = [n for n in model_names if cfgs.get(n) is None]
            if missing:
                raise ConfigError(
                    f"model(s) {missing} not in the registry; deploy them first "
                    "or pass both --version and --replicas (one --model)"
                )

        def pick(cli: Any, reg: Any, default: Any) -> Any:
            return cli if cli is not None else (reg if reg is not None else default)

        # the registry's bounds, for the knobs and replicas given here (the registry checked its own)
        for key, value in (("latency_objective_ms", latency_objective_ms), ("max_batch_size", max_batch_size),
                           ("batch_delay_ms", batch_delay_ms)):
            if value is not None:
                check_knob(key, value, "--" + key.replace("_", "-"))
        if replicas is not None:
            check_replicas(replicas, "--replicas")

        setups = []
        for name in model_names:
            cfg = cfgs.get(name)
            setups.append(ModelSetup(
                name=name,
                version=pick(version, cfg and cfg.version, None),
                replicas=max(1, int(pick(replicas, cfg and cfg.replicas, 1))),
                latency_objective_ms=float(pick(latency_objective_ms, cfg and cfg.latency_objective_ms,
                                                bs.latency_objective_ms)),
                max_batch_size=max(1, int(pick(max_batch_size, cfg and cfg.max_batch_size, bs.max_batch_size))),
                batch_delay_ms=max(0.0, float(pick(batch_delay_ms, cfg and cfg.batch_delay_ms,
                                                   bs.batch_delay_ms))),
                cache=bs.cache and not no_cache,
                spec=cfg.spec if cfg is not None else None,
                members=dict(cfg.member_versions) if isinstance(cfg, GroupConfig) else {},
                pinned=tuple(k for k, v in (("latency_objective_ms", latency_objective_ms),
                                            ("max_batch_size", max_batch_size), ("batch_delay_ms", batch_delay_ms))
                             if v is not None),
            ))
        if version is None:  # the registry's: what the batches carry now may be an earlier one
            setups = [_serving(settings, s, cfgs.get(s.name)) for s in setups]
        # follow the registry live only where it, not the command line, set the replicas
        run(settings, bs, setups, follower if replicas is None else None, member)
    except ClipstreamError as exc:  # one line, as every stage says it
        click.echo(f"error: batcher: {exc}", err=True)
        sys.exit(1)


def _serving(settings: Settings, setup: ModelSetup, cfg: ModelConfig | GroupConfig | None) -> ModelSetup:
    """``setup`` at the version its batches carry now when that is an earlier one of the model's
    (``batchers.version.start_version``); the registry's version follows once its workers are
    ready. Groups, whose version is their members', start at the registry's."""
    if not isinstance(cfg, ModelConfig) or setup.version is None:
        return setup
    try:
        carried = served_versions(settings, Catalogue.from_settings(settings).batches(setup.name).name, setup.replicas)
    except KafkaException:
        return setup  # as before: the registry's version
    start = start_version(setup.version, known_versions(cfg), carried.values())
    return setup if start == setup.version else replace(setup, version=start)
