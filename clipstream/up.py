"""`clipstream up -f app.yaml`: the whole pipeline on one machine, supervised.

Starts Kafka and Redis if they are not running, applies the app file, then runs the gateway
(``CLIPSTREAM_UP_GATEWAYS`` members on one port, 1 by default), the selector members (``CLIPSTREAM_UP_SELECTORS``, 2 by default), and per model a batcher and one worker per replica. It keeps following the
registry, so a model deployed or linked later (or given more replicas) gets its processes
without a restart. A new version of a model (``deploy-model``, ``rollback``) gets its own
workers beside the old version's, which serve until the batcher moves the model's batches to
the new ones, once they are loaded and warm (docs/design/0021).
Ctrl-C, SIGTERM or SIGHUP stops everything it started, the infrastructure too. Killed outright,
it takes its stages with it (``clipstream.infra.die_with``); Kafka and Redis then run on.

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
import shlex
import signal
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import click
from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from clipstream.errors import ClipstreamError, InfraError
from batchers.settings import BatcherSettings
from clipstream.front_ports import GATEWAY_DEFAULTS, choose_grpc_port, choose_http_port, gateway_url
from frontend.settings import GatewaySettings
from selector.settings import SelectorSettings
from workers.settings import WorkerSettings
from clipstream.infra import PARENT_ENV, launcher
from clipstream.infra.readiness import kafka_refusal
from clipstream.lease import UpLease
from clipstream.metrics_targets import FILE_NAME as TARGETS_FILE, TARGETS_LINE, MetricTargets
from clipstream.pipeline import Pipeline, gateway_stages, say, stage_argv
from clipstream.redisclient import sync_client
from clipstream.settings import Settings, get_settings, redacted_url, settings_or_exit
from clipstream.supervise import MIN_HEARTBEAT_TIMEOUT_S, Supervisor
from clipstream.warmup import warm_up
from registry.appfile import apply_file, load_app_file
from registry.repository import Repository
from registry.topic import RegistryFollower
from topics.admin import credentials_refused
from topics.catalogue import REQUEST_PARTITIONS
from topics.client import common_config
from topics.membership import MEMBER_ENV

READY_TIMEOUT_S = 180.0
SPARES_TIMEOUT_S = 60.0


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


@click.command("up")
@click.option("-f", "--file", "path", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--gateway-port", type=click.IntRange(0, 65535), default=None,
              help="default: CLIPSTREAM_GATEWAY_PORT or 8080")
@click.option("--grpc-port", type=click.IntRange(0, 65535), default=None,
              help="also serve the Open Inference Protocol over gRPC here (0: a free port); default: "
                   "CLIPSTREAM_GATEWAY_GRPC_PORT, or none")
@click.option("--free-ports", is_flag=True, help="start Kafka and Redis on free ports if they are not running (those of their last "
              "start in the state dir while free), and the gateway on a free port if its default one is taken")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
def up(path: str, gateway_port: int | None, grpc_port: int | None, free_ports: bool, state_dir: Path | None) -> None:
    """Run the whole pipeline for an app file until Ctrl-C."""
    overrides: dict[str, Any] = {"state_dir": state_dir} if state_dir else {}
    run = _Run(settings_or_exit(lambda: get_settings(**overrides)))
    up_settings = settings_or_exit(UpSettings)
    for stage_settings in STAGE_SETTINGS:  # a stage's bad CLIPSTREAM_* value stops up before anything starts
        settings_or_exit(stage_settings)
    try:  # before anything is applied or started: a taken port would fail only once all else is up
        gateway_port = choose_http_port(gateway_port, free_ports)
        grpc_port = choose_grpc_port(grpc_port, free_ports)
        load_app_file(path, Repository.from_settings(run.settings))  # and a wrong file before Kafka starts
    except ClipstreamError as exc:
        say(f"error: {exc}")
        raise SystemExit(1) from None
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # SIGHUP: its terminal closed
        signal.signal(sig, run.on_signal)
    try:
        run.settings, run.started_infra, note = _ensure_infra(run.settings, free_ports)
        settings = run.settings
        env = _stage_env(settings, gateway_port)
        if grpc_port is not None:
            env["CLIPSTREAM_GATEWAY_GRPC_PORT"] = str(grpc_port)
        port = env.get("CLIPSTREAM_GATEWAY_PORT", str(GATEWAY_DEFAULTS.port))
        url = gateway_url(env, port)
        click.echo(f"infra: kafka={settings.kafka_bootstrap} redis={redacted_url(settings.redis_url, settings.redis_password)}")
        exports = cli_exports(settings, get_settings())
        if exports:
            click.echo("other clipstream commands (inspect, deadletters, infra status) reach these after:")
            click.echo(exports)
        run.lease = UpLease(sync_client(settings), settings.topic_prefix, url).claim()  # before the registry
        if note:
            click.echo(note)
        click.echo(f"applying {path}")
        apply_file(settings, path)
        log_dir = Path(settings.state_dir) / "up" / f"gateway-{port}"
        run.supervisor = supervisor = Supervisor(log_dir, report=say, healthy_s=up_settings.healthy_s,
                                                 heartbeat_timeout_s=up_settings.heartbeat_timeout_s)
        run.targets = targets = MetricTargets(log_dir / TARGETS_FILE)
        run.pipeline = pipeline = Pipeline(supervisor, env, shared_batcher=up_settings.batchers == "shared",
                                           targets=targets, batcher_members=up_settings.batcher_members,
                                           spares=up_settings.spares)
        supervisor.hint = pipeline.hint
        run.follower = follower = RegistryFollower(settings).start()
        view = follower.wait_ready(30)
        _add_front_stages(supervisor, env, targets, up_settings, port)
        pipeline.sync(view)
        click.echo(f"starting {len(supervisor.stages)} stages (logs in {log_dir})")
        pipeline.app_file = path
        _start_and_warm_up(supervisor, targets, follower, env, url, up_settings.warm_up_s)
        pipeline.app_file = None  # serving: the registry verbs are the way out from now on
        run.serving.set()
        supervisor.serving = True
        if grpc_port is not None:
            click.echo(f"grpc: {env.get('CLIPSTREAM_GATEWAY_HOST', GATEWAY_DEFAULTS.host)}:{grpc_port} "
                       "(the Open Inference Protocol)")
        click.echo(f"ready: {url}", nl=True)
        sys.stdout.flush()
        _watch_infra(settings, run.stop)
        _serve(run.stop, supervisor, pipeline, follower, targets)
    except ClipstreamError as exc:
        say(f"error: {exc}")
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    finally:
        run.clean_up()


STAGE_SETTINGS = (GatewaySettings, SelectorSettings, BatcherSettings, WorkerSettings)


@dataclass
class _Run:
    """What ``up`` has started so far: its signal handler and its ``finally`` both need it, and
    either may run at any step of the start, when some parts do not exist yet."""

    settings: Settings
    stop: threading.Event = field(default_factory=threading.Event)
    serving: threading.Event = field(default_factory=threading.Event)
    started_infra: bool = False
    supervisor: Supervisor | None = None
    pipeline: Pipeline | None = None
    follower: RegistryFollower | None = None
    lease: UpLease | None = None
    targets: MetricTargets | None = None

    def on_signal(self, *_: Any) -> None:
        """SIGINT/SIGTERM/SIGHUP: once serving, only ask ``watch`` to stop; while still starting, also
        interrupt whatever waits, so that ``finally`` cleans up."""
        self.stop.set()
        if self.supervisor is not None:
            self.supervisor.interrupt()
        if not self.serving.is_set():  # still starting: interrupt whatever waits; ``finally`` cleans up
            raise KeyboardInterrupt

    def clean_up(self) -> None:
        """Stop what was started, the registry's follower first so no change starts a stage while
        the stages stop, and the infrastructure last, only if this run started it."""
        # whoever read our output may be gone (a closed pipe): stopping must not depend on it
        say("stopping...")
        if self.follower is not None:
            self.follower.stop()
        if self.supervisor is not None:
            if self.pipeline is not None:
                self.pipeline.hand_back()
            self.supervisor.stop_all(first=("gateway",))  # the callers in flight are answered
        if self.targets is not None:  # a Prometheus following the file drops the stopped stages
            self.targets.keep([])
        if self.lease is not None:  # the stages are gone: another up may have the prefix now
            self.lease.release()
        if self.started_infra:
            launcher.down(self.settings)
            say("stopped Kafka and Redis too, as this up started them: `clipstream infra up` before `up` "
                "keeps them, and the registry readable by inspect, after `up` stops")
        say("stopped")


def _stage_env(settings: Settings, gateway_port: int | None) -> dict[str, str]:
    """The environment every stage starts with: it points them at the infrastructure found or
    started here, which may not be where the caller's own environment points."""
    env = {
        **os.environ,
        "CLIPSTREAM_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "CLIPSTREAM_REDIS_URL": settings.redis_url,
        **settings.secret_env(),  # the URL's password moved to CLIPSTREAM_REDIS_PASSWORD
        "CLIPSTREAM_TOPIC_PREFIX": settings.topic_prefix,
        "PYTHONUNBUFFERED": "1",
        PARENT_ENV: str(os.getpid()),  # a stage ends with this up, even one killed outright
    }
    if gateway_port is not None:
        env["CLIPSTREAM_GATEWAY_PORT"] = str(gateway_port)
    return env


