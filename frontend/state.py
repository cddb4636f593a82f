"""What the gateway's routes share: the registry and bus they talk to, the admission limit, the
callers waiting for a slot under it and the loop-lag watcher that feeds it, and each app's
outputs and input as the registry says.

Kept apart from the routes (``frontend.gateway``) so that the admission's state is read, and
tested, without an HTTP server.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable
from time import monotonic, time
from typing import Any, Protocol, Union

from clipstream.clock import now_us
from clipstream.loaded import unready
from clipstream.redisclient import REDIS_AWAY
from clipstream.saver import PredictionSaver
from clipstream.settings import Settings
from frontend.admission import AdmissionLimit, RecentTimes, verdict
from frontend.gateway_http import HTTPProblem
from frontend.metrics import DEFAULT_CAUSES, GatewayMetrics
from frontend.reach import KafkaReach
from frontend.settings import GatewaySettings
from registry.outputs import app_input, app_outputs
from registry.spec import TensorSpec
from registry.topic import AppConfig, RegistryView
from topics.catalogue import valid_name
from topics.saturation import Saturation
from topics.stage import CAPACITY_ADVICE, alert
from schemas import Feedback, ModelRequest, Prediction, QueryEvent, Response

LAG_CUT_EVERY_US = 50_000  # the gateway's late loop cuts its admission limit at most this often
# a query answered this long ago has its predictions stored (the selector and the saver store
# within a second); past it, feedback asks the store, whose entries expire
ANSWERED_FRESH_S = 10.0


class Registry(Protocol):
    def view(self) -> RegistryView: ...
    def wait_ready(self, timeout_s: float = 30.0) -> RegistryView: ...


# what a waiting caller is handed: the selector's Response, or its one model's Prediction
Reply = Union[Response, Prediction]
NOT_LOADED_READ_S = 2.0  # how stale the workers' word on a model may be when a query or a probe reads it


class Bus(Protocol):
    """What the routes need from Kafka (``KafkaBus``; a fake in unit tests)."""

    on_late: Callable[[list[int | None]], None]  # replies nobody waited for: how late each came, in µs
    on_delivery_error: Callable[[], None]

    def publish_query(self, event: QueryEvent, key: bytes) -> asyncio.Future[Reply]: ...
    def publish_request(self, request: ModelRequest) -> asyncio.Future[Reply]: ...
    def request_topic(self, model: str) -> str | None: ...
    def ensure_request_topic(self, model: str) -> None: ...
    def forget(self, query_id: str) -> None: ...
    async def publish_feedback(self, record: Feedback, key: bytes, timeout_s: float) -> None: ...
    def kafka_ok(self, timeout_s: float = 2.0) -> bool: ...

    @property
    def reply_topic(self) -> str: ...


class GatewayState:
    """What the routes share: settings, registry, bus, metrics, the in-flight count."""

    def __init__(self, gw: GatewaySettings, settings: Settings) -> None:
        self.gw, self.settings = gw, settings
        self.registry: Registry | None = None
        self.bus: Bus | None = None
        self.redis_ping: Callable[[], Awaitable[bool]] | None = None
        # whether the selector still holds a query's predictions (None: cannot tell now)
        self.stored: Callable[[str], Awaitable[bool | str | None]] | None = None
        # where answers made from a model's prediction straight are stored for feedback
        self.saver: PredictionSaver | None = None
        # queries this gateway answered with predictions lately: theirs are being stored, so
        # feedback right after the answer is not told they are missing
        self.answered: OrderedDict[str, tuple[str, float]] = OrderedDict()  # query id -> its app, when
        self.inflight = 0
        # callers waiting for a slot, first come first served; each future gets how many were in
        # flight when its slot was taken on its behalf (None: the wait ran out)
        self._waiting: deque[asyncio.Future[int | None]] = deque()
        self.waiting = 0
        self.reading = 0  # predict requests whose body is still arriving (no slot held)
        # the replicas' word on whether they have a model loaded (``clipstream.loaded``): its hash
        self.loaded: Callable[[str], Awaitable[dict[Any, Any]]] | None = None
        self._not_loaded: dict[str, tuple[float, str | None]] = {}  # model -> when read, why not loaded
        self._reading: dict[str, asyncio.Future[str | None]] = {}  # model -> its read under way
        # awaited as the gateway stops, before Kafka is let go: servers beside uvicorn's (gRPC)
        # finish the calls they hold
        self.draining: list[Callable[[], Awaitable[None]]] = []
        self._took: dict[str, RecentTimes] = {}  # per app: how long the pipeline took lately
        ceiling = gw.max_inflight
        self.admission = AdmissionLimit(min(gw.admission_initial, ceiling), min(gw.admission_floor, ceiling), ceiling)
        self.loop_lag_ms = 0.0
        self.lags: deque[float] = deque(maxlen=3)  # the watcher's last wake-ups, ms late
        self.lag_ticks = 0  # the watcher's ticks so far (none while it is parked)
        self._busy = asyncio.Event()  # set while predictions are in flight: the watcher ticks
        self.metrics = GatewayMetrics(lambda: self.inflight, lambda: self.limit, lambda: self.waiting,
                                      lambda: self.reading)
        self.reach = KafkaReach(settings.kafka_bootstrap)  # fed by its watch once the bus is there

    def kafka_problem(self) -> str | None:
        """Why a query cannot be published now (the caller's 503), or None."""
        return "the gateway is not connected to Kafka" if self.bus is None else self.reach.lost

    def remember_answer(self, query_id: str, app: str) -> None:
        """Note a query answered with predictions for ``app``; the oldest are forgotten past the bound."""
        self.answered[query_id] = (app, monotonic())
        if len(self.answered) > self.gw.answered_memory:
            self.answered.popitem(last=False)

    def answered_app(self, query_id: str) -> str | None:
        """The app of a query this gateway answered within ``ANSWERED_FRESH_S``: its predictions
        are stored, or on their way. Past that the store says, as their time to live may be over."""
        known = self.answered.get(query_id)
        if known is None or monotonic() - known[1] > ANSWERED_FRESH_S:
            return None
        return known[0]

    async def watch_saturation(self, every_s: float = 2.0) -> None:
        """Say (``up`` prints it) when an app's queries are refused in numbers: the pipeline is
        at its capacity for them, and the fix is more replicas or larger batches. Also when its
        callers get its default output in numbers, whatever the cause."""
        saturation, defaults = Saturation(), Saturation(least=10)  # a default is worse news than a 503
        sources: deque[tuple[float, dict[str, float]]] = deque()  # who decided the defaults, lately
        while True:
            await asyncio.sleep(every_s)
            now = monotonic()
            sources.append((now, self.metrics.default_sources()))
            while now - sources[0][0] > defaults.window_s + every_s:
                sources.popleft()
            for app, (total, defaulted) in self.metrics.answered_as("default").items():
                share = defaults.check(app, now, total, defaulted)
                if share is not None:
                    by = {s: n - sources[0][1].get(s, 0.0) for s, n in sources[-1][1].items()}
                    cause = max(by, key=lambda s: by[s])
                    why = f"; most of this gateway's defaults: {DEFAULT_CAUSES[cause]}" if by[cause] > 0 else ""
                    if self.reach.doubt and cause == "gateway_timeout":  # not the models': Kafka's
                        why = f"; this gateway's last check found no Kafka broker at {self.reach.bootstrap}"
                    alert("gateway", f"app {app}: {share:.0%} of its queries were answered with its default output "
                                     f"over the last {defaults.window_s:g} s, not a prediction{why}")
            for app, (total, refused) in self.metrics.answered_as("refused").items():
                share = saturation.check(app, monotonic(), total, refused)
                if share is None:
                    continue
                if self.reach.lost is not None:  # refused for want of Kafka, not of capacity
                    alert("gateway", f"app {app}: {share:.0%} of its queries were refused (503) over the last "
                                     f"{saturation.window_s:g} s: {self.reach.lost}")
                    continue
                view = self.registry.view() if self.registry is not None else None
                models = list(view.apps[app].models) if view is not None and app in view.apps else []
                alert("gateway", f"app {app}: {share:.0%} of its queries were refused (503) over the last "
                                 f"{saturation.window_s:g} s: the pipeline is at its capacity for them; {CAPACITY_ADVICE} "
                                 f"of {', '.join(models) or 'its models'} (clipstream set-replicas "
                                 f"{models[0] if models else 'MODEL'} N), or let their batches grow "
                                 "(latency_objective_ms, max_batch_size)")

    async def watch_loop_lag(self, every_s: float = 0.005) -> None:
        """How late the event loop wakes up: a late loop means callers already wait in line.

        Past a few milliseconds every timer (and so every deadline) fires late, so new work is
        refused with 503 until the loop catches up: a quick 'no' beats an answer after the SLO.
        While no prediction is in flight it parks: nobody waits on the loop then, and a timer
        every few milliseconds would cost a wake-up each, most of an idle gateway's CPU
        (docs/design/0045). The first prediction let in wakes it.
        """
        loop = asyncio.get_running_loop()
        while True:
            if self.inflight == 0:
                self._busy.clear()
                self.loop_lag_ms = 0.0
                self.lags.clear()
                await self._busy.wait()
            t0 = loop.time()
            await asyncio.sleep(every_s)
            self.lag_ticks += 1
            self.tick((loop.time() - t0 - every_s) * 1000.0, now_us())

    def tick(self, lag_ms: float, now: int) -> None:
        """One wake-up of the watcher, ``lag_ms`` late. One late wake-up is a hiccup (a GC, an
        import); two in a row, late for the tightest SLO the gateway serves, are work waiting
        for the CPU and cut the limit."""
        self.loop_lag_ms = lag_ms
        self.lags.append(lag_ms)
        last_two = min(self.lags[-1], self.lags[-2]) if len(self.lags) >= 2 else 0.0
        # the floor first: the registry's SLOs are read only when the loop runs late at all
        if last_two > self.gw.max_loop_lag_ms and last_two > self.lag_bound_ms(self.tightest_slo_ms()):
            self.cut_for_lag(now)

    def lag_bound_ms(self, slo_ms: float | None) -> float:
        """How late the loop may wake before an app of this SLO is served late (None: any app)."""
        return max(self.gw.max_loop_lag_ms, self.gw.loop_lag_slo_share * slo_ms if slo_ms is not None else 0.0)

    def late_for(self, slo_ms: float | None) -> bool:
        """Three wake-ups in a row past the app's bound: a queue for the CPU, refuse it (503)."""
        return len(self.lags) == 3 and min(self.lags) > self.lag_bound_ms(slo_ms)

    def tightest_slo_ms(self) -> float | None:
        """The shortest SLO among the registry's apps (None: no app known)."""
        apps: Iterable[AppConfig] = self.registry.view().apps.values() if self.registry is not None else ()
        return min((float(cfg.slo_ms) for cfg in apps), default=None)

    def hold(self) -> int:
        """Take an admission slot; how many were in flight before (wakes a parked watcher)."""
        before = self.inflight
        self.inflight += 1
        if before == 0:
            self._busy.set()
        return before

    def release(self) -> None:
        """Give a slot back: to the first caller waiting for one, if the limit allows."""
        self.inflight -= 1
        self.hand_over()

    def hand_over(self) -> None:
        """Slots free under the limit go to the callers waiting, in the order they came."""
        while self._waiting and self.inflight < self.limit:
            fut = self._waiting.popleft()
            if not fut.done():  # else its wait ran out, or its caller went away
                fut.set_result(self.hold())

    async def admit(self, app: str, slo_ms: float, patient_s: float | None = None) -> tuple[int, float]:
        """Take a slot, waiting for one when the limit is reached (docs/design/0089): at most
        ``admission_queue_share`` of the SLO, and no longer than the app's recent answers leave
        room for before the slow band. A pause of the pipeline fills the limit for a moment,
        and the answers that follow it free slots well within the SLO. ``patient_s``: wait up
        to that instead (a batch's example, whose caller waits for the whole batch). Returns how
        many were in flight before and how long it waited (ms); HTTPProblem 503 when no slot came."""
        self.hand_over()  # after it, a slot free under the limit means nobody waits
        if self.inflight < self.limit:
            return self.hold(), 0.0
        took = self._took.get(app)
        # what keeps the answer out of the slow band (the limit's sign of queueing), judged by
        # how long the app's recent answers took
        room_ms = slo_ms * self.gw.admission_slow_fraction - (took.value if took is not None else 0.0)
        wait_s = min(self.gw.admission_queue_share * slo_ms, room_ms) / 1000.0 if patient_s is None else patient_s
        how = " (learnt from how fast the pipeline answers)" if self.gw.adaptive_admission else ""
        at_limit = f"gateway at its limit of {self.limit} requests in flight{how}"
        if wait_s <= 0:
            raise self.overloaded(at_limit)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int | None] = loop.create_future()
        self._waiting.append(fut)
        self.waiting += 1
        began = loop.time()
        timer = loop.call_later(wait_s, lambda: fut.done() or fut.set_result(None))
        try:
            before = await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.result() is not None:
                self.release()  # a slot came as its caller went away: the next one's
            raise
        finally:
            timer.cancel()
            self.waiting -= 1
        if before is None:
            raise self.overloaded(f"{at_limit}, and no slot freed within {wait_s * 1000:.0f} ms")
        return before, (loop.time() - began) * 1000.0

    def cut_for_lag(self, now: int) -> None:
        """A late loop is a process queueing for the CPU: let fewer predictions in.

        The answers' latency, which teaches the limit otherwise, is timed from when the server
        began reading a request; on a saturated machine the wait before that (the socket, the
        caller's own process) grows first, unseen. So a loop late on two wake-ups in a row
        also cuts the limit, at most once per LAG_CUT_EVERY_US (about a round trip at a usual
        SLO, as TCP cuts once per window), and only while the limit is in use. One late wake-up
        is one pause (a GC, an import), which says nothing about how much the gateway lets in.
        """
        if self.gw.adaptive_admission and 2 * self.inflight >= self.limit:
            if self.admission.cut(now, now - LAG_CUT_EVERY_US):
                self.metrics.cuts.inc("loop")

    @property
    def limit(self) -> int:
        """Predictions admitted at once: learnt (``frontend.admission``) unless switched off."""
        return int(self.admission.limit) if self.gw.adaptive_admission else self.gw.max_inflight

    def observe(self, app: str, answer: dict[str, Any], timed_out: bool, admitted_us: int, inflight: int,
                slo_ms: float, waited_ms: float = 0.0) -> None:
        """Teach the admission limit whether the pipeline kept up with this answer to ``app``
        (admitted at ``admitted_us`` with ``inflight`` others in flight, after waiting
        ``waited_ms`` for the slot): ``frontend.admission.verdict``. A limit grown lets waiting
        callers in."""
        took = self._took.get(app)
        if took is None:
            took = self._took[app] = RecentTimes()
        took.add(answer["latency_ms"] - waited_ms)
        said = verdict(answer, timed_out, slo_ms, self.gw.admission_slow_fraction, waited_ms)
        if said == "late" and self.admission.late(now_us(), admitted_us):
            self.metrics.cuts.inc("late")
        elif said == "slow" and self.admission.slow(now_us(), admitted_us):
            self.metrics.cuts.inc("slow")
        elif said == "on_time":
            self.admission.on_time(inflight, admitted_us)
            self.hand_over()

    async def not_loaded(self, models: Iterable[str], wait: bool = True) -> str | None:
        """Why one of ``models`` has no replica that said it has it loaded (``clipstream.loaded``),
        read at most every ``NOT_LOADED_READ_S`` per model; None when each has one, or when Redis
        cannot tell. ``wait=False`` answers from what was read last and reads afresh behind:
        a caller's default must not wait on Redis."""
        if self.loaded is None:
            return None
        for model in models:
            at, why = self._not_loaded.get(model, (0.0, None))
            if time() - at > NOT_LOADED_READ_S:
                reading = self._reading.get(model)
                if reading is None:
                    reading = self._reading[model] = asyncio.ensure_future(self._read_loaded(model))
                if wait:
                    why = await asyncio.shield(reading)
            if why is not None:
                return why
        return None

    async def _read_loaded(self, model: str) -> str | None:
        assert self.loaded is not None
        try:
            config = self.registry.view().model(model) if self.registry is not None else None
            why = unready(model, await self.loaded(model), time(), config.version if config is not None else None)
        except REDIS_AWAY:
            why = None
        finally:
            self._reading.pop(model, None)
        self._not_loaded[model] = (time(), why)
        return why

    def app_config(self, name: str) -> AppConfig:
        view = self.registry.view() if self.registry is not None else RegistryView()
        cfg = view.apps.get(name)
        if cfg is None:
            if not valid_name(name):  # no app could have it: said so, without echoing all of it
                raise HTTPProblem(404, f"unknown app {name[:64]!r}{'...' if len(name) > 64 else ''}: an app's name "
                                       "is 1-128 letters, digits, '_' or '-', the first a letter or digit")
            raise HTTPProblem(404, f"unknown app {name!r}")
        return cfg

    def outputs(self, cfg: AppConfig) -> tuple[str, tuple[Any, ...] | None]:
        """What the app's models answer, and their labels, read as the selector reads them."""
        out = app_outputs(self.registry.view() if self.registry is not None else RegistryView(), cfg.models)
        return out.kind, out.labels

    def input_spec(self, cfg: AppConfig) -> TensorSpec | None:
        """The app's first linked model's declared input (None: nothing to check against)."""
        return app_input(self.registry.view(), cfg.models) if self.registry is not None else None

    def overloaded(self, why: str) -> HTTPProblem:
        self.metrics.rejected.inc()
        return HTTPProblem(503, why, {"Retry-After": str(self.gw.retry_after_s)})
