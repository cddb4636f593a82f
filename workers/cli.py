"""``clipstream worker``: run one replica of one model, or of one group of models.

With ``--path`` the model folder is given directly (tests, benchmarks, a container image);
without it the model is looked up in the registry, as a deployment does, and its location is
resolved against this host's ``CLIPSTREAM_MODEL_REPOSITORY`` (a remote folder is copied here).
A name the registry knows as a group (docs/design/0088) is served as one: each member at its
current version, in one process (``workers.group``).
"""

from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path

import click

from clipstream.errors import ClipstreamError, ConfigError, one_line
from clipstream.settings import Settings, get_settings, settings_or_exit
from registry.groups import GroupConfig
from registry.repository import Repository, sibling
from registry.spec import load_spec
from registry.topic import ModelConfig, RegistryFollower
from topics.stage import exit_code
from workers.backends import BatchModel, load_model
from workers.group import GroupModel, Member
from workers.loaded import say_not_loaded, tell_batcher_not_loaded
from workers.settings import WorkerSettings
from workers.worker import Worker


def registered(
    settings: Settings, name: str, timeout_s: float, *, groups: bool = False
) -> ModelConfig | GroupConfig:
    """``name``'s entry in the registry: a model, or (with ``groups``) a group first (a group's
    name is no model's: its members are)."""
    deadline = time.monotonic() + timeout_s
    follower = RegistryFollower(settings)
    follower.start()
    try:
        if follower.wait_ready(timeout_s) is False:
            raise ConfigError(f"the registry was not read within {timeout_s:.0f}s")
        # the model may be deployed just after the worker starts (or the view may trail the
        # follower's ready signal): watch the live view until the deadline
        while True:
            view = follower.view()
            found = (view.groups.get(name) if groups else None) or view.models.get(name)
            if found is not None or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
    finally:
        follower.stop()
    if found is None:
        known = sorted(view.models) + (sorted(view.groups) if groups else [])
        raise ConfigError(f"{'model or group' if groups else 'model'} {name!r} is not in the registry; "
                          f"known: {known}")
    return found


def model_folder(
    settings: Settings, name: str, cfg: ModelConfig, version: str | None
) -> tuple[Path, str | None, int]:
    """(local folder, version, replicas) of model ``name`` at ``version`` (None: its current).

    ``--version`` may name the current version, a previous one the registry remembers, or a
    sibling folder ``<repository>/<name>/<version>`` (the model repository layout).
    """
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


def group_folders(
    settings: Settings, group: GroupConfig, version: str | None
) -> list[tuple[str, str, Path]]:
    """(name, version, local folder) of each member at its current version. A group's version
    follows from its members', so only the current one can be served: an older one's members
    are not recorded together anywhere."""
    if version is not None and version != group.version:
        raise ConfigError(f"group {group.name}'s current version is {group.version}, not {version}: "
                          f"a group worker serves its members' current versions")
    members = []
    for m in group.members:
        try:
            folder = Repository.from_settings(settings).fetch(m.location or str(m.path))
        except ConfigError as exc:
            raise ConfigError(f"group {group.name}: model {m.name} version {m.version}: {exc}") from None
        members.append((m.name, str(m.version), folder))
    return members


@click.command()
@click.option("--model", "name", required=True, help="model or group name (topics batches.<name>, ...)")
@click.option("--version", default=None, help="model version (default: the registry's, or the folder name)")
@click.option("--replica", default=0, show_default=True, type=click.IntRange(min=0), help="which replica = partition")
@click.option("--replicas", default=None, type=click.IntRange(min=1), help="replicas of this model (default: registry, or 1)")
@click.option("--path", "folder", default=None, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="model folder holding model.yaml (default: look the model up in the registry; "
                   "a group is served from the registry only)")
@click.option("--device", default=None, type=click.Choice(["auto", "cpu", "cuda"]), help="override CLIPSTREAM_WORKER_DEVICE")
@click.option("--registry-timeout", default=30.0, show_default=True, help="seconds to wait for the registry")
def worker(
    name: str, version: str | None, replica: int, replicas: int | None, folder: Path | None,
    device: str | None, registry_timeout: float,
) -> None:
    """Serve one replica of a model or group: consume batches.<name>[replica], emit predictions."""
    settings, ws = settings_or_exit(get_settings), settings_or_exit(WorkerSettings)
    if device is not None:
        ws = ws.model_copy(update={"device": device})
    # a deployment names the version (the registry's, or --version): the worker then serves only
    # that version's batches and hands over to the next one (docs/design/0021)
    own_version_only = folder is None or version is not None

    def load(path: Path) -> BatchModel:
        return load_model(load_spec(path), device=ws.device, threads=ws.threads)

    served: list[tuple[str, str | None]] = [(name, version)]  # the model (or members) it failed to load, if it does
    running: Worker | None = None
    try:
        model: BatchModel | GroupModel
        single = False  # a model whose batches hold one request at most is not tried on a batch of two
        if folder is not None:
            version = version or folder.resolve().name
            model = load(folder)
        elif isinstance(cfg := registered(settings, name, registry_timeout, groups=True), GroupConfig):
            served = [(m.name, str(m.version)) for m in cfg.members]
            members = group_folders(settings, cfg, version)
            version, replicas = cfg.version, replicas or int(cfg.replicas)
            model = GroupModel(name, version, tuple(Member(n, v, load(f)) for n, v, f in members))
        else:
            folder, version, registered_replicas = model_folder(settings, name, cfg, version)
            served = [(name, version)]
            replicas = replicas or registered_replicas
            model = load(folder)
            single = cfg.max_batch_size == 1
        replicas = max(replicas or 1, replica + 1)
        running = Worker(settings, model, name, version=version, replica=replica, replicas=replicas,
                         worker_settings=ws, own_version_only=own_version_only, batches=not single)
        running.run()
    except Exception as exc:
        served_once = running is not None and bool(running.ready_us)
        if served_once and not isinstance(exc, ClipstreamError):
            raise
        if not served_once:  # it never served: readiness says why (clipstream.loaded), and the batcher stays
            say_not_loaded(settings, served, replica, one_line(exc))
            if own_version_only and version is not None:
                tell_batcher_not_loaded(settings, name, version, replica)
            if not isinstance(exc, ClipstreamError):  # not one of ours: where it came from is in the log
                traceback.print_exc()
        click.echo(f"error: worker {name} replica {replica}: {one_line(exc)}", err=True)
        sys.exit(1)
    sys.exit(exit_code())