def _add_front_stages(supervisor: Supervisor, env: dict[str, str], targets: MetricTargets,
                      up_settings: UpSettings, port: str) -> None:
    """Add the selectors and the gateways: they serve every model, so they come from the
    settings, not from the registry as the batchers and workers do."""
    # a process per model reads only its model's requests: one record per model, not one that
    # a model's batcher forwards to the others, unless the environment says (docs/design/0082)
    fan_out = {} if up_settings.batchers == "shared" else {"CLIPSTREAM_SELECTOR_FAN_OUT": "per-model"}
    for i in range(1, up_settings.selectors + 1):  # named: static group members (topics.membership)
        supervisor.add(f"selector-{i}", stage_argv("selector"),
                       targets.env(f"selector-{i}", {**fan_out, **env, MEMBER_ENV: f"selector-{i}"}),
                       spare=up_settings.spares)
    for name, argv in gateway_stages(up_settings.gateways, port):
        supervisor.add(name, argv, targets.env(name, env), spare=up_settings.spares)


def _start_and_warm_up(supervisor: Supervisor, targets: MetricTargets, follower: RegistryFollower,
                       env: dict[str, str], url: str, warm_up_s: float) -> None:
    """Wait for every stage, say where to scrape and look, and warm up before ``ready``: the
    first requests to a fresh pipeline would otherwise be slow (clipstream/warmup.py)."""
    supervisor.wait_ready(READY_TIMEOUT_S)
    for line in targets.lines():
        click.echo(line)
    click.echo(f"{TARGETS_LINE}{targets.path}")
    click.echo(f"dashboard: {url}/dashboard")
    supervisor.start_spares()  # the warm-up's traffic absorbs their imports
    warm_up(url, follower.view(), env, report=lambda m: click.echo(m), seconds=warm_up_s)
    supervisor.wait_spares(SPARES_TIMEOUT_S)  # none imports in the first seconds of serving


