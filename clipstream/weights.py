"""An Exp3/Exp4 policy state's weights as an operator reads them: each model's share, weighed
as the version named for it. The selector's gauge and ``inspect`` both show them, and as
sibling stages they cannot import each other."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def left_key(model: str, version: str) -> str:
    """Where a state keeps the log weight of a version of ``model`` it left (``left``)."""
    return f"{model}@{version}"


def weight_as(state: Mapping[str, Any], i: int, model: str, version: str | None) -> float:
    """The log weight of ``models[i]`` as ``version``: its own, when the state holds that
    version (or says none); a version left's, kept under ``left``; else its own, as a version
    not seen before starts where its model was."""
    log_w = float(state["log_w"][i])
    held = (state.get("versions") or {}).get(model)
    if version is None or held is None or held == version:
        return log_w
    return float((state.get("left") or {}).get(left_key(model, version), log_w))


def policy_weights(state: Mapping[str, Any] | None,
                   versions: Mapping[str, str | None] | None = None) -> dict[str, float]:
    """Each model's share of the weight in an Exp3/Exp4 state (``models`` + ``log_w``), each
    weighed as its version in ``versions`` when given; {} for a state without weights."""
    if not state:
        return {}
    models, log_w = state.get("models"), state.get("log_w")
    if not isinstance(models, list) or not isinstance(log_w, list) or len(models) != len(log_w) or not models:
        return {}
    wanted = versions or {}
    log_w = [weight_as(state, i, m, wanted.get(m)) for i, m in enumerate(models)]
    top = max(log_w)
    exp = [math.exp(w - top) for w in log_w]
    total = sum(exp)
    return {str(m): e / total for m, e in zip(models, exp)}
