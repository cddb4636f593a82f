"""What ``inspect`` shows beside the registry: the version each replica's batches carry now,
whether a replica has each model loaded, and each app's learnt weights; and ``--wait``'s watch
of a version loading. Each is read from where the pipeline keeps it (the last record of each
batches partition, the workers' word and the policy state in Redis), not from the registry,
which says only what is wanted."""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import click
from confluent_kafka import KafkaException

from clipstream.loaded import key_of as loaded_key
from clipstream.errors import ClipstreamError
from clipstream.loaded import devices, rollout, unready
from clipstream.redisclient import REDIS_AWAY, policy_state_key, sync_client
from clipstream.settings import Settings
from clipstream.weights import policy_weights
from registry.topic import RegistryView, read_view
from topics.catalogue import Catalogue
from topics.tail import served_versions


def serving(settings: Settings, view: RegistryView) -> dict[str, dict[int, str | None]]:
    """Model or group name -> replica -> the version its batches carry now (``served``)."""
    wanted = {n: m.replicas for n, m in view.models.items() if not m.group}
    wanted.update({n: g.replicas for n, g in view.groups.items()})
    out = {name: served(settings, name, replicas) for name, replicas in wanted.items()}
    return {name: versions for name, versions in out.items() if versions is not None}


def served(settings: Settings, name: str, replicas: int) -> dict[int, str | None] | None:
    """Replica -> the version the batches of model (or group) ``name`` carry now: the last record
    of each partition of its batches topic, a batch or a handover. The registry's version serves
    only once its workers are ready (docs/design/0021). A replica whose last record retired it
    (an earlier scale-down) has served nothing since. None: Kafka could not say."""
    try:
        return served_versions(settings, Catalogue.from_settings(settings).batches(name).name, replicas)
    except KafkaException as exc:
        click.echo(f"warning: the batches of {name} could not be read ({exc.args[0]}): what serves is not known",
                   err=True)
        return None


def serving_text(version: str | None, replicas: int, now: dict[int, str | None] | None,
                 running: bool = True, loaded: Collection[int] = (), failed: bool = False) -> str:
    """`` serving=...`` for ``inspect``'s line, saying which replicas wait for a first batch:
    those in ``loaded`` (their worker said it has the version loaded) only wait for traffic.
    Not ``running`` (no worker of it has said it is loaded): the batches are history, so the
    text is ``last served=`` and says nothing of what is on its way."""
    if now is None:
        return ""
    versions = sorted({v or "-" for v in now.values()})
    if not versions:
        return " serving=none (no batch sent yet)"
    if not running:
        return " last served=" + ",".join(versions)
    text = " serving=" + ",".join(versions)
    if versions != [version or "-"] and failed:  # the line's end says why
        text += f" (version {version} did not load)"
    elif versions != [version or "-"]:
        text += f" (not yet version {version}: its workers are not ready, see `clipstream up`'s output)"
    idle = [r for r in range(replicas) if r not in now]
    ready = [str(r) for r in idle if r in loaded]
    starting = [str(r) for r in idle if r not in loaded]
    if ready:
        text += f" (replica {', '.join(ready)}: loaded, no batch sent to it yet)"
    if starting:
        text += f" (replica {', '.join(starting)}: no batch yet, its worker may still be starting)"
    return text


def loaded_everywhere(replicas: list[list[int] | None]) -> set[int]:
    """A group's replicas that have every member model loaded."""
    return set.intersection(*(set(r or ()) for r in replicas)) if replicas else set()


@dataclass(frozen=True)
class Loaded:
    """What a model's workers say (``clipstream.loaded``), as ``inspect`` shows it."""

    why_not: str | None  # why no replica can answer; None: one has a version loaded now
    failed: str | None  # why a replica did not load the registry's version; None: none said so
    devices: list[str]  # where the replicas that have a version loaded run it
    replicas: list[int]  # the replicas that have the registry's version loaded now


def loaded_state(settings: Settings, view: RegistryView) -> dict[str, Loaded]:
    """Model -> its workers' word; {} with a warning when Redis does not answer."""
    names = sorted(view.models)
    if not names:
        return {}
    client = sync_client(settings)
    try:
        said = [client.hgetall(loaded_key(settings.topic_prefix, name)) for name in names]
    except REDIS_AWAY as exc:
        click.echo(f"warning: Redis did not answer ({exc}): whether the models are loaded is not shown", err=True)
        return {}
    finally:
        client.close()
    now = time.time()
    out = {}
    for name, fields in zip(names, said):
        m = view.models[name]
        ready, failed = rollout(fields, m.version, m.replicas, now, since_s=0.0)
        out[name] = Loaded(unready(name, fields, now, m.version), failed, devices(fields, now), ready)
    return out


