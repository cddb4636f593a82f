"""Model versions: what a new deployment is called, and which deployments are refused.

A version names one folder for good: ``rollback`` returns to a version by the folder recorded
for it, so a deployment that gave an existing version another folder would make the old one
unreachable and leave the running workers on the old code (docs/design/0092). A version a
rollback left is kept as retired: its number is never given to other code, whose answers
would otherwise be taken from its cached predictions (docs/design/0098).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from clipstream.errors import ClipstreamError, ConfigError
from registry.spec import ModelSpec
from registry.topic import ModelConfig


def known_versions(current: ModelConfig) -> dict[str, str]:
    """Every version the registry holds for a model, retired ones too, with its location."""
    known = dict(zip(current.retired_versions, current.retired_paths))
    known.update(zip(current.previous_versions, current.previous_paths))
    known[current.version] = current.location or str(current.path)
    return known


def next_version(current: ModelConfig | None) -> str:
    """The version a deployment gets when none is given: 1 for a new model, else one more than
    the highest number the model has had."""
    if current is None:
        return "1"
    known = known_versions(current)
    if not all(v.isdigit() for v in known):
        raise ConfigError(f"model {current.name} has versions that are not numbers "
                          f"({', '.join(sorted(known))}): name the new one with --version")
    return str(max(int(v) for v in known) + 1)


def unpinned_version(current: ModelConfig | None, location: str) -> tuple[str, str]:
    """The version, and its folder, of an app file's model that names no ``version:``: 1 at the
    file's folder for a new model; the version serving now, at its own folder, when the file's
    folder is one the model has had, since ``up`` applies its file at every start and a version
    set since by ``deploy-model`` or ``rollback`` must not be undone by it; else, a new folder,
    the next number."""
    if current is None:
        return "1", location
    if location in known_versions(current).values():
        return current.version, current.location or str(current.path)
    return next_version(current), location


def history(current: ModelConfig | None, version: str, never_served: bool = False) -> dict[str, list[str]]:
    """The history a deployment of ``version`` records: the model's rollback history plus its
    current version when that is another one, and its retired versions; ``version`` itself,
    now current, is in neither (so rollback does not return to the version it leaves).
    ``never_served``: the current version's workers never got ready (batches still go to an
    earlier one), so it is retired rather than made a version to roll back to."""
    if current is None:
        return {"previous_versions": [], "previous_paths": [], "retired_versions": [], "retired_paths": []}
    earlier = list(zip(current.previous_versions, current.previous_paths))
    retired = list(zip(current.retired_versions, current.retired_paths))
    if current.version != version:
        (retired if never_served else earlier).append((current.version, current.location or str(current.path)))
    earlier = [(v, p) for v, p in earlier if v != version]
    retired = [(v, p) for v, p in retired if v != version]
    return {"previous_versions": [v for v, _ in earlier], "previous_paths": [p for _, p in earlier],
            "retired_versions": [v for v, _ in retired], "retired_paths": [p for _, p in retired]}


def rolled_back(current: ModelConfig) -> ModelConfig:
    """The model back at its previous version; the version it leaves is retired, not forgotten."""
    if not current.previous_versions:
        raise ClipstreamError(f"model {current.name} has no earlier version to roll back to; deploy another "
                              f"version with `clipstream deploy-model {current.name} PATH --version V`")
    return replace(
        current,
        version=current.previous_versions[-1],
        location=current.previous_paths[-1],
        path=Path(current.previous_paths[-1]),
        previous_versions=current.previous_versions[:-1],
        previous_paths=current.previous_paths[:-1],
        retired_versions=(*current.retired_versions, current.version),
        retired_paths=(*current.retired_paths, current.location or str(current.path)),
    )


def check_version(current: ModelConfig | None, version: str, location: str, how: str) -> None:
    """Refuse to give an existing version another folder; ``how`` says where a new version is
    named (``--version N`` or the app file's ``version:``)."""
    if current is None:
        return
    recorded = known_versions(current).get(version)
    if recorded is not None and recorded != location:
        raise ConfigError(
            f"model {current.name} version {version} is deployed from {recorded}, not {location}: "
            f"give the new folder a new version ({how}), so that rollback can still return to "
            f"version {version}")


def check_contract(current: ModelConfig | None, version: str, spec: ModelSpec | None) -> None:
    """Refuse a new version whose input, output kind or labels differ from the model's version
    in the registry: the gateway checks queries, and the selector reads answers, by the
    registry's spec, while the earlier version still serves until the new one is ready
    (docs/design/0124). Nothing to compare (a new model, the same version, a spec that cannot
    be read): no check."""
    if current is None or current.spec is None or spec is None or version == current.version:
        return
    old, new = current.spec, spec
    differences = []
    if (old.input.dtype, tuple(old.input.shape)) != (new.input.dtype, tuple(new.input.shape)):
        differences.append(f"takes {new.input.dtype} {list(new.input.shape)} where version {current.version} takes "
                           f"{old.input.dtype} {list(old.input.shape)}")
    if old.output.kind != new.output.kind:
        differences.append(f"answers {new.output.kind} where version {current.version} answers {old.output.kind}")
    elif [str(x) for x in old.output.labels or ()] != [str(x) for x in new.output.labels or ()]:
        differences.append(f"has labels {list(new.output.labels or ())} where version {current.version} has "
                           f"{list(old.output.labels or ())}")
    if differences:
        name = current.name
        raise ConfigError(
            f"model {name} version {version} {'; and '.join(differences)}: every version of a model keeps its "
            f"input and its output's kind and labels, which its callers rely on. Fix version {version}'s "
            f"model.yaml, or serve the changed model under a new name: in the app file, a `models:` entry "
            f"named (say) {name}-new with this folder, and the app's `models:` naming it instead of {name}; "
            f"then `clipstream apply -f FILE`, which moves the app's links at once")

