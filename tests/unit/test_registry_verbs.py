"""The registry verbs change only what they are asked to: a version keeps its folder for good,
an update of an app keeps what was not given, and an app file's misspelt key is refused."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from clipstream.cli import main
from clipstream.errors import ConfigError
from clipstream.settings import Settings
from registry.appfile import apply_file, load_app_file
from registry.topic import AppConfig, ModelConfig, RegistryView
from registry.versions import check_version, history, next_version, rolled_back, unpinned_version
from tests.unit.test_cli_input_errors import MODEL_YAML, NoKafka, _model_dir, _one_line_error

def _model(version: str = "1", location: str = "/models/m/1", **kw: object) -> ModelConfig:
    return ModelConfig(name="m", version=version, path=Path(location), location=location, **kw)  # type: ignore[arg-type]


def test_the_next_version_is_one_more_than_the_highest_the_model_had() -> None:
    assert next_version(None) == "1"
    assert next_version(_model("3", previous_versions=("1", "7"), previous_paths=("/a", "/b"))) == "8"
    with pytest.raises(ConfigError, match="not numbers .*--version"):
        next_version(_model("blue"))


def test_an_app_files_model_without_a_version_keeps_the_one_serving_now() -> None:
    assert unpinned_version(None, "/models/m/1") == ("1", "/models/m/1")  # a new model
    current = _model("3", "/models/m/3", previous_versions=("1",), previous_paths=("/models/m/1",))
    # deploy-model set 3 since: up's start keeps it, at its own folder, which check_version allows
    assert unpinned_version(current, "/models/m/1") == ("3", "/models/m/3")
    check_version(current, *unpinned_version(current, "/models/m/1"), "`version:`")
    assert unpinned_version(current, "/models/m/3") == ("3", "/models/m/3")
    assert unpinned_version(current, "/models/m/new") == ("4", "/models/m/new")  # a folder it never had


def test_an_existing_version_keeps_its_folder() -> None:
    current = _model("2", "/models/m/2", previous_versions=("1",), previous_paths=("/models/m/1",))
    check_version(None, "1", "/anywhere", "--version N")
    check_version(current, "2", "/models/m/2", "--version N")  # the same deployment again
    check_version(current, "3", "/models/m/3", "--version N")  # a new version
    with pytest.raises(ConfigError, match=r"model m version 2 is deployed from /models/m/2, not /new: .*--version N"):
        check_version(current, "2", "/new", "--version N")
    with pytest.raises(ConfigError, match=r"version 1 is deployed from /models/m/1"):
        check_version(current, "1", "/new", "--version N")  # rollback's target too


def test_a_version_a_rollback_left_is_retired_never_given_again() -> None:
    """Deploy 4, roll back to 3, deploy again: the new one is 5, not 4 again, whose cached
    predictions would answer for it; and 4 keeps its folder."""
    current = _model("4", "/models/m/bad", previous_versions=("1", "3"), previous_paths=("/models/m/1", "/models/m/3"))
    back = rolled_back(current)
    assert (back.version, back.location, back.previous_versions) == ("3", "/models/m/3", ("1",))
    assert (back.retired_versions, back.retired_paths) == (("4",), ("/models/m/bad",))
    assert next_version(back) == "5"
    with pytest.raises(ConfigError, match=r"version 4 is deployed from /models/m/bad"):
        check_version(back, "4", "/models/m/fixed", "--version N")
    check_version(back, "4", "/models/m/bad", "--version N")  # the same code again is allowed
    again = history(back, "4")  # and takes it out of the retired ones
    assert again == {"previous_versions": ["1", "3"], "previous_paths": ["/models/m/1", "/models/m/3"],
                     "retired_versions": [], "retired_paths": []}


def test_a_deployment_of_a_version_in_the_history_takes_it_out_of_the_history() -> None:
    """An app file that names version 1 while 3 is current: rollback then returns to 3, and 1
    is not both current and in the history."""
    current = _model("3", "/models/m/3", previous_versions=("1", "2"), previous_paths=("/models/m/1", "/models/m/2"))
    assert history(current, "1")["previous_versions"] == ["2", "3"]


def _deployed(monkeypatch: pytest.MonkeyPatch, view: RegistryView, *args: str) -> tuple[NoKafka, object]:
    fake = NoKafka(view).install(monkeypatch)
    return fake, CliRunner().invoke(main, ["deploy-model", *args])


def test_deploy_model_names_the_next_version_and_keeps_the_models_knobs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    folder = _model_dir(tmp_path)
    current = _model("1", "/models/m/1", replicas=2, max_batch_size=8, batch_delay_ms=4.0, group="g")
    fake, result = _deployed(monkeypatch, RegistryView(models={"m": current}), "m", str(folder))
    assert result.exit_code == 0, result.output  # type: ignore[attr-defined]
    assert "model m version 2 deployed" in result.output  # type: ignore[attr-defined]
    ((verb, args),) = fake.writes
    assert verb == "model" and args[:4] == ("m", "2", str(folder), 2)


def test_deploy_model_refuses_another_folder_for_the_deployed_version(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = NoKafka(RegistryView(models={"m": _model("1", "/models/m/1")})).install(monkeypatch)
    result = CliRunner().invoke(main, ["deploy-model", "m", str(_model_dir(tmp_path)), "--version", "1"])
    _one_line_error(result, 1, "model m version 1 is deployed from /models/m/1", "--version N")
    assert fake.writes == [] and fake.topics == []


def test_a_version_that_changes_the_models_input_or_labels_is_refused_before_anything_is_written(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Version 1 takes float32 [4] and answers labels [0, 1]: a version 2 that takes [5], or
    answers other labels, would be checked and read by them while version 1 still serves, so
    `deploy-model` and `apply` refuse it, naming the difference and the way out. The same
    contract in another folder deploys."""
    from registry.spec import load_spec

    same = _model_dir(tmp_path)
    current = _model("1", "/models/m/1", spec=load_spec(same))
    wider = tmp_path / "wider" / "2"
    wider.mkdir(parents=True)
    (wider / "model.yaml").write_text(MODEL_YAML.replace("shape: [4]", "shape: [5]"))
    fake, result = _deployed(monkeypatch, RegistryView(models={"m": current}), "m", str(wider))
    _one_line_error(result, 1, "model m version 2 takes float32 [5] where version 1 takes float32 [4]",
                    "serve the changed model under a new name", "`clipstream apply -f FILE`")
    assert fake.writes == [] and fake.topics == []
    named = tmp_path / "named" / "2"
    named.mkdir(parents=True)
    (named / "model.yaml").write_text(MODEL_YAML.replace("labels: [0, 1]", "labels: [cat, dog]"))
    fake, result = _deployed(monkeypatch, RegistryView(models={"m": current}), "m", str(named))
    _one_line_error(result, 1, "model m version 2 has labels ['cat', 'dog'] where version 1 has [0, 1]")
    (tmp_path / "app.yaml").write_text("models:\n  - {name: m, path: wider/2}\n")
    with pytest.raises(ConfigError, match=r"model m version 2 takes float32 \[5\] where version 1 takes float32 \[4\]"):
        apply_file(Settings(), tmp_path / "app.yaml", RegistryView(models={"m": current}))  # before any write
    fake, result = _deployed(monkeypatch, RegistryView(models={"m": current}), "m", str(same), "--version", "2")
    assert result.exit_code == 0 and "model m version 2 deployed" in result.output, result.output  # type: ignore[attr-defined]


