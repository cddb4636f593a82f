"""Model locations in the registry, resolved against each host's repository root (no broker).

``memory://`` stands in for an object store: it goes through the same fsspec calls (read
``model.yaml``, list and copy a version folder) that ``s3://`` or ``http://`` take.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import fsspec
import numpy as np
import pytest

from clipstream.errors import ClipstreamError, ConfigError
from clipstream.testing.models import digits, make_onnx_digits_model, make_profile_model
from registry.appfile import load_app_file
from registry.repository import Repository, sibling
from registry.spec import load_spec
from registry.topic import RegistryState
from schemas import Model, encode
from workers.backends import load_model


def _memory_copy(folder: Path) -> str:
    """Upload a model folder to a fresh ``memory://`` repository; returns its root URL."""
    root = f"memory://repo-{uuid.uuid4().hex[:8]}"
    fs = fsspec.filesystem("memory")
    for f in folder.rglob("*"):
        if f.is_file():
            fs.pipe(f"{root[len('memory://'):]}/{folder.parent.name}/{folder.name}/{f.relative_to(folder)}",
                    f.read_bytes())
    return root


def test_locations_resolve_relative_absolute_and_url(tmp_path: Path) -> None:
    repo = Repository(str(tmp_path / "repo"))
    assert repo.url("digits/logreg/1") == str(tmp_path / "repo" / "digits" / "logreg" / "1")
    assert repo.url("/srv/models/logreg/1") == "/srv/models/logreg/1"  # records from before
    assert repo.url("s3://bucket/m/logreg/1") == "s3://bucket/m/logreg/1"
    assert Repository("s3://bucket/models/").url("logreg/1") == "s3://bucket/models/logreg/1"
    with pytest.raises(ConfigError, match="CLIPSTREAM_MODEL_REPOSITORY is not set on this host"):
        Repository(None).url("logreg/1")
    assert sibling("digits/logreg/1", "2") == "digits/logreg/2"
    assert sibling("s3://b/logreg/1/", "2") == "s3://b/logreg/2"


def test_the_applier_records_a_location_inside_its_repository(tmp_path: Path) -> None:
    folder = make_profile_model(tmp_path / "repo" / "digits", "sim", "1")
    assert Repository(str(tmp_path / "repo")).location_of(folder) == "digits/sim/1"
    assert Repository(f"file://{tmp_path / 'repo'}").location_of(folder) == "digits/sim/1"
    outside = make_profile_model(tmp_path / "elsewhere", "sim", "1")
    assert Repository(str(tmp_path / "repo")).location_of(outside) == str(outside)
    assert Repository(None).location_of(folder) == str(folder)  # no repository: as before
    assert Repository("s3://b/models").location_of("s3://b/models/sim/2/") == "sim/2"
    assert Repository("s3://b/models").location_of("s3://other/sim/2") == "s3://other/sim/2"


def test_an_app_file_names_a_place_in_the_repository_as_deploy_model_does(tmp_path: Path) -> None:
    """A Triton user's app file elsewhere names `sim/1` as deploy-model would: a folder beside
    the app file comes first, then the repository."""
    from registry.appfile import load_app_file

    make_profile_model(tmp_path / "repo" / "digits", "sim", "1")
    app = tmp_path / "apps" / "app.yaml"
    app.parent.mkdir()
    app.write_text("apps: []\nmodels:\n  - {name: sim, path: digits/sim/1}\n")
    loaded = load_app_file(app, Repository(str(tmp_path / "repo")))
    assert [m["path"] for m in loaded.models] == ["digits/sim/1"] and loaded.specs["sim"].input.shape
    with pytest.raises(ConfigError, match=r"no folder .*apps/digits/sim/1 .* a place in CLIPSTREAM_MODEL_REPOSITORY "
                                          r"when that is set"):
        load_app_file(app, Repository(None))


def test_missing_model_says_which_root_was_tried(tmp_path: Path) -> None:
    repo = Repository(str(tmp_path / "b"), tmp_path / "cache")
    with pytest.raises(ConfigError, match=r"CLIPSTREAM_MODEL_REPOSITORY=.*/b: point it at"):
        repo.fetch("digits/sim/1")
    with pytest.raises(ConfigError, match="model.yaml does not exist.*CLIPSTREAM_MODEL_REPOSITORY"):
        repo.read_spec("digits/sim/1")
    with pytest.raises(ConfigError, match="absolute path of the host that applied"):
        repo.fetch(str(tmp_path / "gone" / "sim" / "1"))
    with pytest.raises(ConfigError, match="model.yaml does not exist"):
        Repository(f"memory://nothing-{uuid.uuid4().hex[:8]}", tmp_path / "cache").read_spec("sim/1")


