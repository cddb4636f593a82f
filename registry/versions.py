"""Model versions: what a new deployment is called, and which deployments are refused.

A version names one folder for good: ``rollback`` returns to a version by the folder recorded
for it, so a deployment that gave an existing version another folder would make the old one
unreachable and leave the running workers on the old code (docs/design/0092).
"""

from __future__ import annotations

from clipstream.errors import ConfigError
from registry.topic import ModelConfig


def known_versions(current: ModelConfig) -> dict[str, str]:
    """Every version the registry holds for a model, with the location recorded for it."""
    known = dict(zip(current.previous_versions, current.previous_paths))
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


def history(current: ModelConfig | None, version: str) -> dict[str, list[str]]:
    """The rollback history a deployment of ``version`` records: the model's, plus its current
    version when that is another one."""
    if current is None:
        return {"previous_versions": [], "previous_paths": []}
    versions, paths = list(current.previous_versions), list(current.previous_paths)
    if current.version != version:
        versions.append(current.version)
        paths.append(current.location or str(current.path))
    return {"previous_versions": versions, "previous_paths": paths}


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
