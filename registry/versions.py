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
    numbers = [int(v) for v in known_versions(current) if v.isdigit()]
    if len(numbers) < len(known_versions(current)):
        raise ConfigError(f"model {current.name} has versions that are not numbers "
                          f"({', '.join(sorted(known_versions(current)))}): name the new one with --version")
    return str(max(numbers) + 1)


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
