"""Open-loop load over the gateway's gRPC front (the Open Inference Protocol's ``ModelInfer``,
one call per query, or ``ModelStreamInfer``, every query on one stream), on the schedule the
HTTP generator keeps (``bench.load_http``). Requests are serialized before the run, so the
generator's own work per query is a write and a parse of the answer.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Sequence

import numpy as np

from bench.load import Outcome, Progress, RunResult, now_us, ticker, without_gc_pauses
from bench.load_http import send_on_schedule
from frontend.v2_proto import MESSAGES, SERVICE

UNARY, STREAM = "unary", "stream"


def request_bodies(app: str, inputs: np.ndarray, slo_ms: float) -> list[bytes]:
    """One serialized ``ModelInferRequest`` per row, its index as its id, the row as raw FP32."""
    out = []
    for i, row in enumerate(inputs):
        req = MESSAGES["ModelInferRequest"](model_name=app, id=str(i))
        req.inputs.add(name="input", datatype="FP32", shape=[1, *row.shape])
        req.raw_input_contents.append(np.ascontiguousarray(row, dtype="<f4").tobytes())
        req.parameters["slo_ms"].double_param = slo_ms
        out.append(req.SerializeToString())
    return out


def _read(r: Outcome, reply: object) -> None:
    names = [o.name for o in reply.outputs]  # type: ignore[attr-defined]
    raw = reply.raw_output_contents  # type: ignore[attr-defined]
    default = np.frombuffer(raw[names.index("default")], dtype="?")
    r.status, r.outcome = 200, "default" if default.any() else "answered"


@without_gc_pauses
def run_grpc(target: str, bodies: Sequence[bytes], times: np.ndarray, *, mode: str = UNARY,
             timeout_s: float = 10.0, progress: Progress | None = None) -> RunResult:
    """Send ``bodies[i]`` at ``times[i]`` (seconds from now) to the gRPC front at ``target``
    (``host:port``): one ``ModelInfer`` call each (``UNARY``), or all on one ``ModelStreamInfer``
    stream (``STREAM``), answers matched by id."""
    return asyncio.run(_grpc(target, bodies, times, mode, timeout_s, progress))


async def _grpc(target: str, bodies: Sequence[bytes], times: np.ndarray, mode: str, timeout_s: float,
                progress: Progress | None) -> RunResult:
    import grpc

    results = [Outcome(i, 0) for i in range(len(times))]
    answered = [0]
    async with grpc.aio.insecure_channel(target) as channel:
        await channel.channel_ready()
        stop = threading.Event()
        ticker(f"grpc {mode}", len(times), lambda: answered[0], progress, stop)
        cpu0, wall0 = time.process_time(), time.monotonic()
        if mode == UNARY:
            call = channel.unary_unary(f"/{SERVICE}/ModelInfer",
                                       response_deserializer=MESSAGES["ModelInferResponse"].FromString)

            async def one(i: int) -> None:
                r = results[i]
                r.sent_us = now_us()
                try:
                    reply = await call(bodies[i], timeout=timeout_s)
                    r.recv_us = now_us()
                    _read(r, reply)
                except grpc.aio.AioRpcError as exc:
                    r.recv_us, r.outcome, r.detail = now_us(), "error", (exc.details() or "")[:200]
                    r.status = 503 if exc.code() == grpc.StatusCode.UNAVAILABLE else 500
                answered[0] += 1

            start_us = await send_on_schedule(times, results, one, timeout_s)
        else:
            outgoing: asyncio.Queue[bytes | None] = asyncio.Queue()

            async def requests() -> AsyncIterator[bytes]:
                while (body := await outgoing.get()) is not None:
                    yield body

            stream = channel.stream_stream(f"/{SERVICE}/ModelStreamInfer", response_deserializer=MESSAGES[
                "ModelStreamInferResponse"].FromString)(requests())

            async def receive() -> None:
                async for reply in stream:
                    r = results[int(reply.infer_response.id)]
                    r.recv_us = now_us()
                    if reply.error_message:
                        r.outcome, r.detail = "error", reply.error_message[:200]
                        r.status = 503 if "retry after" in reply.error_message else 500
                    else:
                        _read(r, reply.infer_response)
                    answered[0] += 1
                    if answered[0] == len(results):
                        return

            async def send(i: int) -> None:
                results[i].sent_us = now_us()
                outgoing.put_nowait(bodies[i])

            receiver = asyncio.create_task(receive())
            start_us = await send_on_schedule(times, results, send, timeout_s)
            outgoing.put_nowait(None)
            try:
                await asyncio.wait_for(receiver, timeout_s + 5)
            except asyncio.TimeoutError:
                stream.cancel()
        stop.set()
        wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
    duration = float(times[-1]) if len(times) else 0.0
    return RunResult(results, start_us, duration, wall, cpu)
