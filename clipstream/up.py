"""`clipstream up -f app.yaml`: the whole pipeline on one machine, supervised.

Starts Kafka and Redis if they are not running, applies the app file, then runs the gateway
(``CLIPSTREAM_UP_GATEWAYS`` members on one port, 1 by default), the selector members (``CLIPSTREAM_UP_SELECTORS``, 2 by default), and per model a batcher and one worker per replica. It keeps following the
registry, so a model deployed or linked later (or given more replicas) gets its processes
without a restart. A new version of a model (``deploy-model``, ``rollback``) gets its own
workers beside the old version's, which serve until the batcher moves the model's batches to
the new ones, once they are loaded and warm (docs/design/0021).
Ctrl-C or SIGTERM stops everything it started, the infrastructure too.

The batchers of all models run in one process by default (``CLIPSTREAM_UP_BATCHERS=shared``),
as Clipper keeps every model's batching queue in one process: each model still has its own
queue, AIMD state and credit, but an ensemble's query wakes one batcher, not one per model,
and the models share one set of Kafka and Redis clients (docs/design/0010).
A change in the set of models starts a new batcher for all of them; the old one stops once the
new one is ready, so no request falls between them. ``per-model`` runs one process per model
(isolation: a model's batcher can crash or restart alone).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import click
from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from clipstream.errors import ClipstreamError
from clipstream.infra import launcher
from clipstream.infra.kafka import kafka_answers
from clipstream.metrics_targets import FILE_NAME as TARGETS_FILE, TARGETS_LINE, MetricTargets
from clipstream.settings import Settings, get_settings, redacted_url, settings_or_exit
from clipstream.supervise import MIN_HEARTBEAT_TIMEOUT_S, Stage, Supervisor
from clipstream.warmup import warm_up
from registry.appfile import apply_file
from registry.topic import RegistryFollower, RegistryView
from topics.catalogue import REQUEST_PARTITIONS
from topics.membership import MEMBER_ENV

READY_TIMEOUT_S = 180.0
SPARES_TIMEOUT_S = 60.0
# an old version's worker normally stops by itself when the batcher hands its partition over;
# one still running this long after the new version's workers were all ready is stopped
LEAVE_GRACE_S = 30.0


class UpSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CLIPSTREAM_UP_", extra="ignore")

    batchers: Literal["shared", "per-model"] = "shared"
    # selector members (one consumer group): with two, a killed one is a failover to the other
    # (its partitions move within the selector's session timeout), not an outage
    selectors: int = Field(2, ge=1)
    # batcher processes per set of models (one consumer group sharing each model's request
    # partitions): one by default, as a second on two cores splits each model's queue, so its
    # batches fill half as fast, for a failover no quicker than a restart (docs/design/0024)
    batcher_members: int = Field(1, ge=1, le=REQUEST_PARTITIONS)
    # gateway members on one port (SO_REUSEPORT): with two, a killed one costs its callers a
    # retried connection, not an outage (docs/design/0023)
    gateways: int = Field(1, ge=1)
    # seconds of steady traffic before `ready` (clipstream/warmup.py): a fresh broker's JIT
    warm_up_s: float = Field(20.0, ge=0)
    # a stage whose heartbeat is older is hung: killed and restarted (0: never; docs/design/0014)
    heartbeat_timeout_s: float = Field(15.0, ge=0)
    # a stage that served this long before it died starts its restart backoff over (0.1 s)
    healthy_s: float = Field(60.0, gt=0)
    # every stage keeps a spare process, imports done, that takes its place when it dies: a
    # restart without an interpreter's start (docs/design/0062)
    spares: bool = True

    @field_validator("heartbeat_timeout_s")
    @classmethod
    def _beats_fit(cls, value: float) -> float:
        if 0 < value <= MIN_HEARTBEAT_TIMEOUT_S:
            raise ValueError(f"must be 0 (off) or above {MIN_HEARTBEAT_TIMEOUT_S:g} s: stages beat once a second")
        return value


def _stage_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "clipstream.cli", *args]


def gateway_stages(count: int, port: str) -> list[tuple[str, list[str]]]:
    """The gateway stages: one ``gateway``, or ``gateway-1..n`` sharing the port, each with its
    own reply topic, named by port and member so a restart reuses it."""
    if count == 1:
        return [("gateway", _stage_argv("gateway"))]
    return [(f"gateway-{i}", _stage_argv("gateway", "--reuse-port", "--instance", f"gw{port}-{i}"))
            for i in range(1, count + 1)]


class Pipeline:
    """Keeps the batcher(s) and one worker per replica in step with the registry."""

    def __init__(self, supervisor: Supervisor, env: dict[str, str], shared_batcher: bool = True,
                 targets: MetricTargets | None = None, batcher_members: int = 1, spares: bool = False) -> None:
        self.supervisor = supervisor
        self.spares = spares  # each stage keeps a spare process (docs/design/0062)
        self.batcher_members = batcher_members
        self.env = env
        self.targets = targets  # each stage's metrics port (``clipstream.metrics_targets``)
        self.shared_batcher = shared_batcher
        self._lock = threading.Lock()
        self.retiring: list[str] = []  # shared batchers replaced, stopped once the new one is ready
        # workers of a version the registry replaced: out of the supervisor's care, serving
        # until the batcher hands their partitions over to the new version's workers
        self.leaving: dict[str, Leaving] = {}

    def sync(self, view: RegistryView) -> list[str]:
        """Start what the registry asks for and is not running; stop what it no longer asks for.

        Worker names carry the model version, so a deploy or a rollback starts the new
        version's workers beside the old ones, which leave once their partitions are handed
        over (``retire``); the batcher follows the version itself (the cache key carries it,
        so no stale answer leaks).
        """
        started: list[str] = []
        with self._lock:
            wanted = wanted_stages(view, self.shared_batcher, self.batcher_members)
            for stage, args in wanted.items():
                if stage in self.supervisor.stages:
                    continue
                back = self.leaving.pop(stage, None)
                if back is not None and back.stage.proc is not None and back.stage.proc.poll() is None:
                    self.supervisor.adopt(back.stage)  # rolled back before it left: it serves on
                    continue
                self.supervisor.add(stage, _stage_argv(*args),
                                    self.targets.env(stage, self.env) if self.targets else self.env,
                                    spare=self.spares)
                started.append(stage)
            for stage in list(self.supervisor.stages):
                if stage in wanted or stage in self.retiring:
                    continue
                model = _arg(self.supervisor.stages[stage], "--model")
                served = view.served().get(model or "")
                if (stage.startswith("worker-") and served is not None and served.spec is not None
                        and _arg(self.supervisor.stages[stage], "--version") != served.version):
                    self._leave(stage, model or "", str(served.version))
                elif stage.startswith(("worker-", "batcher-")):
                    self.supervisor.remove(stage)
                elif stage.startswith("batchers-"):
                    self.retiring.append(stage)
        self.retire()
        return started

    def _leave(self, name: str, model: str, successor: str) -> None:
        stage = self.supervisor.release(name)
        if stage is None:
            return
        self.leaving[name] = Leaving(stage, model)
        _say(f"{name} serves until version {successor} of {model} is ready")

    def retire(self) -> None:
        """Stop replaced shared batchers once every wanted one is ready, and see the workers of
        replaced versions out (called at each check)."""
        self._see_out(time.monotonic())
        with self._lock:
            if not self.retiring:
                return
            stages = self.supervisor.stages
            new = [s for name, s in stages.items() if name.startswith("batchers-") and name not in self.retiring]
            if all(s.ready.is_set() for s in new):
                for name in self.retiring:
                    self.supervisor.remove(name)
                self.retiring = []

    def _see_out(self, now: float) -> None:
        """A leaving worker stops by itself at the handover; one still running ``LEAVE_GRACE_S``
        after its model's current workers were all ready gets SIGTERM, and SIGKILL after as long again."""
        with self._lock:
            for name, leaving in list(self.leaving.items()):
                proc = leaving.stage.proc
                if proc is None or proc.poll() is not None:
                    del self.leaving[name]
                    how = "stopped by up" if leaving.signalled else "its partition was handed over"
                    _say(f"{name} stopped ({how}, exit code {proc.returncode if proc else '-'})")
                    continue
                current = [s for s in self.supervisor.stages.values()
                           if s.name.startswith("worker-") and _arg(s, "--model") == leaving.model]
                if not leaving.successors_ready_at and current and all(s.ready.is_set() for s in current):
                    leaving.successors_ready_at = now
                waited = now - leaving.successors_ready_at if leaving.successors_ready_at else 0.0
                step = 2 if waited > 2 * LEAVE_GRACE_S else 1 if waited > LEAVE_GRACE_S else 0
                if step > leaving.signalled:
                    sig = signal.SIGKILL if step == 2 else signal.SIGTERM
                    _say(f"{name} was not handed over {waited:.0f}s after its successors were ready; "
                         f"stopping it ({sig.name})")
                    _killpg(proc.pid, sig)
                    leaving.signalled = step

    def hand_back(self) -> None:
        """Leaving workers go back to the supervisor, to be stopped with everything else."""
        with self._lock:
            for leaving in self.leaving.values():
                self.supervisor.adopt(leaving.stage, restart=False)
            self.leaving.clear()


