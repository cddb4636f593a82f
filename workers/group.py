"""A group's batch through every member: one batch and one process for several models.

A group (``registry.groups``, docs/design/0088) is served as one model: its batcher sends one
batch holding every member's work, and one worker runs it through each member in turn. An item
names the members it still needs after the cache (``BatchItem.models``; empty: all of them),
so a member the cache answered is not asked again. Every member's predictions for an item go
into the one ``Predictions`` record of its destination. A member that fails answers its own
items with errors; the others still answer.

The worker serves a ``BatchModel`` or a ``GroupModel``; ``prepare``, ``run`` and ``warm`` pick
the path for either, so the worker's loop stays the same for both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from clipstream.cachekey import key_of
from clipstream.clock import now_us
from clipstream.errors import ClipstreamError, ConfigError, ModelError, one_line
from registry.spec import ModelSpec, example_input
from schemas import Batch, BatchItem
from workers.backends import BatchModel, warm_up
from workers.batch import (Answerer, BatchOutcome, Prepared, Ran, answer_items, answer_tensor, batch_stats,
                           finish_batch, output_rows, predict_rows, prepare_batch, run_batch)
from workers.failures import ModelFailures


@dataclass(frozen=True)
class Member:
    """One model of a group, at the version the registry names for it."""

    name: str
    version: str | None
    model: BatchModel


def needs(item: BatchItem, member: str) -> bool:
    """Whether ``item`` still needs ``member``'s prediction (naming none, it needs every one)."""
    return not item.models or member in item.models


@dataclass(frozen=True)
class GroupModel:
    """A group served as one model: the worker reads its ``spec`` and ``device`` as it would a
    ``BatchModel``'s, and its batches are checked once against the input the members share."""

    name: str
    version: str | None  # the group's (``GroupConfig.version``), stamped on its batches
    members: tuple[Member, ...]  # in the order they run

    def __post_init__(self) -> None:
        # the batch is checked and stacked once, against the first member's input: a member
        # that took another input would be handed arrays it cannot read
        if not self.members:
            raise ConfigError(f"group {self.name} has no members")
        for m in self.members[1:]:
            if m.model.spec.input != self.spec.input:
                raise ConfigError(f"group {self.name}: member {m.name} takes {m.model.spec.input}, "
                                  f"{self.members[0].name} takes {self.spec.input}; members share one input")

    @property
    def spec(self) -> ModelSpec:
        """The first member's: the input every member takes."""
        return self.members[0].model.spec

    @property
    def device(self) -> str:
        """Where the members run, for log lines: ``cpu``, ``cuda``, or ``cuda+cpu`` when mixed."""
        return "+".join(dict.fromkeys(m.model.device for m in self.members))

    def answerers(self, item: BatchItem) -> list[Answerer]:
        """(name, version) of each member ``item`` needs: who answers it, an error included."""
        return [(m.name, m.version) for m in self.members if needs(item, m.name)]


@dataclass(frozen=True)
class MemberRan:
    """One member's run over the items that needed it."""

    member: Member
    items: list[int]  # indices into ``Prepared.valid``, in order
    ran: Ran


@dataclass(frozen=True)
class GroupRan:
    """What the device did with a group's batch: each member's run, timed apart."""

    parts: list[MemberRan]

    @property
    def service_us(self) -> int:
        """The batch's time on the device: its members ran one after another."""
        return sum(part.ran.service_us for part in self.parts)


def run_group(group: GroupModel, p: Prepared, clock: Callable[[], int] = now_us) -> GroupRan | None:
    """Each member's ``predict_batch`` over the rows that need it (when all do: the stacked
    inputs as they are, no copy). A member that raises fails only its own run. None: nothing
    to run."""
    if p.inputs is None:
        return None
    parts = []
    for member in group.members:
        items = [i for i, item in enumerate(p.valid) if needs(item, member.name)]
        if items:
            inputs = p.inputs if len(items) == len(p.valid) else p.inputs[items]
            parts.append(MemberRan(member, items, predict_rows(member.model, inputs, clock)))
    return GroupRan(parts)


def _member_key(member: Member) -> Callable[[BatchItem], str | None]:
    # a group's item carries its input's digest: each member's entry is keyed as its own
    return lambda item: key_of(member.name, member.version, item.cache_key) if item.cache_key else None


