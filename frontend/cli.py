"""Registry verbs in the spirit of clipper_admin: apply, register-app, deploy-model, link, ..."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace
from functools import wraps
from pathlib import Path
from typing import Any

import click
import yaml

from clipstream.cachekey import KEY_PREFIX, forget_model
from clipstream.errors import ClipstreamError, ConfigError
from clipstream.redisclient import REDIS_AWAY, forget_app, forget_model_weights, sync_client
from clipstream.settings import Settings, get_settings, settings_or_exit
from frontend.serving import failed_to_load, served, wait_loaded
from registry.appfile import apply_file, check_default_output, check_policy
from registry.groups import name_clash
from registry.labels import join_problem
from registry.limits import MAX_APP_SLO_MS, MAX_REPLICAS
from registry.repository import Repository, is_url
from registry.spec import ModelSpec
from registry.topic import (NEW_APP_POLICY, NEW_APP_SLO_MS, AppConfig, ModelConfig, RegistryView, RegistryWriter,
                            read_view)
from registry.versions import check_contract, check_version, history, next_version, rolled_back
from topics.admin import ensure_model_topics


def _friendly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """One line on stderr and exit 1 for our own errors; no traceback for a user's mistake."""

    @wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ClipstreamError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)

    return run


WAIT = click.option(
    "--wait", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
    help="then wait until every replica's worker has the version loaded (exit 1 when one fails to "
         "load it, or after SECONDS)")


def _settings() -> Settings:
    """The settings, or one line naming a bad ``CLIPSTREAM_*`` value and exit 2."""
    return settings_or_exit(get_settings)


def _parse_value(text: str | None) -> Any:
    """`-1` -> -1, `cat` -> "cat": the default output is written as YAML, and must be a value
    an App record holds, checked here so a bad one fails before any Kafka work."""
    if text is None:
        return None
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        why = str(exc).splitlines()[0]
        raise ConfigError(f"--default-output {text!r} is not valid YAML ({why}): give one value such as "
                          "-1, 0.5, true or cat, and quote a string that holds YAML's brackets") from None
    return check_default_output(value, f"--default-output {text!r}")


@click.command("apply")
@click.option("-f", "--file", "path", required=True, type=click.Path(exists=True, dir_okay=False))
@_friendly
def apply(path: str) -> None:
    """Apply an app file: apps, models and links."""
    spec = apply_file(_settings(), path)
    for m in spec.models:
        click.echo(f"model {m['name']} version {m['version']} ({m['replicas']} replicas): {m['path']}")
    for a in spec.apps:
        click.echo(f"app {a['name']} ({a['policy']}, {a['slo_ms']:g} ms): {', '.join(a['models'])}")


@click.command("register-app")
@click.argument("name")
@click.option("--policy", default=None, help="exp3, exp4, single or pkg.module:Class (a new app: exp4)")
@click.option("--slo-ms", default=None, type=click.FloatRange(min=0, min_open=True, max=MAX_APP_SLO_MS),
              help="(a new app: 50)")
@click.option("--default-output", default=None, help="answer when nothing arrives in time (YAML)")
@_friendly
def register_app(name: str, policy: str | None, slo_ms: float | None, default_output: str | None) -> None:
    """Register an app, or update one: what is not given keeps its registered value."""
    if policy is not None:
        check_policy(policy, "--policy")
    value = _parse_value(default_output)
    settings = _settings()
    current = read_view(settings).app(name)
    keep = current or AppConfig(name=name, policy=NEW_APP_POLICY, slo_ms=NEW_APP_SLO_MS, default_output=None)
    with RegistryWriter(settings) as w:
        w.app(name, policy if policy is not None else keep.policy, slo_ms if slo_ms is not None else keep.slo_ms,
              value if default_output is not None else keep.default_output, dict(keep.policy_config) or None)
    click.echo(f"app {name} {'updated' if current else 'registered'}")


@click.command("deploy-model")
@click.argument("name")
@click.argument("path")
@click.option("--version", "version", default=None,
              help="the version's name (default: one more than the model's highest; 1 for a new model)")
@click.option("--replicas", type=click.IntRange(min=1, max=MAX_REPLICAS), default=None,
              help="replicas to run (default: the model's current number; 1 for a new model)")
