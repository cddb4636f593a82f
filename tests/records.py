"""One valid sample of every record type, for round-trip tests."""

from __future__ import annotations

from typing import Any

import numpy as np

from schemas import to_tensor

T = to_tensor(np.arange(6, dtype=np.float32).reshape(2, 3))


def samples() -> dict[str, dict[str, Any]]:
    item = {
        "query_id": "q1",
        "selector_partition": 2,
        "deadline_us": 1_700_000_000_050_000,
        "cache_key": "cs:cache:m:1:abc",
        "input": T,
        "trace": {"batcher_in": 1},
        "reply_topic": "clipstream.replies.gw1",
        "reply_partition": 0,
        "models": [],
    }
    pred = {
        "query_id": "q1",
        "model": "m",
        "version": "1",
        "status": "ok",
        "output": to_tensor(np.array([0.1, 0.9], dtype=np.float32)),
        "error": None,
        "trace": {"worker_out": 5},
    }
    return {
        "Tensor": T,
        "QueryEvent": {
            "query_id": "q1",
            "app": "digits",
            "context": "user-42",
            "input": T,
            "created_us": 1_700_000_000_000_000,
            "deadline_us": 1_700_000_000_050_000,
            "reply_topic": "clipstream.replies.gw1",
            "reply_partition": 0,
            "trace": {"produced": 1_700_000_000_000_000},
        },
        "ModelRequest": {
            "query_id": "q1",
            "app": "digits",
            "model": "m",
            "input": T,
            "deadline_us": 1_700_000_000_050_000,
            "selector_partition": 2,
            "trace": {},
            "also": ["m2"],
            "reply_topic": None,
            "reply_partition": None,
        },
        "BatchItem": item,
        "Batch": {
            "batch_id": "b1",
            "model": "m",
            "version": "1",
            "replica": 0,
            "created_us": 3,
            "items": [item, {**item, "query_id": "q2", "cache_key": None, "reply_topic": None,
                             "reply_partition": None, "models": ["m", "m2"]}],
        },
        "Prediction": pred,
        "Predictions": {
            "selector_partition": 2,
            "items": [pred, {**pred, "status": "error", "output": None, "error": "bad shape"}],
        },
        "Response": {
            "query_id": "q1",
            "app": "digits",
            "output": 7,
            "scores": [0.1, 0.9],
            "labels": ["0", "1"],
            "confidence": 0.6,
            "is_default": False,
            "default_reason": None,
            "answered": ["a", "b"],
            "missing": ["c"],
            "created_us": 1,
            "deadline_us": 2,
            "trace": {"joined": 3},
        },
        "Feedback": {
            "query_id": "q1",
            "app": "digits",
            "context": None,
            "label": "cat",
            "reward": None,
            "created_us": 9,
        },
        "BatchStats": {
            "batch_id": "b1",
            "model": "m",
            "replica": 1,
            "batch_size": 8,
            "service_us": 9130,
            "queue_wait_us": 120,
            "errors": 0,
            "worker_id": "w-1",
            "created_us": 5,
        },
        "App": {
            "name": "digits",
            "policy": "exp4",
            "slo_ms": 50.0,
            "default_output": -1,
            "policy_config": {"eta": 0.1},
            "updated_us": 1,
        },
        "Model": {
            "name": "m",
            "version": "2",
            "path": "/models/m/2",
            "replicas": 2,
            "previous_versions": ["1"],
            "previous_paths": ["/models/m/1"],
            "latency_objective_ms": 20.0,
            "max_batch_size": 64,
            "batch_delay_ms": 2.0,
            "updated_us": 1,
            "group": "digits",
            "retired_versions": ["3"],
            "retired_paths": ["/models/m/3"],
        },
        "Link": {"app": "digits", "model": "m", "linked": True, "updated_us": 1},
        "DeadLetter": {
            "stage": "worker",
            "reason": "input shape [3] does not match the model's [64]",
            "source_topic": "clipstream.batches.m",
            "source_partition": 0,
            "source_offset": 42,
            "query_id": "q1",
            "payload": b"\x00\x01",
            "created_us": 7,
        },
    }
