"""App files (``clipstream apply -f app.yaml``): apps, models and links, declared together.

Applying is declarative: the app's links become exactly the listed models (earlier links to
other models are switched off), and a model whose version changes keeps its old version for
``rollback``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clipstream.errors import ConfigError
from clipstream.settings import Settings
from clipstream.yamlfile import read_mapping
from registry.repository import Repository, is_url
from registry.spec import TensorSpec, load_spec
from registry.topic import RegistryView, RegistryWriter, read_view
from topics.admin import ensure_model_topics
from topics.catalogue import check_name

POLICIES_BUILTIN = ("exp3", "exp4", "single")
_MODEL_KNOBS = ("latency_objective_ms", "max_batch_size", "batch_delay_ms")


@dataclass
class AppFile:
    apps: list[dict[str, Any]] = field(default_factory=list)
    models: list[dict[str, Any]] = field(default_factory=list)


def load_app_file(path: str | Path, repository: Repository | None = None) -> AppFile:
    """Parse and validate an app file. A model's ``path:`` is a folder relative to the file, or
    a URL; it becomes the location the registry records: relative to ``repository`` when it
    lies inside it, else absolute."""
    path = Path(path)
    repository = repository or Repository()
    raw = read_mapping(path, "app file ", top="`apps:` and `models:`")
    models = []
    inputs: dict[str, list[tuple[str, TensorSpec]]] = {}  # group -> (member, its input spec)
    for i, m in enumerate(raw.get("models") or []):
        if not isinstance(m, dict) or "name" not in m or "path" not in m:
            raise ConfigError(f"{path}: models[{i}] needs `name` and `path`")
        check_name("model", m["name"])
        source = str(m["path"])
        if is_url(source):
            location = repository.location_of(source)
            spec = repository.read_spec(location)  # fail here, not in a worker, when model.yaml is wrong
        else:
            folder = (path.parent / source).resolve()
            spec = load_spec(folder)
            location = repository.location_of(folder)
        if m.get("group") is not None:
            inputs.setdefault(check_name("group", str(m["group"])), []).append((m["name"], spec.input))
        models.append(
            {
                "name": m["name"],
                "version": str(m.get("version", "1")),
                "path": location,
                "replicas": int(m.get("replicas", 1)),
                **{k: m[k] for k in _MODEL_KNOBS if k in m},
                **({"group": str(m["group"])} if m.get("group") is not None else {}),
            }
        )
    names = {m["name"] for m in models}
    _check_groups(path, inputs, names)
    apps = []
    for i, a in enumerate(raw.get("apps") or []):
        if not isinstance(a, dict) or "name" not in a:
            raise ConfigError(f"{path}: apps[{i}] needs `name`")
        check_name("app", a["name"])
        linked = list(a.get("models") or [])
        for m in linked:
            if m not in names:
                raise ConfigError(f"{path}: app {a['name']} links model {m!r}, not under `models:`")
        policy = a.get("policy", "exp4")
        if policy not in POLICIES_BUILTIN and ":" not in policy:
            raise ConfigError(
                f"{path}: app {a['name']}: policy must be exp3, exp4, single or pkg.module:Class"
            )
        apps.append(
            {
                "name": a["name"],
                "policy": policy,
                "slo_ms": float(a.get("slo_ms", 50)),
                "default_output": a.get("default_output"),
                "policy_config": dict(a.get("policy_config") or {}),
                "models": linked,
            }
        )
    return AppFile(apps=apps, models=models)


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
    with RegistryWriter(settings) as writer:
        for m in spec.models:
            m = dict(m)
            current = view.model(m["name"])
            if current is not None and current.version != m["version"]:
                m["previous_versions"] = [*current.previous_versions, current.version]
                m["previous_paths"] = [*current.previous_paths, current.location or str(current.path)]
            elif current is not None:
                m["previous_versions"] = list(current.previous_versions)
                m["previous_paths"] = list(current.previous_paths)
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
