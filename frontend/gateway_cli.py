"""``clipstream gateway``: serve the REST gateway with uvicorn.

Prints exactly one line ``ready: gateway http://HOST:PORT`` on stdout once the socket is
bound and the lifespan (Kafka, Redis, registry) has started, so scripts and tests wait for a
line instead of polling a port. ``--port 0`` picks a free port and the line names it.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import sys
from collections.abc import Callable
from typing import Any

import click

from clipstream.errors import ClipstreamError
from clipstream.settings import get_settings, settings_or_exit
from frontend.gateway import create_app
from frontend.http_protocol import stamped_protocol
from frontend.settings import GatewaySettings, get_gateway_settings
from topics.catalogue import Catalogue
from topics.metrics import serve_metrics
from topics.stage import announce_ready, beat_on_loop, exit_code


BACKLOG = 4096  # connections the kernel queues before accept
GRPC_GRACE_S = 2.0  # how long gRPC calls in flight may take to end when the gateway stops
STARTUP_FAILED = 3  # the exit code of a gateway whose startup failed, as uvicorn's own (STARTUP_FAILURE)


@click.command()
@click.option("--host", default=None, help="Listen address (CLIPSTREAM_GATEWAY_HOST, 127.0.0.1).")
@click.option("--port", type=int, default=None, help="Port (CLIPSTREAM_GATEWAY_PORT, 8080; 0 = any).")
@click.option("--grpc-port", type=click.IntRange(0, 65535), default=None,
              help="Also serve the Open Inference Protocol over gRPC here (CLIPSTREAM_GATEWAY_GRPC_PORT; 0 = any).")
@click.option("--instance", default=None, help="Instance id: names the reply topic (default random).")
@click.option("--max-inflight", type=int, default=None, help="Predict requests at once before 503.")
@click.option("--log-level", default=None, help="uvicorn/python log level (default warning).")
@click.option("--reuse-port", is_flag=True,
              help="Share the port with other gateways (SO_REUSEPORT): the kernel spreads connections over them.")
def gateway(
    host: str | None, port: int | None, grpc_port: int | None, instance: str | None, max_inflight: int | None,
    log_level: str | None, reuse_port: bool,
) -> None:
    """Serve POST /v1/apps/{app}/predict and /feedback, /healthz, /readyz, /metrics, and the
    Open Inference Protocol (/v2; over gRPC too with --grpc-port)."""
    overrides: dict[str, Any] = {
        k: v for k, v in {"host": host, "port": port, "grpc_port": grpc_port, "instance": instance,
                          "max_inflight": max_inflight, "log_level": log_level}.items()
        if v is not None
    }
    gw = settings_or_exit(lambda: get_gateway_settings(**overrides), GatewaySettings.model_config.get("env_prefix"))
    settings = settings_or_exit(get_settings)
    try:

        Catalogue.from_settings(settings).replies(gw.instance)  # a bad instance id fails here
    except ClipstreamError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    logging.basicConfig(level=gw.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    with asyncio.Runner(loop_factory=_loop_factory(gw.uvloop)) as runner:
        code = runner.run(_serve(gw, settings, reuse_port))
    sys.exit(code or exit_code())


def _loop_factory(use_uvloop: bool) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """libuv's loop when asked for and installed, else asyncio's own (None). The event loop is
    where the gateway's callers queue: every request is a few socket calls, timers and
    wake-ups, and uvloop makes each cheaper (docs/design/0008)."""
    if not use_uvloop:
        return None
    try:
        import uvloop
    except ImportError:  # an optional speed-up; asyncio's own loop works the same
        return None
    return uvloop.new_event_loop


def shared_socket(host: str, port: int, backlog: int) -> socket.socket:
    """A listening socket that other gateway members bind too (``SO_REUSEPORT``): while one of
    them restarts, the kernel hands new connections to the others (docs/design/0023)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    sock.setblocking(False)
    return sock


def bind_failure(host: str, port: int, exc: OSError) -> str:
    """What a failed bind means and what to do; a traceback would hide the port."""
    if exc.errno == errno.EADDRINUSE:
        return (f"port {port} on {host} is in use (by something that does not share it with "
                "--reuse-port): choose another with --port or stop what holds it")
    return f"cannot listen on {host}:{port} ({exc.strerror or exc}): check --host and --port"


