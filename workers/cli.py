"""``clipstream worker``: run one replica of one model.

With ``--path`` the model folder is given directly (tests, benchmarks, a container image);
without it the model is looked up in the registry, as a deployment does, and its location is
resolved against this host's ``CLIPSTREAM_MODEL_REPOSITORY`` (a remote folder is copied here).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from clipstream.errors import ClipstreamError, ConfigError
from clipstream.settings import Settings, get_settings, settings_or_exit
from registry.repository import Repository, sibling
from registry.spec import load_spec
from registry.topic import RegistryFollower
from topics.stage import exit_code
from workers.backends import load_model
from workers.settings import WorkerSettings
from workers.worker import Worker


def resolve_from_registry(
    settings: Settings, name: str, version: str | None, timeout_s: float
) -> tuple[Path, str | None, int]:
    """(local folder, version, replicas) of ``name`` from the registry.

    ``--version`` may name the current version, a previous one the registry remembers, or a
    sibling folder ``<repository>/<name>/<version>`` (the model repository layout).
    """
    deadline = time.monotonic() + timeout_s
    follower = RegistryFollower(settings)
    follower.start()
    try:
        if follower.wait_ready(timeout_s) is False:
            raise ConfigError(f"the registry was not read within {timeout_s:.0f}s")
        # the model may be deployed just after the worker starts (or the view may trail the
        # follower's ready signal): watch the live view until the deadline
        while name not in (models := follower.view().models) and time.monotonic() < deadline:
            time.sleep(0.1)
        if name not in models:
            raise ConfigError(f"model {name!r} is not in the registry; known: {sorted(models)}")
        cfg = models[name]
    finally:
        follower.stop()
    location, current = cfg.location or str(cfg.path), str(cfg.version)
    if version is not None and version != current:
        previous = dict(zip(cfg.previous_versions, cfg.previous_paths))
        location = previous[version] if version in previous else sibling(location, version)
        current = version
    try:
        folder = Repository.from_settings(settings).fetch(location)
    except ConfigError as exc:
        raise ConfigError(f"model {name} version {current}: {exc}") from None
    return folder, current, int(cfg.replicas)


@click.command()
@click.option("--model", "name", required=True, help="model name (topics batches.<name>, ...)")
@click.option("--version", default=None, help="model version (default: the registry's, or the folder name)")
@click.option("--replica", default=0, show_default=True, type=click.IntRange(min=0), help="which replica = partition")
@click.option("--replicas", default=None, type=click.IntRange(min=1), help="replicas of this model (default: registry, or 1)")
@click.option("--path", "folder", default=None, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="model folder holding model.yaml (default: look the model up in the registry)")
@click.option("--device", default=None, type=click.Choice(["auto", "cpu", "cuda"]), help="override CLIPSTREAM_WORKER_DEVICE")
@click.option("--registry-timeout", default=30.0, show_default=True, help="seconds to wait for the registry")
def worker(
    name: str, version: str | None, replica: int, replicas: int | None, folder: Path | None,
    device: str | None, registry_timeout: float,
) -> None:
    """Serve one replica of a model: consume batches.<model>[replica], emit predictions."""
    settings, ws = settings_or_exit(get_settings), settings_or_exit(WorkerSettings)
    if device is not None:
        ws = ws.model_copy(update={"device": device})
    # a deployment names the version (the registry's, or --version): the worker then serves only
    # that version's batches and hands over to the next one (docs/design/0021)
    own_version_only = folder is None or version is not None
    try:
        if folder is None:
            folder, version, registered = resolve_from_registry(settings, name, version, registry_timeout)
            replicas = replicas or registered
        else:
            version = version or folder.resolve().name
        replicas = max(replicas or 1, replica + 1)
        model = load_model(load_spec(folder), device=ws.device, threads=ws.threads)
        Worker(settings, model, name, version=version, replica=replica, replicas=replicas, worker_settings=ws,
               own_version_only=own_version_only).run()
    except ClipstreamError as exc:
        click.echo(f"worker {name} replica {replica}: {exc}", err=True)
        sys.exit(1)
    sys.exit(exit_code())
