"""The batcher process's plumbing: consumer group names, and a fetch split among its models."""

from __future__ import annotations

from typing import Any

from batchers.app import deliver_by_topic, group_name
from batchers.service import ModelSetup
from clipstream.settings import Settings


def test_group_names() -> None:
    s = Settings(topic_prefix="p.")
    one = ModelSetup("m", "1", 1, 20.0, 8, 2.0)
    assert group_name(s, [one]) == "p.batcher.m"  # a one-model batcher keeps its group (offsets carry over)
    two = [ModelSetup(n, "1", 1, 20.0, 8, 2.0) for n in ("z", "a")]
    assert group_name(s, two) == "p.batcher.a+z"
    many = [ModelSetup(f"model-with-a-long-name-{i}", "1", 1, 20.0, 8, 2.0) for i in range(10)]
    g = group_name(s, many)
    assert g.startswith("p.batcher.shared-") and len(g) < 40


def test_a_fetch_is_split_by_topic_and_one_models_failure_spares_the_others() -> None:
    got: dict[str, list[int]] = {}

    def accept(svc: str, part: list[Any]) -> None:
        if svc == "bad":
            raise RuntimeError("boom")
        got.setdefault(svc, []).extend(offset for _, (_, _, offset) in part)

    records = [(b"", ("t.a", 0, 1)), (b"", ("t.bad", 0, 2)), (b"", ("t.a", 0, 3)), (b"", ("t.b", 0, 4))]
    deliver_by_topic(records, {"t.a": "a", "t.bad": "bad", "t.b": "b"}, accept)  # type: ignore[arg-type]
    assert got == {"a": [1, 3], "b": [4]}
