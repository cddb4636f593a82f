"""model.yaml as an ML engineer writes it, mistakes included: each refused with what to fix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from clipstream.errors import ConfigError
from registry.spec import load_spec


def _folder(tmp_path: Path, text: str, files: tuple[str, ...] = ("model.onnx",)) -> Path:
    folder = tmp_path / "m" / "1"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.yaml").write_text(text)
    for name in files:
        (folder / name).write_bytes(b"")
    return folder


GOOD = "backend: onnx\nfile: model.onnx\ninput: {dtype: float32, shape: [4]}\noutput: {kind: class_scores, labels: [a, b]}\n"


def test_a_good_spec_loads(tmp_path: Path) -> None:
    spec = load_spec(_folder(tmp_path, GOOD))
    assert spec.file == "model.onnx" and spec.input.shape == (4,)


@pytest.mark.parametrize(("text", "files", "reason"), [
    (GOOD, (), r"file 'model.onnx' is not in .*m/1"),
    (GOOD.replace("output:", "ouptut:"), ("model.onnx",), r"unknown key `ouptut`: did you mean `output`\?"),
    (GOOD + "allow_spinnig: true\n", ("model.onnx",), r"unknown key `allow_spinnig`: did you mean `allow_spinning`\?"),
    (GOOD + "outputname: probs\n", ("model.onnx",), r"unknown key `outputname`: did you mean `output_name`\?"),
    (GOOD.replace("labels:", "lables:"), ("model.onnx",), r"output has the unknown key `lables`; its keys are kind, labels"),
    (GOOD.replace("input:", "Input:"), ("model.onnx",), r"unknown key `Input`: did you mean `input`\?"),
    (GOOD + "max_batch_szie: 4\n", ("model.onnx",),
     r"unknown key `max_batch_szie`: did you mean `max_batch_size`\? `max_batch_size` is not read from model.yaml"),
    (GOOD + "replica: 2\n", ("model.onnx",), r"unknown key `replica`: did you mean `replicas`\? `replicas` is not read"),
    (GOOD + "threads: many\n", ("model.onnx",), r"threads must be a positive integer, got 'many'"),
    (GOOD + "threads: 0\n", ("model.onnx",), r"threads must be a positive integer, got 0"),
    (GOOD.replace("[4]", "[null, 4]"), ("model.onnx",), r"input.shape must be .*leave the batch axis out"),
    (GOOD.replace("onnx", "torch").replace("float32", "string"), ("model.torch",),
     r"a torch model takes numbers, not input.dtype string: serve .* with the python backend"),
])
def test_a_mistake_in_model_yaml_is_refused_saying_what_to_fix(tmp_path: Path, text: str, files: tuple[str, ...],
                                                                reason: str) -> None:
    with pytest.raises(ConfigError, match=reason):
        load_spec(_folder(tmp_path, text, files))


def test_a_python_models_own_keys_are_left_to_it(tmp_path: Path) -> None:
    text = "backend: python\nclass: m:Model\ninput: {dtype: float32, shape: [4]}\noutput: {kind: regression}\n" \
           "config: {depth: 3}\nthreshold: 0.5\n"
    assert load_spec(_folder(tmp_path, text, ())).config["threshold"] == 0.5


def test_text_and_bytes_inputs_are_declared(tmp_path: Path) -> None:
    text = "backend: python\nclass: m:Model\ninput: {dtype: string, shape: []}\noutput: {kind: regression}\n"
    spec = load_spec(_folder(tmp_path, text, ()))
    assert (spec.input.dtype, spec.input.shape) == ("string", ())
    assert load_spec(_folder(tmp_path, text.replace("string", "bytes"), ())).input.dtype == "bytes"


def test_an_example_is_one_real_input_for_the_models_start(tmp_path: Path) -> None:
    from registry.spec import example_input

    text = "backend: python\nclass: m:Model\ninput: {dtype: bytes, shape: []}\noutput: {kind: regression}\n"
    with pytest.raises(ConfigError, match="example 'x.png' is not in"):
        load_spec(_folder(tmp_path, text + "example: x.png\n", ()))
    folder = _folder(tmp_path, text + "example: x.png\n", ())
    (folder / "x.png").write_bytes(b"\x89PNG")
    assert example_input(load_spec(folder), 2).tolist() == [b"\x89PNG", b"\x89PNG"]
    assert example_input(load_spec(_folder(tmp_path, text, ())), 2) is None  # no example: not tried

    numbers = GOOD + "example: one.npy\n"
    folder = _folder(tmp_path, numbers, ("model.onnx",))
    np.save(folder / "one.npy", np.array([1, 2, 3, 4], np.float32))
    assert example_input(load_spec(folder), 2).shape == (2, 4)
    np.save(folder / "one.npy", np.zeros(3, np.float32))
    with pytest.raises(ConfigError, match=r"example 'one.npy' is not one input of the model: input shape \[3\]"):
        example_input(load_spec(folder), 1)
    with pytest.raises(ConfigError, match="example must name a file in the model's folder"):
        load_spec(_folder(tmp_path, GOOD + "example: ../x\n", ("model.onnx",)))


def test_an_example_of_several_strings_or_numbers_may_be_json(tmp_path: Path) -> None:
    from registry.spec import example_input

    text = "backend: python\nclass: m:Model\ninput: {dtype: string, shape: [2]}\noutput: {kind: regression}\n"
    folder = _folder(tmp_path, text + "example: pair.json\n", ())
    (folder / "pair.json").write_text('["a question", "its passage"]')
    assert example_input(load_spec(folder), 2).tolist() == [["a question", "its passage"]] * 2
    (folder / "pair.json").write_text('["only one"]')
    with pytest.raises(ConfigError, match=r"example 'pair.json' is not one input of the model: input shape \[1\]"):
        example_input(load_spec(folder), 1)
    (folder / "pair.json").write_text('["a", ')
    with pytest.raises(ConfigError, match="example 'pair.json' is not one input of the model"):
        example_input(load_spec(folder), 1)
    raw = _folder(tmp_path, text.replace("string", "bytes") + "example: pair.json\n", ())
    (raw / "pair.json").write_text('["ab", "c"]')
    assert example_input(load_spec(raw), 1).tolist() == [[b"ab", b"c"]]
    numbers = _folder(tmp_path, GOOD + "example: one.json\n", ("model.onnx",))
    (numbers / "one.json").write_text("[1, 2, 3, 4.5]")
    assert example_input(load_spec(numbers), 1).tolist() == [[1, 2, 3, 4.5]]


@pytest.mark.parametrize("key", ["max_batch_size", "replicas", "max_batch_time", "dynamic_batching"])
def test_serving_knobs_in_model_yaml_are_refused_naming_the_app_file(tmp_path: Path, key: str) -> None:
    with pytest.raises(ConfigError, match=f"`{key}` is not read from model.yaml: .* goes in its entry of the app file"):
        load_spec(_folder(tmp_path, GOOD + f"{key}: 8\n", ("model.onnx",)))