def weights(settings: Settings, view: RegistryView) -> dict[str, tuple[dict[str, float], int]]:
    """App -> (model -> its share of the app's global policy weight, the feedbacks it was learnt
    from), for the apps that have learnt any (Exp3, Exp4); {} with a warning when Redis does
    not answer."""
    apps = [name for name, app in view.apps.items() if app.policy != "single" and app.models]
    if not apps:
        return {}
    client = sync_client(settings)
    try:
        raw = client.mget([policy_state_key(app, None) for app in apps])
    except REDIS_AWAY as exc:
        click.echo(f"warning: Redis did not answer ({exc}): the learnt weights are not shown", err=True)
        return {}
    finally:
        client.close()
    versions = {name: m.version for name, m in view.models.items()}
    return {app: learnt for app, value in zip(apps, raw)
            if value and (learnt := _shares(value, versions, view.apps[app].models))[0]}


def _shares(value: bytes | str, versions: dict[str, str], linked: Sequence[str]) -> tuple[dict[str, float], int]:
    """Each model's share of a stored Exp3/Exp4 state over the app's ``linked`` models, as the
    selector weighs them: each as the version ``versions`` names (the state may hold another's,
    the last that learnt), and a model linked or unlinked since the state was stored as the
    selector aligns it. With the count of feedbacks; ({}, 0) for another policy's."""
    try:
        state = json.loads(value)
        shares = policy_weights(state, versions, linked)
        observed = int(state.get("n_observed") or 0)
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}, 0
    return {m: round(w, 4) for m, w in shares.items()}, observed


def failed_to_load(settings: Settings, model: str, version: str, replicas: int) -> str | None:
    """Why a replica of ``model`` said it failed to load ``version``; None when none said so,
    as while its workers still load it, or when Redis cannot say."""
    client = sync_client(settings)
    try:
        _, failed = rollout(client.hgetall(loaded_key(settings.topic_prefix, model)), version, replicas,
                            time.time(), 0.0)
    except REDIS_AWAY:
        return None
    finally:
        client.close()
    return failed


def wait_loaded(settings: Settings, model: str, version: str, timeout_s: float) -> None:
    """``--wait``: until every replica that serves ``model`` (its group's, for a member) says it
    has ``version`` loaded, saying how far it got every few seconds; a ClipstreamError when a
    replica says it failed to load it, or at the timeout."""
    since = time.time() - 1.0
    view = read_view(settings)
    config = view.served().get(view.models[model].group or model) if model in view.models else None
    if config is None:
        raise ClipstreamError(f"model {model} is not in the registry any more: nothing to wait for")
    key, replicas = loaded_key(settings.topic_prefix, model), config.replicas
    deadline, told = time.monotonic() + timeout_s, 0.0
    client = sync_client(settings)
    try:
        while True:
            try:
                ready, failed = rollout(client.hgetall(key), version, replicas, time.time(), since)
            except REDIS_AWAY as exc:
                ready, failed = [], None
                click.echo(f"waiting: Redis did not answer ({exc}); asking again", err=True)
            if failed is not None:
                raise ClipstreamError(
                    f"model {model} version {version}: {failed}. The version that served before, if one did, "
                    f"keeps its batches; deploy a fixed folder as a new version, or `clipstream rollback {model}`")
            if len(ready) == replicas:
                click.echo(f"model {model} version {version}: loaded on {replicas} of {replicas} replicas")
                return
            if time.monotonic() >= deadline:
                raise ClipstreamError(
                    f"model {model} version {version}: loaded on {len(ready)} of {replicas} replicas after "
                    f"{timeout_s:g} s. Is `clipstream up` running? It starts each version's workers, and its "
                    f"output says what each does; `clipstream inspect` shows what serves")
            if time.monotonic() - told >= 5.0:
                told = time.monotonic()
                click.echo(f"waiting: model {model} version {version} loaded on {len(ready)} of {replicas} replicas")
            time.sleep(0.5)
    finally:
        client.close()