@dataclass
class Leaving:
    """A worker of a replaced version, serving until its partition is handed over."""

    stage: Stage
    model: str
    successors_ready_at: float = 0.0
    signalled: int = 0  # 1: SIGTERM sent, 2: SIGKILL sent


def _arg(stage: Stage, option: str) -> str | None:
    """The value of ``option`` a stage was started with (the first one)."""
    argv = stage.argv
    return next((argv[i + 1] for i in range(len(argv) - 1) if argv[i] == option), None)


def _killpg(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)  # stages run in their own session: the group is the stage
    except ProcessLookupError:
        pass


def wanted_stages(view: RegistryView, shared_batcher: bool = True, batcher_members: int = 1) -> dict[str, list[str]]:
    """Stage name -> CLI arguments: one batcher per model (or one for all), one worker per replica.

    A batcher follows the models' versions through the registry itself, so its stage name
    carries only the model names: a shared one is replaced when a model comes or goes. With
    ``batcher_members`` above one, each batcher runs that many times (names ending ``.1``,
    ``.2``, ...); every member is a static group member named ``batcher-<i>``."""
    wanted: dict[str, list[str]] = {}

    def batchers(name: str, models: list[str]) -> None:
        args = ["batcher", *[a for n in models for a in ("--model", n)]]
        if batcher_members == 1:
            wanted[name] = [*args, "--member", "batcher-1"]
            return
        for i in range(1, batcher_members + 1):
            wanted[f"{name}.{i}"] = [*args, "--member", f"batcher-{i}"]

    # a group (docs/design/0088) is served as one model: its batcher and workers, not its members'
    units = view.served()
    served = sorted(name for name, model in units.items() if model.spec is not None)
    if shared_batcher and served:
        batchers("batchers-" + "+".join(served), served)
    for name, model in units.items():
        if model.spec is None:
            continue
        v = model.version
        if not shared_batcher:  # it follows the model's version through the registry itself
            batchers(f"batcher-{name}", [name])
        for r in range(model.replicas):
            wanted[f"worker-{name}-v{v}-{r}"] = [
                "worker", "--model", name, "--version", v,
                "--replica", str(r), "--replicas", str(model.replicas),
            ]
    return wanted


