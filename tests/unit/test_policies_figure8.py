"""Clipper Figure 8 as a policy-only simulation: the best model fails and recovers.

20,000 sequential queries with immediate feedback; five models of different accuracy; the best
one is degraded between queries 5,000 and 10,000 and recovers after. The real policy objects
run every step (select, combine, observe); only the models' answers are simulated (drawn up
front with numpy, seeded).
"""

from __future__ import annotations

import numpy as np

from selector.policies import Exp3, Exp4
from selector.types import Feedback, Output, Query

N = 20_000
FAIL, RECOVER = 5_000, 10_000
CLASSES = 10
ERROR = np.array([0.45, 0.35, 0.30, 0.20, 0.10])  # model 5 (index 4) is the best
FAILED_ERROR = 0.95
MODELS = [f"model{i + 1}" for i in range(len(ERROR))]


def simulate(seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """Labels y[t] and each model's answer yhat[t, m]; wrong answers are another class at random."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, CLASSES, N)
    err = np.tile(ERROR, (N, 1))
    err[FAIL:RECOVER, 4] = FAILED_ERROR
    wrong = rng.random((N, len(ERROR))) < err
    shift = rng.integers(1, CLASSES, (N, len(ERROR)))
    yhat = np.where(wrong, (y[:, None] + shift) % CLASSES, y[:, None])
    return y, yhat


def run(policy, y: np.ndarray, yhat: np.ndarray, probe=None) -> np.ndarray:
    """Serve every query with ``policy`` and feed back the truth at once; 1 where it erred."""
    state = policy.init(MODELS)
    outputs = [[Output(c) for c in range(CLASSES)] for _ in MODELS]
    errors = np.zeros(N, dtype=np.int8)
    for t in range(N):
        query = Query(f"q{t}", "fig8")
        row = yhat[t]
        preds = {m: outputs[MODELS.index(m)][row[MODELS.index(m)]] for m in policy.select(state, query)}
        answer, _ = policy.combine(state, query, preds)
        errors[t] = answer.value != y[t]
        state = policy.observe(state, query, Feedback(query.query_id, label=int(y[t])), preds)
        if probe is not None:
            probe(t, state)
    assert state["n_observed"] == N
    return errors


def test_exp3_and_exp4_beat_every_static_model_and_exp4_drops_the_failed_one_fast() -> None:
    y, yhat = simulate()
    static = (yhat != y[:, None]).mean(axis=0)
    best_static = static.min()
    assert np.argmin(static) == 3  # model 5's failure makes model 4 the best static choice

    exp3_err = run(Exp3({"eta": 0.1, "gamma": 0.05, "kind": "label"}), y, yhat).mean()

    exp4 = Exp4({"eta": 0.1, "kind": "label", "labels": list(range(CLASSES))})
    failed_weight: dict[int, float] = {}

    def probe(t: int, state: dict) -> None:
        if t in (FAIL - 1, FAIL + 1_000):
            failed_weight[t] = exp4.weights(state)["model5"]

    exp4_err = run(exp4, y, yhat, probe).mean()

    assert exp3_err < best_static, (exp3_err, static)
    assert exp4_err < best_static, (exp4_err, static)
    assert failed_weight[FAIL - 1] > 0.5  # before the failure Exp4 trusts the best model most
    assert failed_weight[FAIL + 1_000] < 0.1  # within 1,000 queries most weight has moved away
