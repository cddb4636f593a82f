"""Model selection policies: the built-in ``exp3``, ``exp4`` and ``single``, or a user's own
class named by import path (``pkg.mod:Class``), all behind ``get_policy``."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from clipstream.errors import ConfigError
from selector.policies.base import SelectionPolicy, align_state
from selector.policies.exp3 import Exp3
from selector.policies.exp4 import Exp4
from selector.policies.single import Single

BUILTIN: dict[str, type] = {"exp3": Exp3, "exp4": Exp4, "single": Single}


def get_policy(name: str, config: Mapping[str, Any] | None = None) -> SelectionPolicy:
    """The policy called ``name`` built with ``config`` (the app's policy_config, plus ``kind`` and
    ``labels`` of its outputs). A user class is called with the config if it takes one."""
    config = dict(config or {})
    cls = BUILTIN.get(name)
    if cls is None:
        module_name, sep, attr = name.partition(":")
        if not sep or not module_name or not attr:
            raise ConfigError(f"unknown policy {name!r}: use exp3, exp4, single or 'pkg.module:Class'")
        try:
            cls = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"policy {name!r} cannot be imported: {exc}") from exc
    try:
        policy = cls(config)
    except TypeError:
        policy = cls()
    missing = [m for m in ("init", "select", "combine", "observe") if not callable(getattr(policy, m, None))]
    if missing:
        raise ConfigError(f"policy {name!r} lacks {missing} (see Listing 2: init/select/combine/observe)")
    return policy


__all__ = ["BUILTIN", "Exp3", "Exp4", "SelectionPolicy", "Single", "align_state", "get_policy"]
