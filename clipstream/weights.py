"""An Exp3/Exp4 policy state's weights as an operator reads them: each model's share, weighed
as the version named for it. The selector's gauge and ``inspect`` both show them, and as
sibling stages they cannot import each other."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any


# the weights of this many versions (and models unlinked) left behind are kept per state
KEEP_LEFT_VERSIONS = 16
# the version under which a model unlinked while no version was known is kept
UNVERSIONED = "-"


def left_key(model: str, version: str) -> str:
    """Where a state keeps the log weight of a version of ``model`` it left (``left``)."""
    return f"{model}@{version}"


def keep_newest(left: dict[str, float]) -> dict[str, float]:
    """``left`` without its oldest entries past ``KEEP_LEFT_VERSIONS`` (entries go in last)."""
    while len(left) > KEEP_LEFT_VERSIONS:
        left.pop(next(iter(left)))
    return left


def for_models(state: Mapping[str, Any], models: Sequence[str]) -> dict[str, Any]:
    """``state`` (with ``models`` and ``log_w``) for the app's current ``models``: a model
    unlinked keeps its weight under ``left``, as a version left does, and takes it back when
    linked again; a model never seen starts at the best weight, so that it is tried."""
    old = dict(zip(state["models"], state["log_w"]))
    top = max(old.values(), default=0.0)
    held = state.get("versions") or {}
    left = dict(state.get("left") or {})
    for model, log_w in old.items():
        if model not in models:
            key = left_key(model, held.get(model) or UNVERSIONED)
            left.pop(key, None)  # re-inserted last: the oldest left go first
            left[key] = float(log_w)
    log_w = [float(old[m]) if m in old else float(left.pop(left_key(m, held.get(m) or UNVERSIONED), top))
             for m in models]
    out = dict(state)
    out["models"], out["log_w"] = list(models), log_w
    if left or "left" in state:
        out["left"] = keep_newest(left)
    return out


def without_model(state: Mapping[str, Any], model: str) -> dict[str, Any] | None:
    """``state`` with nothing left of ``model``: its weight, the weights of its versions left,
    the version it was held at; None when it held nothing of it. A model removed from the
    registry starts its versions at 1 again when deployed anew, and must be learnt afresh."""
    models, log_w = state.get("models"), state.get("log_w")
    left, held = state.get("left") or {}, state.get("versions") or {}
    linked = isinstance(models, list) and isinstance(log_w, list) and len(models) == len(log_w) and model in models
    mine = [k for k in left if k.rpartition("@")[0] == model]
    if not linked and not mine and model not in held:
        return None
    out = dict(state)
    if linked:
        keep = [i for i, m in enumerate(models) if m != model]  # type: ignore[union-attr]
        out["models"], out["log_w"] = [models[i] for i in keep], [log_w[i] for i in keep]  # type: ignore[index]
    if mine:
        out["left"] = {k: w for k, w in left.items() if k not in mine}
    if model in held:
        out["versions"] = {m: v for m, v in held.items() if m != model}
    return out


def weight_as(state: Mapping[str, Any], i: int, model: str, version: str | None) -> float:
    """The log weight of ``models[i]`` as ``version``: its own, when the state holds that
    version (or says none); a version left's, kept under ``left``; else its own, as a version
    not seen before starts where its model was."""
    log_w = float(state["log_w"][i])
    held = (state.get("versions") or {}).get(model)
    if version is None or held is None or held == version:
        return log_w
    return float((state.get("left") or {}).get(left_key(model, version), log_w))


def policy_weights(state: Mapping[str, Any] | None, versions: Mapping[str, str | None] | None = None,
                   linked: Sequence[str] | None = None) -> dict[str, float]:
    """Each model's share of the weight in an Exp3/Exp4 state (``models`` + ``log_w``), each
    weighed as its version in ``versions`` when given, and over the app's ``linked`` models
    when given (as the selector selects: the stored state may predate a link or an unlink);
    {} for a state without weights."""
    if not state:
        return {}
    models, log_w = state.get("models"), state.get("log_w")
    if not isinstance(models, list) or not isinstance(log_w, list) or len(models) != len(log_w):
        return {}
    if linked is not None and list(linked) != models:
        state = for_models(state, linked)
        models, log_w = state["models"], state["log_w"]
    if not models:
        return {}
    wanted = versions or {}
    log_w = [weight_as(state, i, m, wanted.get(m)) for i, m in enumerate(models)]
    top = max(log_w)
    exp = [math.exp(w - top) for w in log_w]
    total = sum(exp)
    return {str(m): e / total for m, e in zip(models, exp)}