def _serve(stop: threading.Event, supervisor: Supervisor, pipeline: Pipeline, follower: RegistryFollower,
           targets: MetricTargets) -> None:
    """Serve until ``stop``: from now on a registry change starts or stops stages, and each
    check restarts dead stages and retires replaced ones."""
    follower.add_listener(lambda v: _report_started(pipeline.sync(v), targets))

    def upkeep() -> None:
        targets.keep([*supervisor.stages, *pipeline.leaving])
        pipeline.retire()

    # a dead stage is restarted as soon as it exits (a failover waits for that)
    supervisor.watch(stop, upkeep)


def _watch_infra(settings: Settings, stop: threading.Event) -> None:
    """Say when a Kafka broker leaves or comes back, and when Kafka or Redis stop or start
    answering (``clipstream.infra.watch``)."""
    from confluent_kafka.admin import AdminClient

    from clipstream.infra.watch import InfraWatch, kafka_brokers
    from clipstream.redisclient import sync_client
    from topics.catalogue import Catalogue
    from topics.client import admin_config

    admin = AdminClient(admin_config(settings))
    redis = sync_client(settings)
    local = launcher.status(settings).kafka_pid is not None
    hint = (f"`clipstream infra up --state-dir {settings.state_dir}` restarts a node it started"
            if local else "Restart it where it runs")
    registry = Catalogue.from_settings(settings).registry.name
    InfraWatch(lambda: kafka_brokers(admin, registry), lambda: bool(redis.ping()), say, hint).run(stop)