@WAIT
@_friendly
def deploy_model(name: str, path: str, version: str | None, replicas: int | None, wait: float | None) -> None:
    """Deploy a model version from a folder holding model.yaml.

    PATH is a local folder, a URL (s3://...), or a location inside CLIPSTREAM_MODEL_REPOSITORY
    (logreg/2); a folder inside the repository is recorded relative to it. An existing version
    keeps its folder: a new folder needs a new version.
    """

    settings = _settings()
    location, spec = _location(Repository.from_settings(settings), path)
    view = read_view(settings)
    current = view.model(name)
    clash = name_clash(view, {name: current.group if current is not None else None})
    if clash is not None:
        raise ConfigError(clash)
    version = version if version is not None else next_version(current)
    check_version(current, version, location, "--version N")
    check_contract(current, version, spec)
    instead = _served_instead(settings, current)
    kept: dict[str, Any] = history(current, version, never_served=instead is not None)
    if current is not None:  # the model's group and batching knobs stay
        kept.update(group=current.group, latency_objective_ms=current.latency_objective_ms,
                    max_batch_size=current.max_batch_size, batch_delay_ms=current.batch_delay_ms)
    count = deployed_replicas(replicas, current)
    ensure_model_topics(settings, name, count)
    with RegistryWriter(settings) as w:
        w.model(name, version, location, count, **kept)
    click.echo(f"model {name} version {version} deployed")
    if instead is not None and current is not None and current.version != version:
        click.echo(f"version {current.version} never served (its batches still went to version {instead}): "
                   f"retired, so `clipstream rollback {name}` skips it")
    if wait is not None:
        wait_loaded(settings, name, version, wait)


def _served_instead(settings: Settings, current: ModelConfig | None) -> str | None:
    """The version(s) a model's batches go to when its registry version never took over, as a
    replica of it said it failed to load it, else None; None too while its workers still load
    it (the batcher may hand it the batches a moment later: it serves, and is a version to roll
    back to), when nothing was sent yet or Kafka cannot say, and for a group's member (its
    batches carry the group's version)."""
    if current is None or current.group:
        return None
    now = served(settings, current.name, current.replicas)
    if not now or current.version in now.values():
        return None
    if failed_to_load(settings, current.name, current.version, current.replicas) is None:
        return None
    return ", ".join(sorted({v or "-" for v in now.values()}))


def deployed_replicas(asked: int | None, current: ModelConfig | None) -> int:
    """``--replicas`` when given; else the model keeps its replicas (a new model gets 1), so a
    new version does not scale a model down unasked, and ``--replicas 1`` is obeyed."""
    if asked is not None:
        return asked
    return current.replicas if current is not None else 1


def _location(repository: Repository, path: str) -> tuple[str, ModelSpec]:
    """The registry location of what ``deploy-model`` names, and its model.yaml, which is read
    here so that a wrong one fails the command, not a worker."""
    if Path(path).is_dir():
        location = repository.location_of(Path(path))
    elif Path(path).exists():
        raise ClipstreamError(f"{path} is a file: name the model's folder (the one holding model.yaml)")
    elif repository.root is None and not is_url(path):
        raise ClipstreamError(
            f"no folder {path}; to name a location in a model repository, set CLIPSTREAM_MODEL_REPOSITORY"
        )
    else:
        location = repository.location_of(path) if is_url(path) else path
    return location, repository.read_spec(location)


@click.command("link")
@click.argument("app")
@click.argument("model")
@click.option("--unlink", is_flag=True, help="remove the link instead")
@_friendly
def link(app: str, model: str, unlink: bool) -> None:
    """Link a model to an app: the app's queries start reaching it at once."""
    settings = _settings()
    view = read_view(settings)
    check_link(view, app, model, unlink)
    current = view.app(app)
    if current is not None and unlink and model not in current.models:
        click.echo(f"{model} is not linked to {app}: nothing to unlink")
        return
    with RegistryWriter(settings) as w:
        w.link(app, model, linked=not unlink)
    click.echo(f"{'unlinked' if unlink else 'linked'} {model} {'from' if unlink else 'to'} {app}")


def check_link(view: RegistryView, app: str, model: str, unlink: bool = False) -> None:
    """Refuse a link the selector could not serve: an app or a model the registry lacks. An
    unlink only needs the link itself, so a model already removed can still be unlinked."""
    current = view.app(app)
    if current is None:
        raise ClipstreamError(f"no app {app!r} in the registry: register it first with "
                              "`clipstream register-app` or `clipstream apply -f`")
    if unlink and model in current.models:
        return
    if view.model(model) is None:
        raise ClipstreamError(f"no model {model!r} in the registry: deploy it first with `clipstream deploy-model`")
    problem = join_problem(view, current.models, model)
    if problem is not None:
        raise ClipstreamError(f"cannot link {model!r} to {app!r}: {problem}")


@click.command("remove-model")
@click.argument("name")
@click.option("--unlink", is_flag=True, help="unlink it from every app that links it, in the same change")
@_friendly
def remove_model(name: str, unlink: bool) -> None:
    """Remove a model: its workers stop, and its cached predictions are deleted.

    A model an app links is refused without --unlink, so no app loses a model unasked. The
    model's versions go with it: deployed again, it starts from a clean slate.
    """
    settings = _settings()
    view = read_view(settings)
    apps = linked_apps(view, name, unlink)
    with RegistryWriter(settings) as w:
        for app in apps:  # before the model, so no stage ever sees a link to a missing model
            w.delete(f"link:{app}:{name}")
        w.delete(f"model:{name}")
    for app in apps:
        left = [m for m in view.apps[app].models if m != name]
        click.echo(f"unlinked {name} from {app}" + ("" if left else
                   f" (no model left: {app}'s queries get its default output until one is linked)"))
    click.echo(f"model {name} removed")
    click.echo(_forget_cached(settings, name))


