"""Models of text and bytes (``dtype: string`` / ``bytes``) on `clipstream up`: a scikit-learn
TF-IDF classifier answers JSON strings, a raw UTF-8 body, Triton's client (the Open Inference
Protocol) and a Kafka client's query as it does in process, and a bytes model gets its callers'
bytes unchanged (docs/design/0111, 0113)."""

from __future__ import annotations

import os
import pickle
import uuid
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from clipstream.infra.launcher import pick_free_ports
from clipstream.testing.models import make_python_model, write_model_yaml
from clipstream.testing.procs import UpProcess, predict_admitted
from frontend.client import Client, GatewayInputError
from frontend.producer import Producer, ResponseReader

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

REVIEWS = [
    ("a wonderful film, I loved every minute", "pos"), ("great acting and a moving story", "pos"),
    ("brilliant, funny and warm", "pos"), ("the best film of the year", "pos"),
    ("a dull, boring mess", "neg"), ("terrible acting and a silly plot", "neg"),
    ("I hated it, a waste of time", "neg"), ("the worst film of the year", "neg"),
]

SENTIMENT = '''
import pickle
from pathlib import Path

import numpy as np


class Sentiment:
    """A scikit-learn pipeline over raw text: the batch is an object array of str."""
    def __init__(self, path, config):
        self.pipe = pickle.loads((Path(path) / "pipe.pkl").read_bytes())

    def predict_batch(self, texts):
        assert texts.dtype == object and all(isinstance(t, str) for t in texts)
        return self.pipe.predict_proba(list(texts)).astype(np.float32)
'''

LENGTH = '''
import numpy as np


class Length:
    """How many bytes each input holds: what a bytes model is sent is what it gets."""
    def __init__(self, path, config):
        pass

    def predict_batch(self, blobs):
        assert all(isinstance(b, bytes) for b in blobs)
        if not all(blobs):  # as a decoder of images: no empty one (the start tries none on it)
            raise ValueError("an empty input")
        return np.array([float(len(b)) for b in blobs])
'''


def _pipeline():  # noqa: ANN202
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    texts, labels = zip(*REVIEWS)
    return make_pipeline(TfidfVectorizer(), LogisticRegression(C=10.0)).fit(texts, labels)


