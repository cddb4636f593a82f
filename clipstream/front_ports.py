"""The ports ``clipstream up`` gives its gateways (HTTP, and gRPC when asked), checked free before
anything is applied or started, so a taken port fails the start with what to do."""

from __future__ import annotations

import errno
import os
import socket

import click

from clipstream.errors import ClipstreamError, ConfigError
from frontend.settings import GatewaySettings

# the gateway's own defaults, as a stage started with no setting takes them (not read from the environment)
GATEWAY_DEFAULTS = GatewaySettings.model_construct()


class GatewayPortTaken(ClipstreamError):
    """The gateway's port cannot be bound: found before ``up`` applies or starts anything."""


def gateway_url(env: dict[str, str], port: int) -> str:
    """Where the gateway serves: HTTPS when its stage gets a certificate
    (``CLIPSTREAM_GATEWAY_TLS_CERT`` and ``_TLS_KEY``)."""
    scheme = "https" if env.get("CLIPSTREAM_GATEWAY_TLS_CERT") else "http"
    return f"{scheme}://{env.get('CLIPSTREAM_GATEWAY_HOST', '127.0.0.1')}:{port}"


def choose_http_port(asked: int | None, free_ports: bool) -> int | None:
    """The port the gateways will listen on, checked free on the gateway's host; with
    ``--free-ports`` and no ``--gateway-port``, a free one instead of a taken one (else the
    port asked, None for the gateway's own default). Two gateways sharing the port
    (``CLIPSTREAM_UP_GATEWAYS``, SO_REUSEPORT) are not started yet, so a plain bind tells."""
    port = _port_asked(asked, "CLIPSTREAM_GATEWAY_PORT", str(GATEWAY_DEFAULTS.port), "--gateway-port")
    if port == 0 or port is None:  # the gateway picks one itself
        return asked
    bound = _checked_port(port, asked, free_ports, "port", "--gateway-port")
    return asked if bound == port else bound


def choose_grpc_port(asked: int | None, free_ports: bool) -> int | None:
    """The port the gateways serve gRPC on (None: they do not), checked as the HTTP port is;
    0 becomes a free one here, which every gateway then shares (SO_REUSEPORT)."""
    port = _port_asked(asked, "CLIPSTREAM_GATEWAY_GRPC_PORT", "", "--grpc-port")
    return None if port is None else _checked_port(port, asked, free_ports, "gRPC port", "--grpc-port")


def _port_asked(asked: int | None, env: str, default: str, option: str) -> int | None:
    """The port ``option`` asks for, else the one ``env`` names or ``default`` (None: neither names
    one and there is no default)."""
    if asked is not None:
        return asked
    raw = os.environ.get(env, default).strip()
    if not raw and not default:  # a port that is off unless named
        return None
    if not (raw.isdigit() and int(raw) <= 65535):
        raise ConfigError(f"{env}={raw!r} is not a port: set it to a number from 0 to 65535, or pass {option} P")
    return int(raw)


def _checked_port(port: int, asked: int | None, free_ports: bool, what: str, option: str) -> int:
    """``port`` if it can be bound on the gateway's host (0: a free one), or with ``--free-ports``
    a free one when the port was not asked for; GatewayPortTaken says what to do otherwise."""
    host = os.environ.get("CLIPSTREAM_GATEWAY_HOST", GATEWAY_DEFAULTS.host)
    try:
        return bind_once(host, port)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE and free_ports and asked is None:
            free = bind_once(host, 0)
            click.echo(f"gateway: {what} {port} on {host} is in use; using free port {free} (--free-ports)")
            return free
        if exc.errno == errno.EADDRINUSE:
            instead = f"another {option} P" if asked is not None else f"{option} P or --free-ports"
            raise GatewayPortTaken(f"{what} {port} on {host} is in use (another clipstream up, or another server); "
                                   f"stop it, or pass {instead}") from None
        raise GatewayPortTaken(f"cannot listen on {host}:{port} ({exc.strerror or exc}): check "
                               f"CLIPSTREAM_GATEWAY_HOST and {option}") from None


def bind_once(host: str, port: int) -> int:
    """Bind ``host:port`` as the gateway will and let go at once; the port bound (a free one for
    0). SO_REUSEADDR, as the gateway's: a closed connection in TIME_WAIT does not count as in
    use, and no SO_REUSEPORT, so a gateway that shares its port (another ``up``'s) does."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        return int(sock.getsockname()[1])