def _report_started(stages: list[str], targets: MetricTargets | None = None) -> None:
    for stage in stages:
        click.echo(f"started {stage} (registry change)", err=True)
    for line in targets.lines(stages) if targets is not None else []:
        click.echo(line)


def _ensure_infra(settings: Settings, free_ports: bool) -> tuple[Settings, bool, str | None]:
    """Use Kafka/Redis where the settings point if they answer; else start them locally. A
    Kafka or Redis named on purpose (``CLIPSTREAM_KAFKA_BOOTSTRAP``, ``CLIPSTREAM_REDIS_URL``)
    is never swapped for a local one: serving from a cluster nobody asked for would hide it.
    The settings, whether this call started them, and a note for the operator, said once this
    up has the topic prefix (another up may be the one using them)."""
    kafka_ok, refused = kafka_refusal(settings.kafka_bootstrap, common_config(settings))
    if refused is not None:  # it answered: starting another would not make these credentials right
        raise credentials_refused(settings.kafka_bootstrap, refused)
    redis_ok = _redis_answers(settings)
    if kafka_ok and redis_ok:
        return settings, False, None
    _refuse_to_replace(settings, kafka_ok, redis_ok)
    status = launcher.status(settings)
    if status.running:  # left by an `infra up`, or by an `up` that was killed: it stops them not
        return settings.model_copy(update=status_settings(status)), False, (
            f"using the Kafka and Redis recorded in {status.state_dir}, which this up did not start "
            f"(`clipstream infra down --state-dir {status.state_dir}` stops them)")
    click.echo("starting Kafka and Redis ...")
    status = launcher.up(settings, free_ports=free_ports, progress=lambda m: click.echo(m))
    return settings.model_copy(update=status_settings(status)), True, None


def _refuse_to_replace(settings: Settings, kafka_ok: bool, redis_ok: bool) -> None:
    """InfraError when starting a local Kafka and Redis would drop one the settings name."""
    named = settings.model_fields_set
    kafka = f"Kafka at {settings.kafka_bootstrap}"
    redis = f"Redis at {redacted_url(settings.redis_url)}"
    for ok, field_name, var, what, check in (
            (kafka_ok, "kafka_bootstrap", "CLIPSTREAM_KAFKA_BOOTSTRAP", kafka, "its addresses and security settings"),
            (redis_ok, "redis_url", "CLIPSTREAM_REDIS_URL", redis, "its address and password")):
        if field_name in named and not ok:
            raise InfraError(f"{what} ({var}) does not answer (check {check}); start it, or unset {var} "
                             "so that up starts a local one")
    if named & {"kafka_bootstrap", "redis_url"}:  # one named and answering: the other is not there
        missing, var = (redis, "CLIPSTREAM_REDIS_URL") if kafka_ok else (kafka, "CLIPSTREAM_KAFKA_BOOTSTRAP")
        raise InfraError(f"{missing} does not answer, and up starts a local one only together with the other: "
                         f"start it, or set {var} to one that answers")


def cli_exports(used: Settings, own: Settings) -> str:
    """The ``export`` line that points another shell's clipstream commands where ``up`` runs,
    or "" when their own settings (``own``) already do: after ``--free-ports`` or ``--state-dir``
    they would look at the defaults and find nothing."""
    pairs = [(var, redacted_url(str(getattr(used, name))) if name == "redis_url" else str(getattr(used, name)))
             for name, var in (
        ("kafka_bootstrap", "CLIPSTREAM_KAFKA_BOOTSTRAP"), ("redis_url", "CLIPSTREAM_REDIS_URL"),
        ("state_dir", "CLIPSTREAM_STATE_DIR")) if getattr(used, name) != getattr(own, name)]
    return "export " + " ".join(f"{var}={shlex.quote(value)}" for var, value in pairs) if pairs else ""


def status_settings(status: launcher.InfraStatus) -> dict[str, str]:
    return {"kafka_bootstrap": status.kafka_bootstrap, "redis_url": status.redis_url}


def _redis_answers(settings: Settings) -> bool:
    from clipstream.infra.redis import redis_answers

    password = settings.redis_password.get_secret_value() if settings.redis_password is not None else None
    return redis_answers(settings.redis_url, password=password)