@click.command("remove-app")
@click.argument("name")
@_friendly
def remove_app(name: str) -> None:
    """Remove an app: its links go with it, its queries get 404, and its learnt weights are
    deleted. Its models stay (`remove-model` removes one)."""
    settings = _settings()
    view = read_view(settings)
    app = view.apps.get(name)
    if app is None:
        raise ClipstreamError(f"no app {name!r} in the registry (`clipstream inspect` lists the apps)")
    with RegistryWriter(settings) as w:
        for model in sorted(set(app.models) | set(view.models)):  # unlinked ones leave a record too
            w.delete(f"link:{name}:{model}")
        w.delete(f"app:{name}")
    click.echo(f"app {name} removed; its models stay: {', '.join(app.models) or 'none'}")
    try:
        click.echo(f"{forget_app(sync_client(settings), name)} keys of {name}'s learnt weights deleted")
    except REDIS_AWAY as exc:
        click.echo(f"warning: Redis at CLIPSTREAM_REDIS_URL did not answer ({exc}), so {name}'s learnt weights "
                   f"stay: delete the keys cs:state:{name}:* before registering {name} again")


def linked_apps(view: RegistryView, name: str, unlink: bool) -> list[str]:
    """The apps ``remove-model`` unlinks ``name`` from; refused when there are some and
    ``unlink`` is not given, naming them and both ways on."""
    if view.model(name) is None:
        raise ClipstreamError(f"no model {name!r} in the registry (`clipstream inspect` lists the models)")
    apps = sorted(a.name for a in view.apps.values() if name in a.models)
    if apps and not unlink:
        raise ClipstreamError(f"model {name} is linked to {', '.join(apps)}: unlink it first "
                              f"(clipstream link {apps[0]} {name} --unlink), or give --unlink to unlink it "
                              "from every app in the same change")
    return apps


def _forget_cached(settings: Settings, name: str) -> str:
    """Delete the model's cached predictions and its learnt weights in every app; a Redis away
    is a warning, as the registry change is done, naming what to delete before the model is
    deployed again."""
    try:
        client = sync_client(settings)
        count = forget_model(client, name)
        states = forget_model_weights(client, name)
    except REDIS_AWAY as exc:
        return (f"warning: Redis at CLIPSTREAM_REDIS_URL did not answer ({exc}), so {name}'s cached predictions "
                f"may stay (delete the keys {KEY_PREFIX}{name}:* before deploying {name} again), and the apps "
                f"may keep their learnt weights for {name}")
    return f"{count} cached predictions of {name} deleted; its learnt weights taken out of {states} policy states"


def _rewrite_model(name: str, change: Callable[[ModelConfig], ModelConfig]) -> ModelConfig:
    settings = _settings()
    current = read_view(settings).model(name)
    if current is None:
        raise ClipstreamError(f"no model {name!r} in the registry; deploy it first")
    model = change(current)
    ensure_model_topics(settings, name, model.replicas)
    with RegistryWriter(settings) as w:
        w.model(
            model.name, model.version, model.location or str(model.path), model.replicas,
            previous_versions=list(model.previous_versions),
            previous_paths=list(model.previous_paths),
            retired_versions=list(model.retired_versions),
            retired_paths=list(model.retired_paths),
            latency_objective_ms=model.latency_objective_ms,
            max_batch_size=model.max_batch_size,
            batch_delay_ms=model.batch_delay_ms,
            group=model.group,
        )
    return model


@click.command("set-replicas")
@click.argument("model")
@click.argument("replicas", type=click.IntRange(min=1, max=MAX_REPLICAS))
@WAIT
@_friendly
def set_replicas(model: str, replicas: int, wait: float | None) -> None:
    """Change a model's number of replicas (the batcher spreads batches over them); for a
    group, every member's, as they are served together."""
    settings = _settings()
    view = read_view(settings)
    group = view.groups.get(model) if model not in view.models else None
    for name in [m.name for m in group.members] if group is not None else [model]:
        m = _rewrite_model(name, lambda m: replace(m, replicas=replicas))
    if group is not None:
        ensure_model_topics(settings, model, replicas)
    click.echo(f"{'group' if group is not None else 'model'} {model}: {replicas} replica{'s' if replicas != 1 else ''}")
    if wait is not None:  # a member waits for its group's replicas
        wait_loaded(settings, m.name, m.version, wait)


@click.command("rollback")
@click.argument("model")
@WAIT
@_friendly
def rollback(model: str, wait: float | None) -> None:
    """Go back to the model's previous version."""

    m = _rewrite_model(model, rolled_back)
    click.echo(f"model {model} rolled back to version {m.version}")
    if wait is not None:
        wait_loaded(_settings(), model, m.version, wait)