def test_a_folder_here_without_its_model_yaml_is_told_to_write_one(tmp_path: Path) -> None:
    folder = tmp_path / "mls"
    folder.mkdir()
    (folder / "model-settings.json").write_text('{"implementation": "mlserver_sklearn.SKLearnModel"}')
    with pytest.raises(ConfigError, match=r"mls holds no model.yaml: write one \(docs/MODELS.md\); "
                                          r"model-settings.json is another server's, which clipstream does not read"):
        Repository(None).fetch(str(folder))


def test_a_remote_version_is_copied_once_and_serves(tmp_path: Path) -> None:
    local = make_onnx_digits_model(tmp_path / "src", "logreg", "3")
    root = _memory_copy(local)
    repo = Repository(root, tmp_path / "cache")
    spec = repo.read_spec("logreg/3")  # model.yaml alone, as a stage's registry view reads it
    assert spec.backend == "onnx" and spec.output.labels == tuple(range(10))
    assert not spec.path.exists()  # nothing copied for the spec
    folder = repo.fetch("logreg/3")
    assert folder == spec.path and folder.is_relative_to(tmp_path / "cache")
    assert (folder / "model.onnx").read_bytes() == (local / "model.onnx").read_bytes()
    x, _ = digits()
    np.testing.assert_allclose(load_model(load_spec(folder)).predict_batch(x[:4]),
                               load_model(load_spec(local)).predict_batch(x[:4]), rtol=1e-6)
    fsspec.filesystem("memory").rm(root[len("memory://"):], recursive=True)
    assert repo.fetch("logreg/3") == folder  # the cached copy: a version folder never changes
    assert not list((tmp_path / "cache").glob(".*.part"))


def test_registry_view_reads_specs_through_its_hosts_repository(tmp_path: Path) -> None:
    folder = make_profile_model(tmp_path / "b", "sim", "1", labels=[0, 1])
    record = encode(Model(name="sim", version="1", path="sim/1", replicas=1, updated_us=1))
    unset = RegistryState()
    unset.apply("model:sim", record)
    m = unset.view().models["sim"]
    assert m.spec is None and "CLIPSTREAM_MODEL_REPOSITORY is not set" in (m.spec_error or "")
    state = RegistryState(Repository(str(tmp_path / "b")))
    state.apply("model:sim", record)
    m = state.view().models["sim"]
    assert m.spec is not None and m.spec.output.labels == (0, 1)
    assert m.path == folder and m.location == "sim/1"


def test_a_spec_that_failed_is_tried_again(tmp_path: Path) -> None:
    state = RegistryState(Repository(str(tmp_path / "b")))
    state.apply("model:sim", encode(Model(name="sim", version="1", path="sim/1", updated_us=1)))
    assert state.view().models["sim"].spec is None
    make_profile_model(tmp_path / "b", "sim", "1")  # the repository became reachable
    assert state.view().models["sim"].spec is not None


def test_app_file_paths_become_repository_locations(tmp_path: Path) -> None:
    make_profile_model(tmp_path / "a" / "models", "sim", "1")
    app = tmp_path / "a" / "app.yaml"
    app.write_text("models:\n  - {name: sim, path: models/sim/1}\n")
    assert load_app_file(app, Repository(str(tmp_path / "a"))).models[0]["path"] == "models/sim/1"
    assert load_app_file(app).models[0]["path"] == str(tmp_path / "a" / "models" / "sim" / "1")
    root = _memory_copy(make_profile_model(tmp_path / "src", "sim", "2"))
    app.write_text(f"models:\n  - {{name: sim, path: '{root}/sim/2'}}\n")
    assert load_app_file(app, Repository(root, tmp_path / "cache")).models[0]["path"] == "sim/2"
    app.write_text(f"models:\n  - {{name: sim, path: '{root}/sim/9'}}\n")
    with pytest.raises(ConfigError, match="sim/9/model.yaml does not exist"):
        load_app_file(app, Repository(root, tmp_path / "cache"))


def test_deploy_model_takes_a_folder_a_url_or_a_repository_location(tmp_path: Path) -> None:
    from frontend.cli import _location

    folder = make_profile_model(tmp_path / "repo", "sim", "2")
    repo = Repository(str(tmp_path / "repo"), tmp_path / "cache")
    assert _location(repo, str(folder))[0] == "sim/2"
    assert _location(repo, "sim/2")[0] == "sim/2"
    root = _memory_copy(folder)
    assert _location(Repository(root, tmp_path / "cache"), f"{root}/sim/2")[0] == "sim/2"
    with pytest.raises(ClipstreamError, match="no folder .*set CLIPSTREAM_MODEL_REPOSITORY"):
        _location(Repository(None), str(tmp_path / "nope"))