def test_set_replicas_of_a_group_sets_every_members_and_the_groups_topics(monkeypatch: pytest.MonkeyPatch) -> None:
    """The batcher's alert names a group as the thing to give replicas to: each member gets
    them, as they are served together, and the group's topics get the partitions."""
    from registry.groups import groups_of

    members = {n: replace(_model("1", f"/models/{n}/1"), name=n, group="g") for n in ("a", "b")}
    fake = NoKafka(RegistryView(models=members, groups=groups_of(members))).install(monkeypatch)
    result = CliRunner().invoke(main, ["set-replicas", "g", "3"])
    assert result.exit_code == 0 and "group g: 3 replicas" in result.output, result.output
    assert sorted((args[0], args[3]) for verb, args in fake.writes if verb == "model") == [("a", 3), ("b", 3)]
    assert ("g", 3) in fake.topics
    unknown = CliRunner().invoke(main, ["set-replicas", "nope", "2"])
    _one_line_error(unknown, 1, "no model 'nope' in the registry")


def test_a_version_that_never_served_is_retired_when_another_is_deployed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Version 3 crash-looped: its batches still go to version 1, and its worker said it could
    not load it. Deploying 4 retires 3, so a rollback from 4 goes to 1, not to a version that
    never loaded. One still loading when 4 comes is kept: the batcher may hand it the batches
    a moment later, and it serves until 4 is ready."""
    import frontend.cli
    from schemas import Batch, encode
    from topics.catalogue import Catalogue

    said: dict[str, str | None] = {"3": "replica 0 did not load it: weights.bin is missing"}
    monkeypatch.setattr(frontend.cli, "failed_to_load", lambda settings, model, version, replicas: said[version])
    folder = str(_model_dir(tmp_path))
    current = _model("3", "/models/m/3", previous_versions=("1",), previous_paths=("/models/m/1",))
    fake = NoKafka(RegistryView(models={"m": current})).install(monkeypatch)
    topic = Catalogue.from_settings(Settings()).batches("m").name
    fake.tails[topic] = {0: encode(Batch(batch_id="handover-b-1", model="m", version="1", replica=0,
                                         created_us=1, items=[]))}
    result = CliRunner().invoke(main, ["deploy-model", "m", folder, "--version", "4"])
    assert result.exit_code == 0, result.output
    assert "version 3 never served (its batches still went to version 1): retired" in result.output
    ((knobs),) = fake.knobs
    assert (knobs["previous_versions"], knobs["retired_versions"]) == (["1"], ["3"])
    fake.tails[topic] = {0: encode(Batch(batch_id="b-2", model="m", version="3", replica=0, created_us=1,
                                         items=[]))}  # had 3 served, it would stay a version to roll back to
    fake.knobs.clear()
    result = CliRunner().invoke(main, ["deploy-model", "m", folder, "--version", "4"])
    assert result.exit_code == 0 and "never served" not in result.output, result.output
    assert (fake.knobs[0]["previous_versions"], fake.knobs[0]["retired_versions"]) == (["1", "3"], [])
    fake.tails[topic] = {0: encode(Batch(batch_id="handover-b-1", model="m", version="1", replica=0,
                                         created_us=1, items=[]))}
    said["3"] = None  # still loading: no word of a failure yet
    fake.knobs.clear()
    result = CliRunner().invoke(main, ["deploy-model", "m", folder, "--version", "4"])
    assert result.exit_code == 0 and "never served" not in result.output, result.output
    assert (fake.knobs[0]["previous_versions"], fake.knobs[0]["retired_versions"]) == (["1", "3"], [])


def test_register_app_keeps_what_was_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    app = AppConfig(name="ens", policy="exp3", slo_ms=80.0, default_output=-1, policy_config={"eta": 0.2})
    fake = NoKafka(RegistryView(apps={"ens": app})).install(monkeypatch)
    result = CliRunner().invoke(main, ["register-app", "ens", "--slo-ms", "300"])
    assert result.exit_code == 0 and "app ens updated" in result.output, result.output
    assert fake.writes == [("app", ("ens", "exp3", 300.0, -1, {"eta": 0.2}))]


def test_unlinking_a_model_that_is_not_linked_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    view = RegistryView(apps={"digits": AppConfig(name="digits", policy="exp4", slo_ms=50.0, default_output=None)},
                        models={"m": _model()})
    fake = NoKafka(view).install(monkeypatch)
    result = CliRunner().invoke(main, ["link", "digits", "m", "--unlink"])
    assert result.exit_code == 0 and "m is not linked to digits: nothing to unlink" in result.output
    assert fake.writes == []


MODEL_ENTRY = "  - {name: m, path: models/m/1%s}\n"


@pytest.mark.parametrize(("text", "reason"), [
    ("apps: []\nmodels:\n" + MODEL_ENTRY % ", replica: 2", "models[0] (m): unknown key `replica`; did you mean `replicas`?"),
    ("models:\n" + MODEL_ENTRY % "" + "apps:\n  - {name: a, polcy: exp3, models: [m]}\n",
     "apps[0] (a): unknown key `polcy`; did you mean `policy`?"),
    ("modles:\n" + MODEL_ENTRY % "", "unknown key `modles`; did you mean `models`?"),
    ("apps: []\nmodels:\n" + MODEL_ENTRY % ", colour: red", "unknown key `colour`; the keys are name, version"),
])
def test_an_app_files_unknown_key_is_named(tmp_path: Path, text: str, reason: str) -> None:
    _model_dir(tmp_path)
    (tmp_path / "app.yaml").write_text(text)
    with pytest.raises(ConfigError) as info:
        load_app_file(tmp_path / "app.yaml")
    assert reason in str(info.value)


def test_apply_refuses_another_folder_for_a_registered_version_before_writing(tmp_path: Path) -> None:
    _model_dir(tmp_path)
    (tmp_path / "app.yaml").write_text("models:\n" + MODEL_ENTRY % ", version: '1'")
    view = RegistryView(models={"m": _model("1", "/elsewhere/m/1")})
    with pytest.raises(ConfigError, match=r"version 1 is deployed from /elsewhere/m/1, not .*: give the new folder "
                                          r"a new version \(`version:` in .*app.yaml\)"):
        apply_file(Settings(), tmp_path / "app.yaml", view)  # refused before a writer is made


def test_an_app_files_missing_model_folder_is_named_with_where_paths_start(tmp_path: Path) -> None:
    (tmp_path / "app.yaml").write_text("models:\n  - {name: ghost, path: models/ghost/1}\n")
    with pytest.raises(ConfigError, match=r"models\[0\] \(ghost\): no folder .*models/ghost/1 to hold its model.yaml "
                                          r"\(a model's `path` is relative to the app file"):
        load_app_file(tmp_path / "app.yaml")


def test_topics_create_refuses_replicas_without_a_model() -> None:
    result = CliRunner().invoke(main, ["topics", "create", "--replicas", "3"])
    assert result.exit_code == 2 and "name the model with --model" in result.output


def test_an_app_file_linking_models_of_other_classes_is_refused(tmp_path: Path) -> None:
    from clipstream.testing.models import make_python_model

    code = "class Model:\n    def __init__(self, path, config): pass\n    def predict_batch(self, x): return x\n"
    for name, labels in (("a", ["cat", "dog"]), ("b", ["dog", "cat"]), ("c", ["cat", "cow"])):
        make_python_model(tmp_path / "models", name, code, labels=labels, shape=(2,))
    models = "".join(f"  - {{name: {n}, path: models/{n}/1}}\n" for n in "abc")
    (tmp_path / "ok.yaml").write_text(f"apps:\n  - {{name: pets, models: [a, b]}}\nmodels:\n{models}")
    assert load_app_file(tmp_path / "ok.yaml").apps[0]["models"] == ["a", "b"]  # the same classes, reordered
    (tmp_path / "bad.yaml").write_text(f"apps:\n  - {{name: pets, models: [a, c]}}\nmodels:\n{models}")
    with pytest.raises(ConfigError, match=r"app pets links model c, but its labels \['cat', 'cow'\] are not those of 'a'"):
        load_app_file(tmp_path / "bad.yaml")


def test_remove_app_deletes_its_links_and_record_and_its_learnt_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    import fnmatch

    import frontend.cli as registry_cli
    from registry.topic import AppConfig

    app = AppConfig(name="digits", policy="exp4", slo_ms=50, default_output=None, models=("m",))
    fake = NoKafka(RegistryView(apps={"digits": app}, models={"m": _model()})).install(monkeypatch)
    held = {"cs:state:digits:__global__", "cs:state:digits:user-1", "cs:contexts:digits", "cs:state:digits-2:__global__"}

    class Redis:
        def scan_iter(self, match: str, count: int) -> list[str]:
            return [k for k in sorted(held) if fnmatch.fnmatchcase(k, match)]

        def unlink(self, *keys: str) -> int:
            gone = held & set(keys)
            held.difference_update(gone)
            return len(gone)

    monkeypatch.setattr(registry_cli, "sync_client", lambda settings: Redis())
    shown = CliRunner().invoke(main, ["remove-app", "digits"])
    assert shown.exit_code == 0, shown.output
    assert fake.writes == [("delete", ("link:digits:m",)), ("delete", ("app:digits",))]
    assert "app digits removed; its models stay: m" in shown.output and "3 keys of digits's learnt weights deleted" in shown.output
    assert held == {"cs:state:digits-2:__global__"}  # another app's, though its name begins the same
    missing = CliRunner().invoke(main, ["remove-app", "nope"])
    assert missing.exit_code == 1 and "no app 'nope' in the registry" in missing.output


def test_a_group_is_not_named_like_a_model_in_the_registry_nor_a_model_like_a_group(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from registry.groups import groups_of

    _model_dir(tmp_path)
    (tmp_path / "app.yaml").write_text("models:\n" + MODEL_ENTRY % ", group: g")
    taken = RegistryView(models={"g": replace(_model("1", "/models/g/1"), name="g")})
    with pytest.raises(ConfigError, match=r"group 'g' \(of model m\) has the name of model g in the registry"):
        apply_file(Settings(), tmp_path / "app.yaml", taken)  # refused before a writer is made
    members = {n: replace(_model("1", f"/models/{n}/1"), name=n, group="m") for n in ("a", "b")}
    grouped = RegistryView(models=members, groups=groups_of(members))
    NoKafka(grouped).install(monkeypatch)
    result = CliRunner().invoke(main, ["deploy-model", "m", str(tmp_path / "models" / "m" / "1")])
    _one_line_error(result, 1, "model 'm' has the name of a group in the registry")


def test_applying_a_file_without_versions_again_keeps_what_deploy_model_set(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import registry.appfile as appfile

    folder = str(_model_dir(tmp_path).resolve())
    (tmp_path / "app.yaml").write_text("models:\n" + MODEL_ENTRY % "")  # no `version:`
    deployed = _model("2", "/elsewhere/m/2", previous_versions=("1",), previous_paths=(folder,), replicas=3)
    written: list[dict[str, object]] = []

    class Writer:
        def __init__(self, settings: Settings) -> None:
            pass

        def __enter__(self) -> "Writer":
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def model(self, **record: object) -> None:
            written.append(record)

    monkeypatch.setattr(appfile, "RegistryWriter", Writer)
    monkeypatch.setattr(appfile, "ensure_model_topics", lambda *a: None)
    apply_file(Settings(), tmp_path / "app.yaml", RegistryView(models={"m": deployed}))  # up's next start
    ((record),) = written
    assert (record["version"], record["path"]) == ("2", "/elsewhere/m/2")
    assert record["previous_versions"] == ["1"]  # a rollback still returns to the file's folder
    assert record["replicas"] == 3  # what `set-replicas` set stays, as the file names no count
    (tmp_path / "app.yaml").write_text("models:\n" + MODEL_ENTRY % ", replicas: 2")
    apply_file(Settings(), tmp_path / "app.yaml", RegistryView(models={"m": deployed}))
    assert written[-1]["replicas"] == 2  # a count the file names is applied
    apply_file(Settings(), tmp_path / "app.yaml", RegistryView())  # a new model
    (tmp_path / "app.yaml").write_text("models:\n" + MODEL_ENTRY % "")
    apply_file(Settings(), tmp_path / "app.yaml", RegistryView())
    assert written[-1]["replicas"] == 1


def test_an_app_file_linking_models_of_other_inputs_or_answers_is_refused(tmp_path: Path) -> None:
    from clipstream.testing.models import make_python_model

    code = "class Model:\n    def __init__(self, path, config): pass\n    def predict_batch(self, x): return x\n"
    make_python_model(tmp_path / "models", "text", code, labels=["neg", "pos"], dtype="string", shape=())
    make_python_model(tmp_path / "models", "size", code, kind="regression", dtype="bytes", shape=())
    make_python_model(tmp_path / "models", "mood", code, kind="label", dtype="string", shape=())
    make_python_model(tmp_path / "models", "count", code, kind="regression", dtype="string", shape=())
    models = "".join(f"  - {{name: {n}, path: models/{n}/1}}\n" for n in ("text", "size", "mood", "count"))
    for linked, reason in ((["text", "size"], r"app both links model size, but it takes bytes \[\] and 'text' takes "
                                              r"string \[\]: an app's models must take the same input"),
                           (["text", "count"], r"it answers regression and 'text' answers class_scores: an app's "
                                               "models must answer the same kind of thing")):
        (tmp_path / "bad.yaml").write_text(f"apps:\n  - {{name: both, models: {linked}}}\nmodels:\n{models}".replace(
            "'", ""))
        with pytest.raises(ConfigError, match=reason):
            load_app_file(tmp_path / "bad.yaml")
    (tmp_path / "ok.yaml").write_text(f"apps:\n  - {{name: both, models: [text, mood]}}\nmodels:\n{models}")
    assert load_app_file(tmp_path / "ok.yaml").apps[0]["models"] == ["text", "mood"]  # classes by scores or label
