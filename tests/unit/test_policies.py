"""Exp3, Exp4 and single against hand-computed values (Clipper 5.1, 5.2, 5.2.1-5.2.2)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from clipstream.errors import ConfigError
from selector.policies import Exp3, Exp4, Single, align_state, get_policy
from selector.types import Feedback, Output, Query

Q = Query("q1", "app")


def test_exp3_probabilities_start_uniform_and_update_only_the_chosen_model() -> None:
    p = Exp3({"eta": 0.5, "gamma": 0.3})
    s = p.init(["a", "b", "c"])
    assert p.probabilities(s) == pytest.approx([1 / 3] * 3)
    s2 = p.observe(s, Q, Feedback("q1", label="yes"), {"b": Output("no")})
    # s_b <- s_b * exp(-eta * 1 / (1/3)) = exp(-1.5); others unchanged
    assert s2["log_w"] == pytest.approx([0.0, -1.5, 0.0])
    q = [1 / (2 + math.exp(-1.5)), math.exp(-1.5) / (2 + math.exp(-1.5)), 1 / (2 + math.exp(-1.5))]
    assert p.probabilities(s2) == pytest.approx([0.7 * x + 0.1 for x in q])
    assert s2["n_observed"] == 1 and s["n_observed"] == 0  # observe returns a new state
    # a right answer costs nothing
    s3 = p.observe(s2, Q, Feedback("q1", label="yes"), {"a": Output("yes")})
    assert s3["log_w"] == pytest.approx(s2["log_w"])


def test_exp3_reward_loss_is_one_minus_reward() -> None:
    p = Exp3({"eta": 1.0, "gamma": 0.0})
    s = p.init(["a", "b"])
    s2 = p.observe(s, Q, Feedback("q1", reward=0.75), {"a": Output("x")})
    assert s2["log_w"] == pytest.approx([-0.25 / 0.5, 0.0])  # loss 1 - 0.75, p_a = 1/2


def test_exp3_select_is_seeded_by_query_id_and_follows_the_weights() -> None:
    p = Exp3({"gamma": 0.0})
    s = {"policy": "exp3", "models": ["a", "b"], "log_w": [0.0, -10.0], "n_observed": 0}
    picks = [p.select(s, Query(f"q{i}", "app"))[0] for i in range(2000)]
    assert picks == [p.select(s, Query(f"q{i}", "app"))[0] for i in range(2000)]
    assert picks.count("b") < 10  # p_b = e^-10 / (1 + e^-10)
    uniform = Exp3({"gamma": 1.0})
    picks = [uniform.select(s, Query(f"q{i}", "app"))[0] for i in range(2000)]
    assert 850 < picks.count("b") < 1150


def test_exp3_combine_returns_the_chosen_answer_with_its_probability() -> None:
    p = Exp3({"gamma": 0.0})
    s = {"policy": "exp3", "models": ["a", "b"], "log_w": [0.0, math.log(3)], "n_observed": 0}
    out, conf = p.combine(s, Q, {"b": Output(7)})
    assert out.value == 7 and conf == pytest.approx(0.75)
    assert p.combine(s, Q, {}) == (Output(None), 0.0)


def exp4_state() -> dict:
    return {"policy": "exp4", "models": ["a", "b", "c"], "log_w": [math.log(0.5), math.log(0.3), math.log(0.2)], "n_observed": 0}


def test_exp4_combines_scores_and_one_hot_labels_with_the_weights() -> None:
    p = Exp4({"kind": "class_scores", "labels": ["x", "y"]})
    preds = {"a": Output("x", (0.9, 0.1)), "b": Output("y", (0.2, 0.8)), "c": Output("y")}
    out, conf = p.combine(exp4_state(), Q, preds)
    assert out.scores == pytest.approx((0.51, 0.49))
    assert out.value == "x"
    assert conf == pytest.approx(1 / 3)  # only a agrees with the combined answer


def test_exp4_straggler_lowers_confidence() -> None:
    p = Exp4({"kind": "class_scores", "labels": ["x", "y"]})
    agree = {"a": Output("x", (0.9, 0.1)), "b": Output("x", (0.6, 0.4)), "c": Output("x", (0.7, 0.3))}
    out, conf = p.combine(exp4_state(), Q, agree)
    assert (out.value, conf) == ("x", pytest.approx(1.0))
    del agree["c"]  # c is a straggler: the weights of a and b are renormalised (0.625, 0.375)
    out, conf = p.combine(exp4_state(), Q, agree)
    assert out.scores == pytest.approx((0.625 * 0.9 + 0.375 * 0.6, 0.625 * 0.1 + 0.375 * 0.4))
    assert (out.value, conf) == ("x", pytest.approx(2 / 3))


def test_exp4_updates_every_model_by_its_own_loss() -> None:
    p = Exp4({"eta": 0.5, "max_log_ratio": 100})
    s = p.init(["a", "b", "c"])
    s2 = p.observe(s, Q, Feedback("q1", label="y"), {"a": Output("x"), "b": Output("y"), "c": Output("x")})
    # a and c lose exp(-0.5); shifted so the best is 0
    assert s2["log_w"] == pytest.approx([-0.5, 0.0, -0.5])
    assert p.weights(s2)["b"] == pytest.approx(1 / (1 + 2 * math.exp(-0.5)))
    assert s2["n_observed"] == 1


def test_exp4_regression_weighted_mean_clipped_loss_and_tolerance() -> None:
    p = Exp4({"kind": "regression", "eta": 1.0, "loss_scale": 2.0, "max_log_ratio": 100})
    s = {"policy": "exp4", "models": ["a", "b"], "log_w": [math.log(0.25), math.log(0.75)], "n_observed": 0}
    out, conf = p.combine(s, Q, {"a": Output(1.0), "b": Output(3.0)})
    assert out.value == pytest.approx(2.5)
    assert conf == 0.0  # tolerance 0.2: neither is within it
    s2 = p.observe(p.init(["a", "b"]), Q, Feedback("q1", label=2.0), {"a": Output(1.0), "b": Output(10.0)})
    # losses: |2-1|/2 = 0.5, min(1, 8/2) = 1
    assert s2["log_w"] == pytest.approx([0.0, -0.5])


def test_exp4_reward_updates_only_models_that_agreed_with_the_answer() -> None:
    p = Exp4({"eta": 1.0, "max_log_ratio": 100})
    s = p.init(["a", "b"])
    fb = Feedback("q1", reward=0.0, answer=Output("x"))
    s2 = p.observe(s, Q, fb, {"a": Output("x"), "b": Output("y")})
    assert s2["log_w"] == pytest.approx([-1.0, 0.0])


def test_exp4_votes_labels_when_no_label_list_is_known() -> None:
    p = Exp4()
    s = {**exp4_state(), "log_w": [math.log(0.6), math.log(0.3), math.log(0.1)]}
    out, conf = p.combine(s, Q, {"a": Output(1), "b": Output(2), "c": Output(2)})
    assert out.value == 1 and conf == pytest.approx(1 / 3)  # 0.6 outvotes 0.3 + 0.1
    out, _ = p.combine({**exp4_state(), "log_w": [0.0, 0.0, 0.0]}, Q, {"a": Output(1), "b": Output(2), "c": Output(2)})
    assert out.value == 2


def test_weights_stay_bounded_and_floored() -> None:
    p = Exp4({"eta": 1.0, "max_log_ratio": 5})
    s = p.init(["a", "b"])
    for _ in range(100):
        s = p.observe(s, Q, Feedback("q", label=1), {"a": Output(0), "b": Output(1)})
    assert s["log_w"] == [-5.0, 0.0]
    assert json.loads(json.dumps(s)) == s  # state is JSON-able (it lives in Redis)


def test_single_always_asks_the_first_model() -> None:
    p = Single()
    s = p.init(["m1", "m2"])
    assert p.select(s, Q) == ["m1"]
    assert p.combine(s, Q, {"m1": Output(3)}) == (Output(3), 1.0)
    assert p.observe(s, Q, Feedback("q1", label=3), {"m1": Output(3)})["n_observed"] == 1


class MyPolicy(Single):
    """A user policy reached through its import path."""


def test_registry_builtins_and_import_path() -> None:
    assert isinstance(get_policy("exp3"), Exp3)
    assert isinstance(get_policy("exp4", {"eta": 0.2}), Exp4)
    mine = "tests.unit.test_policies:MyPolicy"
    assert isinstance(get_policy(mine, allowed=[mine]), MyPolicy)
    with pytest.raises(ConfigError):
        get_policy("nope")
    with pytest.raises(ConfigError):
        get_policy("json:nothing_here", allowed=["json:nothing_here"])
    with pytest.raises(ConfigError):
        get_policy("exp3", {"gamma": 2})


def test_import_paths_outside_the_allow_list_are_refused_before_any_import() -> None:
    # the registry hole: an App record naming subprocess:Popen with argv in its policy_config
    with pytest.raises(ConfigError, match="allow-list"):
        get_policy("subprocess:Popen", {"args": ["touch", "/tmp/pwned"]})
    with pytest.raises(ConfigError, match="allow-list"):
        get_policy("tests.unit.test_policies:MyPolicy", allowed=["tests.unit.test_policies:Other"])
    with pytest.raises(ConfigError, match="not a class"):
        get_policy("os:system", allowed=["os:system"])


def test_align_state_adds_new_models_at_the_best_weight_and_keeps_the_unlinked_ones_weight() -> None:
    p = Exp4()
    s = {"policy": "exp4", "models": ["a", "b"], "log_w": [0.0, -3.0], "n_observed": 4}
    s2 = align_state(p, s, ["b", "c"])
    assert s2["models"] == ["b", "c"] and s2["log_w"] == [-3.0, 0.0] and s2["n_observed"] == 4
    assert s2["left"] == {"a@-": 0.0} and "left" not in s  # kept aside, not selected from
    assert align_state(p, None, ["x"]) == p.init(["x"])


def test_a_model_linked_again_takes_back_the_weight_it_had_learnt() -> None:
    p = Exp3({"gamma": 0.0})
    s = align_state(p, None, ["good", "bad"], {"good": "1", "bad": "3"})
    s["log_w"] = [0.0, -8.0]
    unlinked = align_state(p, s, ["good"], {"good": "1"})
    assert unlinked["models"] == ["good"] and unlinked["left"] == {"bad@3": -8.0}
    back = align_state(p, unlinked, ["good", "bad"], {"good": "1", "bad": "3"})
    assert back["log_w"] == [0.0, -8.0] and not back["left"]
    assert p.select(back, Query("q", "a")) == ["good"]  # not a coin toss between the two again
    # a new version of it starts where its model was, as a version does while linked
    fixed = align_state(p, unlinked, ["good", "bad"], {"good": "1", "bad": "4"})
    assert fixed["log_w"] == [0.0, -8.0] and fixed["left"] == {"bad@3": -8.0}
    # the weights kept aside move with the others' frame: good's wrong answer (a loss of
    # eta=0.1, chosen with p=1) brings bad 0.1 nearer to it
    taught = p.observe(unlinked, Query("q", "a"), Feedback("q", label="y"), {"good": Output("n")})
    assert taught["log_w"] == [0.0] and taught["left"]["bad@3"] == pytest.approx(-7.9)


def test_a_model_never_linked_starts_at_the_best_weight_whatever_is_kept_aside() -> None:
    p = Exp4()
    s = align_state(p, {"policy": "exp4", "models": ["a", "b"], "log_w": [0.0, -5.0]}, ["a"])
    assert align_state(p, s, ["a", "c"])["log_w"] == [0.0, 0.0]


def test_apps_refuse_a_policy_once_until_its_record_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    import selector.kafka as sk
    from registry.topic import AppConfig, RegistryView

    built: list[str] = []
    real = sk.get_policy

    def counting(name: str, config: Any = None, allowed: Any = ()) -> Any:
        built.append(name)
        return real(name, config, allowed)

    monkeypatch.setattr(sk, "get_policy", counting)
    outputs = SimpleNamespace(kind="label", labels=None)
    monkeypatch.setattr(sk, "app_outputs", lambda view, models: outputs)
    view = RegistryView(apps={"a": AppConfig("a", "subprocess:Popen", 50.0, -1, {}, ("m",))}, models={})
    apps = sk.Apps(lambda: view)
    for _ in range(3):
        with pytest.raises(ConfigError, match="refused"):
            apps.get("a")
    assert built == ["subprocess:Popen"]  # refused once, remembered
    view = RegistryView(apps={"a": AppConfig("a", "exp3", 50.0, -1, {}, ("m",))}, models={})  # a new record
    assert isinstance(apps.get("a")[1], Exp3)


def test_a_state_without_a_model_keeps_nothing_of_it_and_the_rest_as_it_was() -> None:
    from clipstream.weights import without_model

    s = {"policy": "exp4", "models": ["a", "b"], "log_w": [0.0, -2.0], "n_observed": 3,
         "versions": {"a": "1", "b": "4"}, "left": {"b@3": -1.0, "a@0": -5.0, "bb@1": 0.0}}
    out = without_model(s, "b")
    assert out == {"policy": "exp4", "models": ["a"], "log_w": [0.0], "n_observed": 3,
                   "versions": {"a": "1"}, "left": {"a@0": -5.0, "bb@1": 0.0}}
    assert s["models"] == ["a", "b"]  # the state it came from is untouched
    assert without_model(out, "b") is None and without_model({"policy": "mine"}, "b") is None
