"""``GET /v1/apps/{app}``: what an app takes and answers, for callers who cannot run
``clipstream inspect`` (which needs Kafka), as Triton's and KServe's model metadata routes
serve theirs."""

from __future__ import annotations

from typing import Any

from frontend.state import GatewayState


def app_metadata(state: GatewayState, name: str) -> dict[str, Any]:
    """The app's policy, SLO and default, the input the gateway checks a predict against (its
    first model's), what its answers are, and its models at their registry versions; a 404
    for an app not in the registry."""
    cfg = state.app_config(name)
    spec = state.input_spec(cfg)
    kind, labels = state.outputs(cfg)
    view = state.registry.view() if state.registry is not None else None
    models = [{"name": m, "version": view.models[m].version} for m in cfg.models
              if view is not None and m in view.models]
    return {
        "name": cfg.name,
        "policy": cfg.policy,
        "slo_ms": cfg.slo_ms,
        "default_output": cfg.default_output,
        "input": {"dtype": spec.dtype, "shape": list(spec.shape)} if spec is not None else None,
        "output": {"kind": kind, "labels": [str(label) for label in labels] if labels else None},
        "models": models,
    }
