"""Exp4 (Clipper 5.2): ask every model, answer with the weighted combination, learn from all.

- combine: weighted average of the models' class scores (a label-kind model counts as a one-hot
  vector over the app's labels) or of their values (regression); weights are the softmax of the
  log weights over the models that answered, which is the paper's "substitute missing
  predictions with their average value".
- confidence (5.2.1-5.2.2): the fraction of the app's linked models whose own answer equals the
  combined answer. A straggler has no answer, so it does not agree: a late ensemble answers with
  lower confidence.
- observe: every model's weight by its own loss, w_i <- w_i * exp(-eta * L_i), in log space.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from selector.losses import agrees, model_loss
from selector.policies.base import cfg_float, softmax, weights_state, with_weights
from selector.types import Feedback, Output, Query, State, plain, same_label


class Exp4:
    """The ensemble model selection policy."""

    name = "exp4"

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        config = dict(config or {})
        self.eta = cfg_float(config, "eta", 0.1, lo=0.0)
        self.max_log_ratio = cfg_float(config, "max_log_ratio", 10.0, lo=0.0)
        self.loss_scale = cfg_float(config, "loss_scale", 1.0, lo=0.0)
        # regression answers "agree" when this close (default: a tenth of the loss scale)
        self.agree_tolerance = cfg_float(config, "agree_tolerance", 0.1 * self.loss_scale, lo=0.0)
        self.kind = str(config.get("kind", "label"))
        labels = config.get("labels")
        self.labels: tuple[Any, ...] | None = tuple(labels) if labels else None

    def init(self, models: list[str]) -> State:
        return weights_state(self.name, models)

    def select(self, state: State, query: Query) -> list[str]:
        return list(state["models"])

    def weights(self, state: State) -> dict[str, float]:
        return dict(zip(state["models"], softmax(state["log_w"])))

    def combine(self, state: State, query: Query, predictions: dict[str, Output]) -> tuple[Output, float]:
        log_w = dict(zip(state["models"], state["log_w"]))
        present = [m for m in predictions if m in log_w] or list(predictions)
        if not present:
            return Output(None), 0.0
        top = max(log_w.values(), default=0.0)
        w = dict(zip(present, softmax([log_w.get(m, top) for m in present])))
        if self.kind == "regression":
            answer = Output(sum(w[m] * float(plain(predictions[m].value)) for m in present))
        elif self.labels is not None:
            answer = self._combine_scores(predictions, w)
        else:
            answer = self._vote(predictions, w)
        linked = state["models"] or present
        agree = sum(
            1 for m in linked if m in predictions and agrees(predictions[m], answer, self.kind, self.agree_tolerance)
        )
        return answer, agree / len(linked)

    def _combine_scores(self, predictions: dict[str, Output], w: dict[str, float]) -> Output:
        labels = self.labels or ()
        total = [0.0] * len(labels)
        for m, wm in w.items():
            vec = self._vector(predictions[m], labels)
            for j, v in enumerate(vec):
                total[j] += wm * v
        best = max(range(len(labels)), key=total.__getitem__)
        return Output(labels[best], tuple(total))

    @staticmethod
    def _vector(output: Output, labels: tuple[Any, ...]) -> list[float]:
        """Class scores as given, or a label as a one-hot vector over the app's labels."""
        if output.scores is not None and len(output.scores) == len(labels):
            return [float(s) for s in output.scores]
        return [1.0 if same_label(output.value, lab) else 0.0 for lab in labels]

    @staticmethod
    def _vote(predictions: dict[str, Output], w: dict[str, float]) -> Output:
        """Labels without a declared label list: a weighted vote (ties: the first seen)."""
        votes: dict[str, tuple[Any, float]] = {}
        for m, wm in w.items():
            value = plain(predictions[m].value)
            key = str(value)
            prev = votes.get(key, (value, 0.0))
            votes[key] = (prev[0], prev[1] + wm)
        value, _ = max(votes.values(), key=lambda vw: vw[1])
        return Output(value)

    def observe(self, state: State, query: Query, feedback: Feedback, predictions: dict[str, Output]) -> State:
        models = state["models"]
        log_w = list(state["log_w"])
        for model, output in predictions.items():
            if model not in models:
                continue
            loss = model_loss(output, feedback, self.kind, self.loss_scale, self.agree_tolerance)
            if loss is not None:
                log_w[models.index(model)] -= self.eta * loss
        out = with_weights(state, log_w, self.max_log_ratio)
        out["n_observed"] = int(state.get("n_observed", 0)) + 1
        return out