def finish_group(p: Prepared, ran: GroupRan | None, *, worker_id: str, clock: Callable[[], int] = now_us,
                 failures: ModelFailures | None = None) -> BatchOutcome:
    """Every member's predictions for the items that needed it, into each item's one record per
    destination; cache entries under each member's own key; one ``BatchStats`` for the batch
    (its errors: the predictions that failed, and the items answered nowhere). A member's failed
    call is told to ``failures`` under the member's name."""
    for part in ran.parts if ran is not None else []:
        m = part.member
        answer_items(p, [p.valid[i] for i in part.items], part.ran, by=(m.name, m.version), key=_member_key(m),
                     failures=failures)
    return batch_stats(p, ran.service_us if ran is not None else 0, worker_id=worker_id, clock=clock)


# -- what the worker calls, for a model or a group ---------------------------------------

Served = BatchModel | GroupModel


def prepare(model: Served, batch: Batch, **kwargs: Any) -> Prepared:
    """``prepare_batch`` (``kwargs``: its keywords) for either; a group's item that fails its
    checks gets an error prediction from each member it needs, whose names the selector knows."""
    answerers = model.answerers if isinstance(model, GroupModel) else None
    return prepare_batch(model.spec, batch, answerers=answerers, **kwargs)


def run(model: Served, p: Prepared) -> Ran | GroupRan | None:
    """The device's part for either."""
    return run_group(model, p) if isinstance(model, GroupModel) else run_batch(model, p)


def finish(p: Prepared, ran: Ran | GroupRan | None, *, worker_id: str,
           failures: ModelFailures | None = None) -> BatchOutcome:
    """The records for either: a group's batch that ran member by member, else ``finish_batch``
    (also for a group's batch with nothing to run, which needs only its stats)."""
    if isinstance(ran, GroupRan):
        return finish_group(p, ran, worker_id=worker_id, failures=failures)
    return finish_batch(p, ran, worker_id=worker_id, failures=failures)


def warm(model: Served, batches: bool = True) -> None:
    """Warm every model served: a group's first batch must not pay for any member's start.

    Then each model answers a batch of two (``batches``; one where the model's batches hold one
    request at most), checked as a real batch is: a model exported for batches of one, one that
    answers too few rows, or one whose answers cannot travel fails here, when the worker starts
    and its version never takes the traffic, rather than on the first real batch. The inputs are
    the model's ``example`` (``registry.spec.example_input``); a model of text or bytes without
    one is not tried."""
    for each in [m.model for m in model.members] if isinstance(model, GroupModel) else [model]:
        try:
            first = warm_up(each)
        except Exception as exc:  # its own error, named as its example's (or the zeros') input
            if each.spec.example is not None:
                raise ModelError(f"it fails on its model.yaml example {each.spec.example!r}: {type(exc).__name__}: "
                                 f"{one_line(exc)}") from exc
            shape = each.spec.input
            raise ModelError(f"it fails on one input of zeros shaped as its model.yaml's `input:` ({shape.dtype} "
                             f"{list(shape.shape)}): {type(exc).__name__}: {one_line(exc)}. Check that `input:` is "
                             "what the model takes, or give an `example:` file of one real input") from exc
        if first is None:  # text or bytes with no `example:` in its model.yaml: nothing real to try
            continue
        try:  # a batch of one first: an answer of the wrong shape is that, whatever the batch
            rows = output_rows(each.spec.output, first, 1)
        except ClipstreamError as exc:
            raise ModelError(f"its answer does not fit its model.yaml ({one_line(exc)})") from None
        if batches:
            ran = predict_rows(each, example_input(each.spec, 2), isolate=False)
            if ran.failure is not None:
                raise ModelError(f"it answers a batch of one request but not a batch of two ({one_line(ran.failure)}): "
                                 "the batcher sends several at once. Export it with a dynamic batch axis (ONNX: a "
                                 "symbolic first dimension), or set `max_batch_size: 1` for it in the app file")
            rows = ran.rows
        try:
            answer_tensor(np.asarray(rows[0]))
        except ClipstreamError as exc:
            raise ModelError(f"its answers cannot travel as tensors ({exc}): a `{each.spec.output.kind}` model "
                             "answers numbers; for named classes use `kind: class_scores` with `labels`") from None
