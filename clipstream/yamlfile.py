"""Reading a YAML file that must hold a mapping (app files, ``model.yaml``): every problem is a
``ConfigError`` that names the file, so a user knows which one to fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from clipstream.errors import ConfigError


def read_mapping(path: Path, label: str = "", missing_hint: str = "", top: str = "a mapping") -> dict[str, Any]:
    """The file's top-level mapping; ``label`` prefixes the path in messages ("app file ")."""
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{label}{path} does not exist{missing_hint}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{label}{path} is not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{label}{path}: expected {top} at the top")
    return raw
