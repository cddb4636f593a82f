"""``bench.ensemble --as-one-model``: the one model that stands in for the five must answer
what the five answer together (their mean), from an app file ``clipstream apply`` takes."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.ensemble import APP, ONE_MODEL, write_one_model_app
from clipstream.testing.models import digits, make_onnx_digits_model, make_torch_model
from registry.appfile import load_app_file
from registry.spec import load_spec
from workers.backends import load_model


def test_the_one_model_answers_the_mean_of_its_members(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    members = {"logreg": make_onnx_digits_model(repo, "logreg"), "mlp": make_torch_model(repo, "mlp")}
    app_file = write_one_model_app(tmp_path / "app.yaml", repo, list(members))

    parsed = load_app_file(app_file)
    (app,) = parsed.apps
    assert (app["name"], app["policy"], app["models"]) == (APP, "single", [ONE_MODEL])

    x = digits()[0][:7]
    one = load_model(load_spec(repo / ONE_MODEL / "1"), device="cpu").predict_batch(x)
    each = [np.asarray(load_model(load_spec(folder), device="cpu").predict_batch(x)) for folder in members.values()]
    assert one.shape == (7, 10)
    np.testing.assert_allclose(one, np.mean(each, axis=0), rtol=1e-5, atol=1e-6)
