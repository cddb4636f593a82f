"""Control records that ride a model's data topics during a version change (docs/design/0021).

Both are ordinary records of their topic's schema (the Avro schemas stay as they are):

- a **readiness marker** on ``batch-stats.<model>``: a ``BatchStats`` with no batch, written by
  a worker once its version's model is loaded and warm, so the batcher knows it may move the
  model's batches to that version; a **failure marker**, written by a worker that could not
  load its version, tells the batcher never to move them there for want of markers;
- a **handover** on ``batches.<model>``: a ``Batch`` with no items, stamped with the version the
  batcher moves to, sent to each partition; read after every batch of the old version there,
  it tells the old version's worker that nothing more is coming for it. A handover whose id
  starts ``retire/`` goes to a partition whose replica the registry removed: its worker stops
  once the batches before it are served, whatever its version.

Workers and batchers are stages that never import each other, so the format lives here.
"""

from __future__ import annotations

from schemas import Batch, BatchStats

READY_PREFIX = "ready/"
FAILED_PREFIX = "failed/"
RETIRE_PREFIX = "retire/"
HANDOVER_PREFIX = "handover-"


def ready_marker(model: str, version: str, replica: int, worker_id: str, now_us: int) -> BatchStats:
    """A worker's "version ``version`` of ``model``, replica ``replica``, can serve now"."""
    return BatchStats(batch_id=READY_PREFIX + version, model=model, replica=replica, batch_size=0,
                      service_us=0, queue_wait_us=0, errors=0, worker_id=worker_id, created_us=now_us)


def failed_marker(model: str, version: str, replica: int, worker_id: str, now_us: int) -> BatchStats:
    """A worker's "version ``version`` of ``model``, replica ``replica``, could not load"."""
    return BatchStats(batch_id=FAILED_PREFIX + version, model=model, replica=replica, batch_size=0,
                      service_us=0, queue_wait_us=0, errors=1, worker_id=worker_id, created_us=now_us)


def marker_version(stats: BatchStats, prefix: str = READY_PREFIX) -> str | None:
    """The version a readiness marker (or, with ``FAILED_PREFIX``, a failure marker) announces;
    None for an ordinary batch report or the other marker."""
    if stats.batch_size == 0 and stats.batch_id.startswith(prefix):
        return stats.batch_id[len(prefix):]
    return None


def handover(model: str, version: str | None, replica: int, batch_id: str, now_us: int) -> Batch:
    """The empty batch that moves partition ``replica`` of ``batches.<model>`` to ``version``."""
    return Batch(batch_id=batch_id, model=model, version=version, replica=replica, created_us=now_us, items=[])


def is_handover(batch: Batch) -> bool:
    return not batch.items


def is_retirement(batch: Batch) -> bool:
    """A handover to a replica the registry removed: nothing more comes to its partition."""
    return not batch.items and batch.batch_id.startswith(RETIRE_PREFIX)


def sender_of(batch_id: str) -> str:
    """Which batcher sent a batch or a marker: its id is ``<sender>-<count>`` after the marker's
    prefix, and a batcher process keeps one sender for its life. An id of another shape is
    from sender ``""``."""
    for prefix in (RETIRE_PREFIX, HANDOVER_PREFIX):
        if batch_id.startswith(prefix):
            batch_id = batch_id[len(prefix):]
            break
    return batch_id.rpartition("-")[0]
