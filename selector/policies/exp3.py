"""Exp3 (Clipper 5.1): pick one model per query; learn only from the model that answered.

p_i = (1 - gamma) * s_i / sum_j s_j + gamma / k, and after feedback the chosen model's weight
s_i <- s_i * exp(-eta * L / p_i). Dividing by p_i makes the loss estimate unbiased for models
that are rarely tried; gamma keeps every model tried now and then. Weights live in log space.
p_i is the probability the model was chosen with (the answer's confidence), not the one the
weights give when the feedback comes: when the lead changes while feedback is on its way, the
old leader's losses would otherwise be divided by its new, small probability and sink it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from selector.losses import model_loss
from selector.policies.base import cfg_float, softmax, uniform_draw, weights_state, with_weights
from selector.types import Feedback, Output, Query, State


class Exp3:
    """The single-model selection policy."""

    name = "exp3"

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        config = dict(config or {})
        self.eta = cfg_float(config, "eta", 0.1, lo=0.0)
        self.gamma = cfg_float(config, "gamma", 0.05, lo=0.0, hi=1.0)
        self.max_log_ratio = cfg_float(config, "max_log_ratio", 10.0, lo=0.0)
        self.loss_scale = cfg_float(config, "loss_scale", 1.0, lo=0.0)
        self.seed = int(cfg_float(config, "seed", 0.0))
        self.kind = str(config.get("kind", "label"))

    def init(self, models: list[str]) -> State:
        return weights_state(self.name, models)

    def probabilities(self, state: State) -> list[float]:
        """p_i, mixing the weights with uniform exploration at rate gamma."""
        k = len(state["models"])
        if k == 0:
            return []
        return [(1.0 - self.gamma) * q + self.gamma / k for q in softmax(state["log_w"])]

    def select(self, state: State, query: Query) -> list[str]:
        models = state["models"]
        if not models:
            return []
        u = uniform_draw(query.query_id, self.seed)
        acc = 0.0
        for model, p in zip(models, self.probabilities(state)):
            acc += p
            if u < acc:
                return [model]
        return [models[-1]]

    def combine(self, state: State, query: Query, predictions: dict[str, Output]) -> tuple[Output, float]:
        """The chosen model's answer; confidence is the probability Exp3 gives that model (how
        sure the bandit is that this is the best one)."""
        if not predictions:
            return Output(None), 0.0
        probs = dict(zip(state["models"], self.probabilities(state)))
        model = max(predictions, key=lambda m: probs.get(m, 0.0))
        return predictions[model], probs.get(model, 0.0)

    def observe(self, state: State, query: Query, feedback: Feedback, predictions: dict[str, Output]) -> State:
        models = state["models"]
        probs = self.probabilities(state)
        chosen = self._chosen_p(feedback, len(models))
        log_w = list(state["log_w"])
        for model, output in predictions.items():
            if model not in models:
                continue
            loss = model_loss(output, feedback, self.kind, self.loss_scale)
            if loss is None:
                continue
            i = models.index(model)
            p = chosen if chosen is not None and len(predictions) == 1 else probs[i]
            log_w[i] -= self.eta * loss / p
        out = with_weights(state, log_w, self.max_log_ratio)
        out["n_observed"] = int(state.get("n_observed", 0)) + 1
        return out

    def _chosen_p(self, feedback: Feedback, k: int) -> float | None:
        """The probability the answering model was chosen with, when the feedback carries one
        Exp3 could have given (at least gamma / k); None to use today's weights."""
        p = feedback.confidence
        if p is None or k == 0 or not self.gamma / k - 1e-12 <= p <= 1.0:
            return None
        return float(p)
