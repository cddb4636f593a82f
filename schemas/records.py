"""One frozen dataclass per Avro record: what stages pass to each other instead of dicts.

Field names, order and defaults are those of ``clipstream.<Name>.avsc`` (a unit test holds
the two together), so the wire format is the schema's and records written as plain dicts
still decode. Lists and maps stay mutable inside a frozen record: a stage stamps ``trace``
on the record it forwards without copying it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal, TypeVar, Union

import numpy as np

from schemas.tensor import array_of, tensor_fields

# what a model's output means: the selector combines class scores, labels or numbers
OutputKind = Literal["class_scores", "label", "regression"]
Scalar = Union[bool, int, float, str, None]
Trace = dict[str, int]


@dataclass(frozen=True, slots=True)
class Tensor:
    dtype: str
    shape: list[int]
    data: bytes

    @classmethod
    def of(cls, array: Any) -> Tensor:
        """The tensor of anything numpy turns into an array (little-endian, C order)."""
        return cls(*tensor_fields(array))

    def array(self) -> np.ndarray:
        """The array this tensor holds, without copying its bytes; a mismatch is a DecodeError."""
        return array_of(self.dtype, self.shape, self.data)


@dataclass(frozen=True, slots=True)
class QueryEvent:
    query_id: str
    app: str
    context: str | None
    input: Tensor
    created_us: int
    deadline_us: int
    reply_topic: str | None = None
    reply_partition: int | None = None
    trace: Trace = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ModelRequest:
    query_id: str
    app: str
    model: str
    input: Tensor
    deadline_us: int
    selector_partition: int
    trace: Trace = field(default_factory=dict)
    also: list[str] = field(default_factory=list)  # more models this query asks (docs/design/0082)
    reply_topic: str | None = None  # a one-model app's query answered by its model (docs/design/0083)
    reply_partition: int | None = None


@dataclass(frozen=True, slots=True)
class BatchItem:
    query_id: str
    selector_partition: int
    deadline_us: int
    cache_key: str | None
    input: Tensor
    trace: Trace = field(default_factory=dict)
    reply_topic: str | None = None
    reply_partition: int | None = None
    models: list[str] = field(default_factory=list)  # a group's members this item needs (docs/design/0088)


@dataclass(frozen=True, slots=True)
class Batch:
    batch_id: str
    model: str
    version: str | None
    replica: int
    created_us: int
    items: list[BatchItem]


@dataclass(frozen=True, slots=True)
class Prediction:
    query_id: str
    model: str
    version: str | None
    status: str
    output: Tensor | None = None
    error: str | None = None
    trace: Trace = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Predictions:
    selector_partition: int
    items: list[Prediction]


@dataclass(frozen=True, slots=True)
class Response:
    query_id: str
    app: str
    output: Scalar
    scores: list[float] | None
    labels: list[str] | None
    confidence: float
    is_default: bool
    default_reason: str | None
    answered: list[str]
    missing: list[str]
    created_us: int
    deadline_us: int
    trace: Trace = field(default_factory=dict)

    def __getitem__(self, name: str) -> Any:
        """``response["output"]``: the answer read as the plain dict it was before records were
        typed, so application code written that way keeps working."""
        if name not in _NAMES[Response]:
            raise KeyError(name)
        return getattr(self, name)


@dataclass(frozen=True, slots=True)
class Feedback:
    query_id: str
    app: str
    context: str | None
    label: Scalar
    reward: float | None
    created_us: int


@dataclass(frozen=True, slots=True)
class BatchStats:
    batch_id: str
    model: str
    replica: int
    batch_size: int
    service_us: int
    queue_wait_us: int
    errors: int
    worker_id: str
    created_us: int


@dataclass(frozen=True, slots=True)
class App:
    name: str
    policy: str
    slo_ms: float
    default_output: Scalar = None
    policy_config: dict[str, float] = field(default_factory=dict)
    updated_us: int = 0


@dataclass(frozen=True, slots=True)
class Model:
    name: str
    version: str
    path: str
    replicas: int = 1
    previous_versions: list[str] = field(default_factory=list)
    previous_paths: list[str] = field(default_factory=list)
    latency_objective_ms: float | None = None
    max_batch_size: int | None = None
    batch_delay_ms: float | None = None
    updated_us: int = 0
    group: str | None = None  # served together with the group's other models (docs/design/0088)
    retired_versions: list[str] = field(default_factory=list)  # left by a rollback (docs/design/0098)
    retired_paths: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Link:
    app: str
    model: str
    linked: bool = True
    updated_us: int = 0


@dataclass(frozen=True, slots=True)
class DeadLetter:
    stage: str
    reason: str
    source_topic: str | None
    source_partition: int | None
    source_offset: int | None
    query_id: str | None
    payload: bytes | None
    created_us: int


Record = Union[
    Tensor, QueryEvent, ModelRequest, BatchItem, Batch, Prediction, Predictions, Response,
    Feedback, BatchStats, App, Model, Link, DeadLetter,
]
RECORD_TYPES: tuple[type, ...] = (
    Tensor, QueryEvent, ModelRequest, BatchItem, Batch, Prediction, Predictions, Response,
    Feedback, BatchStats, App, Model, Link, DeadLetter,
)
BY_NAME: dict[str, type] = {cls.__name__: cls for cls in RECORD_TYPES}
R = TypeVar("R")

# fields that hold records: (field, record type, is a list)
_NESTED: dict[type, tuple[tuple[str, type, bool], ...]] = {
    QueryEvent: (("input", Tensor, False),),
    ModelRequest: (("input", Tensor, False),),
    BatchItem: (("input", Tensor, False),),
    Batch: (("items", BatchItem, True),),
    Prediction: (("output", Tensor, False),),
    Predictions: (("items", Prediction, True),),
}
_NAMES: dict[type, tuple[str, ...]] = {cls: tuple(f.name for f in fields(cls)) for cls in RECORD_TYPES}


# where a prediction goes: (a gateway's reply topic, its partition), or (None, a partition of
# ``predictions``)
Route = tuple[Union[str, None], int]


def route_of(record: ModelRequest | BatchItem) -> Route:
    """Where the prediction for a request (or its batch item) goes: its reply target when it has
    one (a one-model app's query sent by the gateway, docs/design/0083), else its selector's
    partition of ``predictions``."""
    if record.reply_topic:
        return record.reply_topic, record.reply_partition or 0
    return None, record.selector_partition


def to_avro(record: Any) -> dict[str, Any]:
    """The plain dict fastavro writes; nested records become dicts too."""
    cls = type(record)
    out = {name: getattr(record, name) for name in _NAMES[cls]}
    for name, _, many in _NESTED.get(cls, ()):
        value = out[name]
        if value is None:
            continue
        out[name] = [to_avro(v) for v in value] if many else to_avro(value)
    return out


def from_avro(cls: type[R], data: dict[str, Any]) -> R:
    """The record of type ``cls`` from the dict fastavro read (every field present)."""
    nested = _NESTED.get(cls)
    if nested:
        data = dict(data)
        for name, inner, many in nested:
            value = data[name]
            if value is None:
                continue
            data[name] = [from_avro(inner, v) for v in value] if many else from_avro(inner, value)
    return cls(**data)

