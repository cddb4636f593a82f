"""The selection policy interface (Clipper Listing 2) and what the bandit policies share.

A policy object holds only its configuration; everything it learns lives in ``State`` (a
JSON-able dict), so one policy object serves every context of an app and the state can be
kept in Redis and updated atomically by many learners (5.3).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from clipstream.errors import ConfigError
from clipstream.weights import for_models, keep_newest, left_key
from selector.types import Feedback, Output, Query, State


@runtime_checkable
class SelectionPolicy(Protocol):
    """Listing 2: init, select, combine, observe."""

    def init(self, models: list[str]) -> State: ...

    def select(self, state: State, query: Query) -> list[str]: ...

    def combine(self, state: State, query: Query, predictions: dict[str, Output]) -> tuple[Output, float]: ...

    def observe(
        self, state: State, query: Query, feedback: Feedback, predictions: dict[str, Output]
    ) -> State: ...


def cfg_float(config: Mapping[str, Any], key: str, default: float, lo: float | None = None, hi: float | None = None) -> float:
    """A float knob from the app's policy_config, checked, so a typo fails at load and not mid-stream."""

    try:
        value = float(config.get(key, default))
    except (TypeError, ValueError):
        raise ConfigError(f"policy_config.{key} must be a number, got {config.get(key)!r}") from None
    if (lo is not None and value < lo) or (hi is not None and value > hi) or math.isnan(value):
        raise ConfigError(f"policy_config.{key}={value} is outside [{lo}, {hi}]")
    return value


def uniform_draw(query_id: str, seed: int = 0) -> float:
    """A uniform number in [0, 1) from the query id: select is reproducible and needs no RNG state
    (select never writes the state back, so a counter-based RNG in the state would not advance)."""
    digest = hashlib.blake2b(f"{seed}:{query_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0**64


def weights_state(name: str, models: Sequence[str]) -> State:
    """Every model starts with weight 1 (log weight 0), as in Exp3/Exp4."""
    return {"policy": name, "models": list(models), "log_w": [0.0] * len(models), "n_observed": 0}


def normalise(log_w: list[float], max_log_ratio: float) -> list[float]:
    """Shift log weights so the best is 0 and floor them at -max_log_ratio.

    The shift keeps them bounded forever (no overflow/underflow after millions of updates); the
    floor keeps a failed model within reach so it can win back once it recovers (Figure 8).
    """
    if not log_w:
        return log_w
    top = max(log_w)
    return [max(w - top, -max_log_ratio) for w in log_w]


def with_weights(state: State, log_w: list[float], max_log_ratio: float) -> State:
    """A copy of ``state`` with ``log_w`` normalised, and the weights of the versions left
    (``align_state``) shifted by as much: all stay in one frame, so a version rolled back to
    comes back as far ahead of (or behind) the others as its own answers put it, within
    ``max_log_ratio`` either way."""
    out = dict(state)
    out["log_w"] = normalise(log_w, max_log_ratio)
    left = state.get("left")
    if left and log_w:
        top = max(log_w)
        out["left"] = {k: min(max(w - top, -max_log_ratio), max_log_ratio) for k, w in left.items()}
    return out


def softmax(log_w: Sequence[float]) -> list[float]:
    if not log_w:
        return []
    top = max(log_w)
    ex = [math.exp(w - top) for w in log_w]
    total = sum(ex)
    return [e / total for e in ex]


def align_state(policy: SelectionPolicy, state: State | None, models: Sequence[str],
                versions: Mapping[str, str | None] | None = None) -> State:
    """The state for the app's current models (``clipstream.weights.for_models``): a model
    linked since starts at the best weight (so it is tried), or at its own when it was linked
    before; a user policy's own state is left alone.

    ``versions``: the version of each model the weights are wanted for (those serving, or
    those that answered). Each version of a model has weights of its own: a version left keeps
    its weight in the state, and a version seen before takes its own back, so a rollback does
    not have to learn the old version again, nor does a broken version's answers teach it. A
    version not seen before starts where its model was."""
    models = list(models)
    if state is None:
        state = policy.init(models)
    if "models" not in state or "log_w" not in state:
        return state
    if state["models"] != models:
        state = for_models(state, models)
    return as_versions(state, versions)


def as_versions(state: State | None, versions: Mapping[str, str | None] | None) -> State | None:
    """``state`` with each model's weight that of its version in ``versions`` (a version of
    None: as it is); a state without weights (a user policy's own) as it is."""
    if not versions or not state or "models" not in state or "log_w" not in state:
        return state
    held = state.get("versions") or {}
    moves = [(m, v) for m, v in versions.items() if v is not None and held.get(m) != v and m in state["models"]]
    if not moves:
        return state
    out = dict(state)
    held, left, log_w = dict(held), dict(state.get("left") or {}), list(state["log_w"])
    for model, version in moves:
        i = state["models"].index(model)
        was = held.get(model)
        if was is not None:
            left.pop(left_key(model, was), None)  # re-inserted last: the oldest left go first
            left[left_key(model, was)] = log_w[i]
        log_w[i] = float(left.pop(left_key(model, version), log_w[i]))
        held[model] = version
    out["versions"], out["left"], out["log_w"] = held, keep_newest(left), log_w
    return out