@click.command("up")
@click.option("-f", "--file", "path", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--gateway-port", type=int, default=None, help="default: CLIPSTREAM_GATEWAY_PORT or 8080")
@click.option("--free-ports", is_flag=True, help="start Kafka and Redis on free ports if they are not running")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
def up(path: str, gateway_port: int | None, free_ports: bool, state_dir: Path | None) -> None:
    """Run the whole pipeline for an app file until Ctrl-C."""
    overrides: dict[str, Any] = {"state_dir": state_dir} if state_dir else {}
    settings = settings_or_exit(lambda: get_settings(**overrides))
    up_settings = settings_or_exit(UpSettings)
    shared = up_settings.batchers == "shared"
    stop, serving = threading.Event(), threading.Event()
    supervisor: Supervisor | None = None

    def on_signal(*_: Any) -> None:
        stop.set()
        if supervisor is not None:
            supervisor.interrupt()
        if not serving.is_set():  # still starting: interrupt whatever waits; ``finally`` cleans up
            raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    started_infra = False
    pipeline: Pipeline | None = None
    follower: RegistryFollower | None = None
    try:
        settings, started_infra = _ensure_infra(settings, free_ports)
        env = {
            **os.environ,
            "CLIPSTREAM_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
            "CLIPSTREAM_REDIS_URL": settings.redis_url,
            **settings.secret_env(),  # the URL's password moved to CLIPSTREAM_REDIS_PASSWORD
            "CLIPSTREAM_TOPIC_PREFIX": settings.topic_prefix,
            "PYTHONUNBUFFERED": "1",
        }
        if gateway_port is not None:
            env["CLIPSTREAM_GATEWAY_PORT"] = str(gateway_port)
        port = env.get("CLIPSTREAM_GATEWAY_PORT", "8080")
        host = env.get("CLIPSTREAM_GATEWAY_HOST", "127.0.0.1")
        click.echo(f"infra: kafka={settings.kafka_bootstrap} redis={redacted_url(settings.redis_url, settings.redis_password)}")
        click.echo(f"applying {path}")
        apply_file(settings, path)
        log_dir = Path(settings.state_dir) / "up" / f"gateway-{port}"
        supervisor = Supervisor(log_dir, report=_say, heartbeat_timeout_s=up_settings.heartbeat_timeout_s,
                                healthy_s=up_settings.healthy_s)
        targets = MetricTargets(log_dir / TARGETS_FILE)
        pipeline = Pipeline(supervisor, env, shared_batcher=shared, targets=targets,
                            batcher_members=up_settings.batcher_members, spares=up_settings.spares)
        follower = RegistryFollower(settings).start()
        view = follower.wait_ready(30)
        # a process per model reads only its model's requests: one record per model, not one that
        # a model's batcher forwards to the others, unless the environment says (docs/design/0082)
        fan_out = {} if shared else {"CLIPSTREAM_SELECTOR_FAN_OUT": "per-model"}
        for i in range(1, up_settings.selectors + 1):  # named: static group members (topics.membership)
            supervisor.add(f"selector-{i}", _stage_argv("selector"),
                           targets.env(f"selector-{i}", {**fan_out, **env, MEMBER_ENV: f"selector-{i}"}),
                           spare=up_settings.spares)
        for name, argv in gateway_stages(up_settings.gateways, port):
            supervisor.add(name, argv, targets.env(name, env), spare=up_settings.spares)
        pipeline.sync(view)
        click.echo(f"starting {len(supervisor.stages)} stages (logs in {log_dir})")
        supervisor.wait_ready(READY_TIMEOUT_S)
        for line in targets.lines():
            click.echo(line)
        click.echo(f"{TARGETS_LINE}{targets.path}")
        click.echo(f"dashboard: http://{host}:{port}/dashboard")
        supervisor.start_spares()  # the warm-up's traffic absorbs their imports
        warm_up(f"http://{host}:{port}", follower.view(), env, report=lambda m: click.echo(m),
                seconds=up_settings.warm_up_s)
        supervisor.wait_spares(SPARES_TIMEOUT_S)  # none imports in the first seconds of serving
        serving.set()
        click.echo(f"ready: http://{host}:{port}", nl=True)
        sys.stdout.flush()
        follower.add_listener(lambda v: _report_started(pipeline.sync(v), targets))

        def upkeep() -> None:
            targets.keep([*supervisor.stages, *pipeline.leaving])
            pipeline.retire()

        # a dead stage is restarted as soon as it exits (a failover waits for that)
        supervisor.watch(stop, upkeep)
    except ClipstreamError as exc:
        _say(f"error: {exc}")
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    finally:
        # whoever read our output may be gone (a closed pipe): stopping must not depend on it
        _say("stopping...")
        if follower is not None:
            follower.stop()
        if supervisor is not None:
            if pipeline is not None:
                pipeline.hand_back()
            supervisor.stop_all()
        if started_infra:
            launcher.down(settings)
        _say("stopped")


def _say(msg: str) -> None:
    try:
        click.echo(msg, err=True)
    except OSError:
        pass


def _report_started(stages: list[str], targets: MetricTargets | None = None) -> None:
    for stage in stages:
        click.echo(f"started {stage} (registry change)", err=True)
    for line in targets.lines(stages) if targets is not None else []:
        click.echo(line)


def _ensure_infra(settings: Settings, free_ports: bool) -> tuple[Settings, bool]:
    """Use Kafka/Redis where the settings point if they answer; else start them locally."""
    if kafka_answers(settings.kafka_bootstrap) and _redis_answers(settings):
        return settings, False
    status = launcher.status(settings)
    if status.running:
        return settings.model_copy(update=status_settings(status)), False
    click.echo("starting Kafka and Redis ...")
    status = launcher.up(settings, free_ports=free_ports, progress=lambda m: click.echo(m))
    return settings.model_copy(update=status_settings(status)), True


def status_settings(status: launcher.InfraStatus) -> dict[str, str]:
    return {"kafka_bootstrap": status.kafka_bootstrap, "redis_url": status.redis_url}


def _redis_answers(settings: Settings) -> bool:
    from clipstream.infra.redis import redis_answers

    password = settings.redis_password.get_secret_value() if settings.redis_password is not None else None
    return redis_answers(settings.redis_url, password=password)
