"""App files (``clipstream apply -f app.yaml``): apps, models and links, declared together.

Applying is declarative: the app's links become exactly the listed models (earlier links to
other models are switched off), and a model whose version changes keeps its old version for
``rollback``.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from types import SimpleNamespace
from pathlib import Path
from typing import Any

from clipstream.errors import ConfigError
from clipstream.settings import Settings
from clipstream.yamlfile import read_mapping
from registry.groups import name_clash
from registry.repository import Repository, is_url
from registry.labels import join_problem
from registry.limits import check_knob, check_replicas, check_slo
from registry.spec import ModelSpec, TensorSpec, load_spec
from registry.topic import NEW_APP_POLICY, NEW_APP_SLO_MS, RegistryView, RegistryWriter, read_view
from registry.versions import check_contract, check_version, history, unpinned_version
from topics.admin import ensure_model_topics
from topics.catalogue import check_name

POLICIES_BUILTIN = ("exp3", "exp4", "single")
_MODEL_KNOBS = ("latency_objective_ms", "max_batch_size", "batch_delay_ms")
_FILE_KEYS = ("apps", "models")
_MODEL_KEYS = ("name", "version", "path", "replicas", "group", *_MODEL_KNOBS)
_APP_KEYS = ("name", "policy", "slo_ms", "default_output", "policy_config", "models")


@dataclass
class AppFile:
    apps: list[dict[str, Any]] = field(default_factory=list)
    models: list[dict[str, Any]] = field(default_factory=list)
    specs: dict[str, ModelSpec] = field(default_factory=dict)  # model -> its model.yaml, as read


def check_policy(policy: object, what: str = "policy") -> str:
    """``policy`` when it names one (shared by app files and ``register-app``, so both refuse
    the same names); ``what`` says where it came from in the message."""
    if isinstance(policy, str) and (policy in POLICIES_BUILTIN or ":" in policy):
        return policy
    raise ConfigError(f"{what} must be exp3, exp4, single or pkg.module:Class, not {policy!r}")


def check_default_output(value: object, what: str = "default_output") -> Any:
    """``value`` when the App record can hold it (null, bool, int, float, string): a list or a
    mapping would otherwise fail later, in the Avro encode, with no word of which field."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ConfigError(f"{what} must be null, a boolean, a number or a string, not {value!r}")


def _number(value: object, what: str, integer: bool = False) -> int | float:
    """``value`` when it is a finite number (an int when ``integer``): YAML's ``fast`` or
    ``true`` would otherwise pass to ``float()`` or the Avro encode and end in a traceback."""
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)) or (
        isinstance(value, float) and not math.isfinite(value)
    ):
        hint = ""
        if isinstance(value, str):
            try:
                float(value)
                hint = " (YAML reads an exponent without a dot and a sign as text: write 1.0e+12, or the digits)"
            except ValueError:
                pass
        raise ConfigError(f"{what} must be {'an integer' if integer else 'a number'}, not {value!r}{hint}")
    return value


def _list(value: object, what: str) -> list[Any]:
    """``value`` as a list (missing or null: empty); anything else is named, not iterated."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigError(f"{what} must be a list, not {value!r}")
    return value


def _known_keys(entry: dict[str, Any], known: tuple[str, ...], where: str) -> None:
    """Refuse a key the file format does not have: a misspelt ``replicas`` would otherwise be
    ignored, and the default applied without a word."""
    for key in entry:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean `{close[0]}`? " if close else ""
            raise ConfigError(f"{where}: unknown key `{key}`; {hint}the keys are {', '.join(known)}")


def load_app_file(path: str | Path, repository: Repository | None = None) -> AppFile:
    """Parse and validate an app file. A model's ``path:`` is a folder relative to the file, or
    a URL; it becomes the location the registry records: relative to ``repository`` when it
    lies inside it, else absolute."""
    path = Path(path)
    repository = repository or Repository()
    raw = read_mapping(path, "app file ", top="`apps:` and `models:`")
    _known_keys(raw, _FILE_KEYS, str(path))
    inputs: dict[str, list[tuple[str, TensorSpec]]] = {}  # group -> (member, its input spec)
    specs: dict[str, ModelSpec] = {}
    models = [_model_entry(path, i, m, repository, inputs, specs)
              for i, m in enumerate(_list(raw.get("models"), f"{path}: models"))]
    names = {m["name"] for m in models}
    _check_groups(path, inputs, names)
    apps = [_app_entry(path, i, a, names) for i, a in enumerate(_list(raw.get("apps"), f"{path}: apps"))]
    view = SimpleNamespace(models={n: SimpleNamespace(spec=spec) for n, spec in specs.items()})
    for app in apps:
        for k, model in enumerate(app["models"]):
            problem = join_problem(view, app["models"][:k], model)
            if problem is not None:
                raise ConfigError(f"{path}: app {app['name']} links model {model}, but {problem}")
    return AppFile(apps=apps, models=models, specs=specs)


def _model_entry(path: Path, i: int, m: Any, repository: Repository,
                 inputs: dict[str, list[tuple[str, TensorSpec]]], specs: dict[str, ModelSpec]) -> dict[str, Any]:
    """``models[i]`` as the registry records it. Its ``model.yaml`` is read here, so a wrong
    spec fails the command, not a worker; a group member's input spec goes into ``inputs``."""
    if not isinstance(m, dict) or "name" not in m or "path" not in m:
        raise ConfigError(f"{path}: models[{i}] needs `name` and `path`")
    _known_keys(m, _MODEL_KEYS, f"{path}: models[{i}] ({m['name']})")
    check_name("model", m["name"])
    source = str(m["path"])
    if is_url(source):
        location = repository.location_of(source)
        spec = repository.read_spec(location)
    elif (folder := (path.parent / source).resolve()).is_dir():
        spec = load_spec(folder)
        location = repository.location_of(folder)
    elif repository.root is not None:  # a place in the model repository, as deploy-model takes one
        location = source
        spec = repository.read_spec(location)
    else:
        raise ConfigError(f"{path}: models[{i}] ({m['name']}): no folder {folder} to hold its model.yaml "
                          "(a model's `path` is relative to the app file, a place in CLIPSTREAM_MODEL_REPOSITORY "
                          "when that is set, or a URL)")
    specs[m["name"]] = spec
    if m.get("group") is not None:
        inputs.setdefault(check_name("group", str(m["group"])), []).append((m["name"], spec.input))
    return {
        "name": m["name"],
        "version": str(m["version"]) if m.get("version") is not None else None,  # None: ``unpinned_version``
        "path": location,
        # None: the registry's count (``set-replicas``'), or 1 for a new model (``apply_file``)
        "replicas": check_replicas(int(_number(m["replicas"], f"{path}: models[{i}].replicas", integer=True)),
                                   f"{path}: models[{i}].replicas") if m.get("replicas") is not None else None,
        **{k: check_knob(k, _number(m[k], f"{path}: models[{i}].{k}", integer=k == "max_batch_size"),
                         f"{path}: models[{i}].{k}")
           for k in _MODEL_KNOBS if m.get(k) is not None},
        **({"group": str(m["group"])} if m.get("group") is not None else {}),
    }


