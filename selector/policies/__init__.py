"""Model selection policies: the built-in ``exp3``, ``exp4`` and ``single``, or an operator's own
class named by import path (``pkg.mod:Class``), all behind ``get_policy``.

An ``App`` record names its policy, and anyone who can write to the registry topic writes App
records, so a name is never imported on the record's say-so: only the built-ins and the import
paths the selector's operator allows (``CLIPSTREAM_SELECTOR_POLICY_IMPORTS``) are built
(docs/design/0029-policies-by-name-and-allow-list.md).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from typing import Any

from clipstream.errors import ConfigError
from selector.policies.base import SelectionPolicy, align_state, as_versions
from selector.policies.exp3 import Exp3
from selector.policies.exp4 import Exp4
from selector.policies.single import Single

BUILTIN: dict[str, type] = {"exp3": Exp3, "exp4": Exp4, "single": Single}


def policy_class(name: str, allowed: Iterable[str] = ()) -> type:
    """The class of the policy called ``name``: a built-in, or an import path listed in
    ``allowed`` (exactly as written there). Anything else is a ConfigError that says why,
    before any module is imported."""
    cls = BUILTIN.get(name)
    if cls is not None:
        return cls
    if name not in set(allowed):
        raise ConfigError(f"policy {name!r} refused: not one of {sorted(BUILTIN)} and not in the selector's "
                          "allow-list (CLIPSTREAM_SELECTOR_POLICY_IMPORTS)")
    module_name, sep, attr = name.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"unknown policy {name!r}: use exp3, exp4, single or 'pkg.module:Class'")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"policy {name!r} cannot be imported: {exc}") from exc
    if not isinstance(cls, type):
        raise ConfigError(f"policy {name!r} is not a class")
    return cls


def get_policy(name: str, config: Mapping[str, Any] | None = None, allowed: Iterable[str] = ()) -> SelectionPolicy:
    """The policy called ``name`` built with ``config`` (the app's policy_config, plus ``kind`` and
    ``labels`` of its outputs); ``allowed``: the import paths the operator allows besides the
    built-ins. A user class is called with the config if it takes one."""
    config = dict(config or {})
    cls = policy_class(name, allowed)
    try:
        policy = cls(config)
    except TypeError:
        policy = cls()
    missing = [m for m in ("init", "select", "combine", "observe") if not callable(getattr(policy, m, None))]
    if missing:
        raise ConfigError(f"policy {name!r} lacks {missing} (see Listing 2: init/select/combine/observe)")
    return policy


# built-in policies whose select and combine never read learned state (``single`` counts
# feedback only); any policy may say so itself with a ``stateless`` attribute
STATELESS_POLICIES: tuple[type, ...] = (Single,)


def is_stateless(policy: Any) -> bool:
    """True when select/combine need no stored state, so dispatch skips Redis for it.

    A policy's own ``stateless`` attribute decides; otherwise only the built-ins listed above
    are stateless (a user's policy is assumed to need its state)."""
    flag = getattr(policy, "stateless", None)
    if flag is not None:
        return bool(flag)
    return type(policy) in STATELESS_POLICIES


__all__ = ["BUILTIN", "STATELESS_POLICIES", "Exp3", "Exp4", "SelectionPolicy", "Single", "align_state", "as_versions", "get_policy",
           "is_stateless", "policy_class"]