def test_text_and_bytes_models_answer_json_raw_bodies_and_kafka_clients(settings, tmp_path):
    pipe = _pipeline()
    models = tmp_path / "models"
    folder = make_python_model(models, "sentiment", SENTIMENT, labels=["neg", "pos"], class_name="Sentiment",
                               dtype="string", shape=())
    (folder / "pipe.pkl").write_bytes(pickle.dumps(pipe))
    make_python_model(models, "length", LENGTH, class_name="Length", kind="regression", dtype="bytes", shape=())
    # the same pipeline saved with joblib, served with no class of ours (backend: sklearn)
    import joblib

    saved = models / "saved" / "1"
    saved.mkdir(parents=True)
    joblib.dump(pipe, saved / "pipe.joblib")
    write_model_yaml(saved, {"backend": "sklearn", "file": "pipe.joblib", "input": {"dtype": "string", "shape": []},
                             "output": {"kind": "class_scores", "labels": ["neg", "pos"]}})
    tag = uuid.uuid4().hex[:6]
    reviews, sizes, joblibbed = f"reviews{tag}", f"sizes{tag}", f"saved{tag}"
    (tmp_path / "app.yaml").write_text(yaml.safe_dump({
        "apps": [{"name": reviews, "policy": "single", "slo_ms": 3000, "default_output": "none",
                  "models": ["sentiment"]},
                 {"name": sizes, "policy": "single", "slo_ms": 3000, "default_output": -1, "models": ["length"]},
                 {"name": joblibbed, "policy": "single", "slo_ms": 3000, "models": ["saved"]}],
        "models": [{"name": "sentiment", "version": "1", "path": "models/sentiment/1", "replicas": 1},
                   {"name": "length", "version": "1", "path": "models/length/1", "replicas": 1},
                   {"name": "saved", "version": "1", "path": "models/saved/1", "replicas": 1}],
    }))
    port = pick_free_ports(1)[0]
    env = {**os.environ, "CLIPSTREAM_TOPIC_PREFIX": settings.topic_prefix,
           "CLIPSTREAM_STATE_DIR": str(tmp_path / "state"), "PYTHONUNBUFFERED": "1"}
    up = UpProcess(tmp_path / "app.yaml", port, env, ROOT)
    client = Client(f"http://127.0.0.1:{port}")
    try:
        up.wait_ready(240)
        assert f"note: {reviews} takes string inputs, which up cannot make up: not warmed up" in up.lines
        text = "a moving story, and the best acting of the year"
        want = pipe.predict_proba([text])[0]

        by_json = predict_admitted(client, reviews, text)
        assert by_json["default"] is False and by_json["models"]["answered"] == ["sentiment"], by_json
        assert by_json["output"] == "pos" and by_json["labels"] == ["neg", "pos"]
        np.testing.assert_allclose(by_json["scores"], want, rtol=1e-5)
        by_body = predict_admitted(client, reviews, "a dull and silly waste of time", binary=True)
        assert by_body["default"] is False and by_body["output"] == "neg", by_body
        by_joblib = predict_admitted(client, joblibbed, text)
        assert by_joblib["default"] is False and by_joblib["output"] == "pos", by_joblib
        np.testing.assert_allclose(by_joblib["scores"], want, rtol=1e-5)

        meta = httpx.get(f"http://127.0.0.1:{port}/v1/apps/{reviews}").json()
        assert meta["input"] == {"dtype": "string", "shape": []}
        with pytest.raises(GatewayInputError, match="expected a string"):
            client.predict(reviews, 3)
        with pytest.raises(GatewayInputError, match="not UTF-8"):
            client.predict(reviews, b"\xff\xfe", binary=True)

        # bytes go to the model as they were sent; a JSON string as its UTF-8
        blob = bytes(range(256)) * 3  # no UTF-8 text
        assert predict_admitted(client, sizes, blob, binary=True)["output"] == len(blob)
        assert predict_admitted(client, sizes, "héllo")["output"] == len("héllo".encode())

        # Triton's own client, over the Open Inference Protocol: a batch of three strings, sent as
        # its binary data extension by default, is three queries answered in order
        import tritonclient.http as triton

        texts = ["brilliant and warm", "a waste of time", "great acting"]
        v2 = triton.InferenceServerClient(f"127.0.0.1:{port}")
        assert v2.is_server_live() and v2.is_model_ready(reviews)
        assert v2.get_model_metadata(reviews)["inputs"] == [{"name": "input", "datatype": "BYTES", "shape": [-1]}]
        tensor = triton.InferInput("input", [3], "BYTES")
        tensor.set_data_from_numpy(np.array(texts, dtype=object))
        result = v2.infer(reviews, [tensor], parameters={"slo_ms": 3000})
        assert result.as_numpy("output").tolist() == [b"pos", b"neg", b"pos"]  # BYTES as bytes, as Triton's
        np.testing.assert_allclose(result.as_numpy("scores"), pipe.predict_proba(texts), rtol=1e-5)
        assert not result.as_numpy("default").any()

        # a Kafka client's query, through the selector, answers as the gateway does
        with ResponseReader(settings) as reader, Producer(settings=settings) as producer:
            asked = {producer.send_query(reviews, t): label for t, label in
                     (("brilliant and warm", "pos"), ("boring, the worst", "neg"))}
            asked[producer.send_query(sizes, np.array(b"\x00\x01\x02"))] = 3.0
            producer.flush()
            got = reader.collect(set(asked), timeout_s=60)
        assert {q: r.output for q, r in got.items()} == asked, got
        assert not any(r.is_default for r in got.values())
    finally:
        client.close()
        assert up.stop() == 0, "\n".join(up.lines[-40:])