def _app_entry(path: Path, i: int, a: Any, names: set[str]) -> dict[str, Any]:
    """``apps[i]`` as the registry records it; it may link only models the file declares."""
    if not isinstance(a, dict) or "name" not in a:
        raise ConfigError(f"{path}: apps[{i}] needs `name`")
    _known_keys(a, _APP_KEYS, f"{path}: apps[{i}] ({a['name']})")
    check_name("app", a["name"])
    linked = _list(a.get("models"), f"{path}: apps[{i}].models")
    missing = [m for m in linked if not isinstance(m, str) or m not in names]
    if missing:  # every one at once: a file with no `models:` lacks them all
        them, it = ", ".join(map(repr, missing)), "it" if len(missing) == 1 else "them"
        links = "; ".join(f"clipstream link {a['name']} {m}" for m in missing)
        raise ConfigError(f"{path}: app {a['name']} links model{'s' * (len(missing) > 1)} {them}, not under "
                          f"`models:`: add {it} there with {'its path' if it == 'it' else 'their paths'}, or drop "
                          f"{it} from the app's models and run `{links}`")
    policy_config = a.get("policy_config") or {}
    if not isinstance(policy_config, dict):
        raise ConfigError(f"{path}: apps[{i}].policy_config must be a mapping of names to numbers, "
                          f"not {policy_config!r}")
    return {
        "name": a["name"],
        "policy": check_policy(a.get("policy", NEW_APP_POLICY), f"{path}: apps[{i}].policy"),
        "slo_ms": check_slo(float(_number(a.get("slo_ms", NEW_APP_SLO_MS), f"{path}: apps[{i}].slo_ms")), f"{path}: apps[{i}].slo_ms"),
        "default_output": check_default_output(a.get("default_output"), f"{path}: apps[{i}].default_output"),
        "policy_config": {k: _number(v, f"{path}: apps[{i}].policy_config.{k}") for k, v in policy_config.items()},
        "models": linked,
    }


def _check_groups(path: Path, inputs: dict[str, list[tuple[str, TensorSpec]]], names: set[str]) -> None:
    """A group is served as one model: its name is its topics', and every member reads the
    batch's one stacked input."""
    for group, members in inputs.items():
        if group in names:
            raise ConfigError(f"{path}: group {group!r} has the name of a model; give the group its own")
        first, spec = members[0]
        for name, other in members[1:]:
            if other != spec:
                raise ConfigError(f"{path}: group {group!r}: model {name} takes {other}, but {first} takes "
                                  f"{spec}; a group's models must take the same input")


def apply_file(settings: Settings, path: str | Path, view: RegistryView | None = None) -> AppFile:
    """Publish an app file to the registry and create each model's topics."""
    spec = load_app_file(path, Repository.from_settings(settings))
    view = view if view is not None else read_view(settings)
    for m in spec.models:
        if m["version"] is None:
            m["version"], m["path"] = unpinned_version(view.model(m["name"]), m["path"])
        if m["replicas"] is None:  # unnamed: what `set-replicas` last set stays
            current = view.model(m["name"])
            m["replicas"] = current.replicas if current is not None else 1
    clash = name_clash(view, {m["name"]: m.get("group") for m in spec.models})
    if clash is not None:
        raise ConfigError(f"{path}: {clash}")
    for m in spec.models:  # all checked before anything is written
        check_version(view.model(m["name"]), m["version"], m["path"], f"`version:` in {path}")
        check_contract(view.model(m["name"]), m["version"], spec.specs.get(m["name"]))
    with RegistryWriter(settings) as writer:
        for m in spec.models:
            m = {**m, **history(view.model(m["name"]), m["version"])}
            ensure_model_topics(settings, m["name"], m["replicas"])
            if m.get("group"):
                ensure_model_topics(settings, m["group"], m["replicas"])
            writer.model(**m)
        for a in spec.apps:
            a = dict(a)
            linked = a.pop("models")
            writer.app(**a)
            old = view.app(a["name"])
            for model in old.models if old else ():
                if model not in linked:
                    writer.link(a["name"], model, linked=False)
            for model in linked:
                writer.link(a["name"], model)
    return spec
