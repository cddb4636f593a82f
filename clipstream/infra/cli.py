"""``clipstream infra``: start, stop and inspect the local Kafka broker and Redis.

Progress goes to stderr and the addresses to stdout, so scripts can read the addresses. Every
expected failure (missing binary, busy port, broker that will not start) is one line on stderr
that says what to do, and exit code 1: a traceback would bury the advice.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from clipstream.errors import ClipstreamError
from clipstream.settings import Settings, get_settings, settings_or_exit

STATE_DIR_OPTION = click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where pids, logs and data live (default: CLIPSTREAM_STATE_DIR, else "
    "$XDG_STATE_HOME/clipstream or ~/.local/state/clipstream).",
)

# the secure broker is Kafka only: a stage also needs a Redis, which the operator must name
NO_REDIS_NOTE = ("note: this command starts no Redis: set CLIPSTREAM_REDIS_URL to a running one "
                 "(`clipstream infra up` without --secure starts one, next to a plaintext broker)")


def _settings(state_dir: Path | None, **overrides: Any) -> Settings:
    """The settings with the options on top; a bad ``CLIPSTREAM_*`` value is one line, exit 2."""
    values = {key: value for key, value in overrides.items() if value is not None}
    if state_dir is not None:
        values["state_dir"] = state_dir
    return settings_or_exit(lambda: get_settings(**values))


def _progress(message: str) -> None:
    click.echo(message, err=True)


@contextlib.contextmanager
def _one_line_errors() -> Iterator[None]:
    try:
        yield
    except ClipstreamError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)


@click.group()
def infra() -> None:
    """Local Kafka (KRaft: one node, or a cluster with --brokers) and Redis."""


@infra.command()
@click.option("--kafka-port", type=int, default=None, help="Broker port (controller: port+1).")
@click.option("--redis-port", type=int, default=None, help="Redis port.")
@click.option("--free-ports", is_flag=True, help="Pick unused ports instead of fixed ones (those of the last such start in the state dir while free).")
@click.option(
    "--brokers",
    type=click.IntRange(min=1),
    default=None,
    help="Kafka nodes (default 1; 3: a cluster whose topics get 3 replicas, 2 in sync). "
    "Fixed ports: node i listens on --kafka-port + 2(i-1), its controller on the next port.",
)
@click.option("--secure", is_flag=True, help="Run a one-node broker that wants credentials instead (SASL_SSL, "
              "SCRAM-SHA-512, a CA made now), in the foreground: the same as `infra secure-broker`.")
@STATE_DIR_OPTION
@click.pass_context
def up(
    ctx: click.Context,
    kafka_port: int | None,
    redis_port: int | None,
    free_ports: bool,
    brokers: int | None,
    secure: bool,
    state_dir: Path | None,
) -> None:
    """Start Kafka and Redis (or report the running ones) and print their addresses."""
    from clipstream.infra import launcher

    if secure:
        if brokers not in (None, 1):
            raise click.UsageError("--secure runs one broker: leave out --brokers")
        ctx.invoke(secure_broker, port=None if free_ports else kafka_port, user="clipstream", state_dir=state_dir)
        return

    settings = _settings(state_dir, kafka_port=kafka_port, redis_port=redis_port)
    with _one_line_errors():
        result = launcher.up(
            settings, free_ports=free_ports, progress=_progress, brokers=brokers
        )
    click.echo(f"kafka: {result.kafka_bootstrap}")
    click.echo(f"redis: {result.redis_url}")
    for key, value in result.env().items():
        click.echo(f"export {key}={value}")
    if state_dir is not None:
        click.echo(f"export CLIPSTREAM_STATE_DIR={result.state_dir}")


@infra.command()
@STATE_DIR_OPTION
def down(state_dir: Path | None) -> None:
    """Stop the Kafka nodes and Redis that `up` started in this state dir."""
    from clipstream.infra import launcher

    with _one_line_errors():
        stopped = launcher.down(_settings(state_dir))
    click.echo("stopped " + ", ".join(stopped) if stopped else "nothing was running")


@infra.command()
@STATE_DIR_OPTION
def status(state_dir: Path | None) -> None:
    """Show the addresses and pids recorded by `up` (each node of a cluster); exit code 1
    unless Redis and every Kafka node run and serve (a stopped process, or a Redis that does
    not answer PING, is named with what to do)."""
    from clipstream.infra import launcher

    settings = _settings(state_dir)
    with _one_line_errors():
        result = launcher.status(settings)
    stuck = False
    for name, address, pid, running in (
        ("kafka", result.kafka_bootstrap, result.kafka_pid, result.kafka_running),
        ("redis", result.redis_url, result.redis_pid, result.redis_running),
    ):
        cluster = name == "kafka" and len(result.kafka_nodes) > 1
        if cluster:  # each node is judged on its line below
            state = f"{sum(node.running for node in result.kafka_nodes)} of {len(result.kafka_nodes)} nodes running"
        else:
            state, serves = _serving(name, address, pid) if running and pid is not None else ("not running", False)
            stuck = stuck or running and not serves
        click.echo(f"{name}: {address} {state}")
        if cluster:
            for node in result.kafka_nodes:
                how, serves = (_serving(name, node.address, node.pid) if node.running
                               else (f"not running (was pid {node.pid})", False))
                stuck = stuck or node.running and not serves
                click.echo(f"kafka node {node.node_id}: {node.address} {how}")
    if result.running and stuck:
        sys.exit(1)
    if not result.running:
        elsewhere = _answering_elsewhere(settings)
        if elsewhere:  # the addresses this shell names answer: another state dir recorded them
            click.echo(f"{elsewhere} answer, but were not started from {result.state_dir}: set "
                       "CLIPSTREAM_STATE_DIR (or --state-dir) to the state dir of the up or infra up that "
                       "started them", err=True)
        else:
            where = f" --state-dir {state_dir}" if state_dir is not None else ""
            click.echo(f"start them with `clipstream infra up{where}`", err=True)
        sys.exit(1)


def _serving(name: str, address: str, pid: int) -> tuple[str, bool]:
    """How a live process serves: (``running (pid N)``, True), or why it serves nothing and what
    to do, and False."""
    from clipstream.infra import process_stopped
    from clipstream.infra.redis import redis_silent

    if process_stopped(pid):
        return f"stopped (pid {pid}; SIGSTOP or a debugger): it serves nothing; resume it with `kill -CONT {pid}`", False
    if name == "redis" and redis_silent(address):
        return (f"running (pid {pid}) but not answering: PING got no reply in 1 s (hung or overloaded); "
                "see its log in the state dir, or restart it with `clipstream infra down` and `infra up`"), False
    return f"running (pid {pid})", True


def _answering_elsewhere(settings: Settings) -> str:
    """The Kafka and Redis this shell's CLIPSTREAM_* variables name, where they answer: "" when
    it names none, or none of them answers."""
    from clipstream.infra.readiness import kafka_answers
    from clipstream.infra.redis import redis_answers
    from clipstream.settings import redacted_url
    from topics.client import common_config

    named = settings.model_fields_set
    password = settings.redis_password.get_secret_value() if settings.redis_password is not None else None
    found = []
    if "kafka_bootstrap" in named and kafka_answers(settings.kafka_bootstrap, common_config(settings)):
        found.append(f"Kafka at {settings.kafka_bootstrap} (CLIPSTREAM_KAFKA_BOOTSTRAP)")
    if "redis_url" in named and redis_answers(settings.redis_url, password):
        found.append(f"Redis at {redacted_url(settings.redis_url)} (CLIPSTREAM_REDIS_URL)")
    return " and ".join(found)


@infra.command()
def fetch() -> None:
    """Download the Kafka broker jars into the cache (a no-op once they are there)."""
    from clipstream.infra import kafka

    with _one_line_errors():
        libs = kafka.fetch_jars(_settings(None), progress=_progress)
    click.echo(f"kafka jars: {libs}")


@infra.command("secure-broker")
@click.option("--port", type=int, default=None, help="SASL_SSL port (default: a free one; controller: another).")
@click.option("--user", default="clipstream", show_default=True, help="The SCRAM-SHA-512 user to create.")
@STATE_DIR_OPTION
def secure_broker(port: int | None, user: str, state_dir: Path | None) -> None:
    """Run a one-node broker with a SASL_SSL listener (SCRAM-SHA-512, a CA made now) until Ctrl-C.

    The password is CLIPSTREAM_KAFKA_SASL_PASSWORD when set, else a random one written to a
    file only the owner reads; it is never printed. Prints the variables a stage needs. Its
    folder (the CA's key, the password, the broker's data) goes when the broker stops."""
    import secrets
    import shutil
    import socket
    import tempfile
    import time

    from clipstream.infra.secure import start_secure_broker

    def free() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    settings = _settings(None)
    if state_dir is not None:  # made like `infra up --state-dir` makes it: mkdtemp wants it there
        try:
            state_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            click.echo(f"error: cannot create --state-dir {state_dir} ({exc.strerror or exc}): "
                       "choose a folder you can write", err=True)
            sys.exit(1)
    folder = Path(tempfile.mkdtemp(prefix="secure-", dir=state_dir or None))
    secret = settings.kafka_sasl_password.get_secret_value() if settings.kafka_sasl_password else None
    password_file = folder / "sasl-password"
    if secret is None:
        secret = secrets.token_urlsafe(24)
        password_file.touch(mode=0o600)
        password_file.write_text(secret)
    with _one_line_errors():
        broker = start_secure_broker(settings, folder, port or free(), free(), user, secret)
    for key, value in broker.client_env("").items():
        if key == "CLIPSTREAM_KAFKA_SASL_PASSWORD":
            value = f'"$(cat {password_file})"' if password_file.exists() else "<as set>"
        click.echo(f"export {key}={value}")
    click.echo(f"ready: secure broker {broker.bootstrap} (state in {folder}); Ctrl-C stops it", err=True)
    click.echo(NO_REDIS_NOTE, err=True)
    crashed = False
    try:
        while broker.process.poll() is None:  # SIGTERM ends us, and the broker with us
            time.sleep(0.5)
        crashed = True
        click.echo(f"error: the broker exited; its log: {broker.files.log}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        pass
    finally:
        broker.stop()
        if not crashed:  # its CA key and password served this broker alone; a crash keeps its log
            shutil.rmtree(folder, ignore_errors=True)