async def _serve(gw: Any, settings: Any, reuse_port: bool = False) -> int:
    import uvicorn

    try:  # bound first, so a taken port is one line before anything starts
        sockets = [shared_socket(gw.host, gw.port, BACKLOG)] if reuse_port else None
    except OSError as exc:
        click.echo(f"error: {bind_failure(gw.host, gw.port, exc)}", err=True)
        return 1
    app = create_app(gw, settings)
    grpc_server = grpc_port = None
    if gw.grpc_port is not None:  # bound before the gateway starts too, for the same reason
        from frontend.v2_grpc import start_grpc  # grpc is imported by the gateways that serve it only

        try:
            grpc_server, grpc_port = await start_grpc(app.state.gateway, gw, reuse_port, GRPC_GRACE_S)
        except RuntimeError:  # grpc's failed bind (its own log line above says why)
            click.echo(f"error: cannot serve gRPC on {gw.host}:{gw.grpc_port}: the port is taken, or the host is not "
                       "this machine's. Choose another with --grpc-port (CLIPSTREAM_GATEWAY_GRPC_PORT), or stop what "
                       "holds it", err=True)
            return 1
    app.state.gateway.metrics.expose()
    serve_metrics("gateway")
    config = uvicorn.Config(
        app,
        host=gw.host,
        port=gw.port,
        log_level=gw.log_level.lower(),
        access_log=False,  # one log line per request would cost more than the request
        lifespan="on",
        backlog=BACKLOG,
        timeout_keep_alive=30,
        http=stamped_protocol(gw.max_head_bytes, gw.head_timeout_s) or "auto",
        # HTTPS when CLIPSTREAM_GATEWAY_TLS_CERT/_KEY name a certificate and its key
        ssl_certfile=str(gw.tls_cert) if gw.tls_cert else None,
        ssl_keyfile=str(gw.tls_key) if gw.tls_key else None,
    )
    server = uvicorn.Server(config)
    quiet = _QuietFailedStartup(app)
    logging.getLogger("uvicorn.error").addFilter(quiet)
    if grpc_server is not None:
        _stop_with(server, grpc_server)
    task = asyncio.create_task(_serve_until_exit(server, sockets))
    while not server.started and not task.done():
        await asyncio.sleep(0.01)
    if server.started:
        port = gw.port
        for srv in server.servers:
            for sock in srv.sockets:
                port = sock.getsockname()[1]
                break
        if grpc_port is not None:
            click.echo(f"grpc: {gw.host}:{grpc_port} (the Open Inference Protocol)")
        announce_ready("gateway", f"{gw.scheme}://{gw.host}:{port}")
        beat_on_loop("gateway")  # the serving loop's proof of life for `up`
    await task
    if grpc_server is not None:  # stopped already, unless uvicorn ended without a signal (a failed startup)
        await grpc_server.stop(grace=0)
    logging.getLogger("uvicorn.error").removeFilter(quiet)
    if server.started:
        return 0
    # uvicorn reports a failed startup by exiting the serve loop without having started
    why = getattr(app.state, "startup_error", None) or "the gateway did not start (see the log above)"
    click.echo(f"error: {why}", err=True)
    return STARTUP_FAILED


def _stop_with(server: Any, grpc_server: Any) -> None:
    """Stop the gRPC server taking calls when uvicorn is told to stop (its signal handler), so
    that both drain their calls in flight before the lifespan lets go of Kafka
    (``state.draining``)."""
    loop, exit_, stopping = asyncio.get_running_loop(), server.handle_exit, []

    def handle_exit(sig: int, frame: Any) -> None:
        exit_(sig, frame)
        if not stopping:
            loop.call_soon_threadsafe(lambda: stopping.append(asyncio.ensure_future(grpc_server.stop(GRPC_GRACE_S))))

    server.handle_exit = handle_exit  # uvicorn installs its signal handlers from it when it serves


class _QuietFailedStartup(logging.Filter):
    """Drops uvicorn's errors once the app's startup failed (its tracebacks and "Application
    startup failed"): the gateway prints the cause as one line instead."""

    def __init__(self, app: Any) -> None:
        super().__init__()
        self.app = app

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR or getattr(self.app.state, "startup_error", None) is None


async def _serve_until_exit(server: Any, sockets: list[socket.socket] | None) -> None:
    """``server.serve``, with uvicorn's ``sys.exit(3)`` on a failed startup turned into a normal
    end: a SystemExit in a task would leave the event loop before ``_serve`` could explain it."""
    try:
        await server.serve(sockets=sockets)
    except SystemExit as exc:
        if exc.code != STARTUP_FAILED:
            raise


if __name__ == "__main__":
    gateway()
