"""``up``/``down``/``status`` of the local Kafka broker and Redis, tracked in one state dir.

Everything ``up`` starts is recorded in ``<state_dir>/infra.json`` (pid, the pid's start time,
ports, addresses) before it is waited on, so ``down`` can stop exactly those processes, and only
those: a recorded pid is signalled only while its start time still matches, which guards
against the pid having been reused by somebody else's process. ``up`` is idempotent: recorded
processes that are alive and answering are reported, not started again.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clipstream.errors import InfraError
from clipstream.infra import (
    file_lock,
    pid_alive,
    process_start_ticks,
    require_binary,
    wait_ready,
)
from clipstream.infra import kafka as kafka_mod
from clipstream.infra import redis as redis_mod
from clipstream.settings import Settings

STATE_FILE = "infra.json"
COMPONENTS = ("kafka", "redis")
STOP_GRACE_S = {"kafka": 20.0, "redis": 5.0}  # a broker's controlled shutdown takes seconds

Progress = Callable[[str], None]
Entry = dict[str, Any]


@dataclass
class InfraStatus:
    """Where the local infrastructure is and whether its processes are alive."""

    kafka_bootstrap: str
    redis_url: str
    kafka_pid: int | None = None
    redis_pid: int | None = None
    kafka_running: bool = False
    redis_running: bool = False
    state_dir: Path | None = None

    @property
    def running(self) -> bool:
        return self.kafka_running and self.redis_running

    def env(self) -> dict[str, str]:
        """The variables that point every clipstream process (and Settings) at this infra."""
        return {
            "CLIPSTREAM_KAFKA_BOOTSTRAP": self.kafka_bootstrap,
            "CLIPSTREAM_REDIS_URL": self.redis_url,
        }


# --- state file --------------------------------------------------------------------------


def state_dir_of(settings: Settings) -> Path:
    return Path(settings.state_dir).expanduser().resolve()


def load_state(state_dir: Path) -> dict[str, Entry]:
    """The recorded processes; empty when nothing was started (or the file is unreadable)."""
    try:
        data = json.loads((state_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {name: data[name] for name in COMPONENTS if isinstance(data.get(name), dict)}


def _save_state(state_dir: Path, state: dict[str, Entry]) -> None:
    """Write atomically, and keep one ``<name>.pid`` file per running component."""
    tmp = state_dir / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
    tmp.replace(state_dir / STATE_FILE)
    for name in COMPONENTS:
        pid_file = state_dir / f"{name}.pid"
        if name in state:
            pid_file.write_text(f"{state[name]['pid']}\n")
        else:
            pid_file.unlink(missing_ok=True)


def _entry(pid: int, **fields: Any) -> Entry:
    return {"pid": pid, "start_ticks": process_start_ticks(pid), **fields}


def is_ours_and_alive(entry: Entry | None) -> bool:
    """True when the recorded process still runs and is the same process (not a reused pid)."""
    if not entry or not isinstance(entry.get("pid"), int):
        return False
    pid = entry["pid"]
    if not pid_alive(pid):
        return False
    recorded, now = entry.get("start_ticks"), process_start_ticks(pid)
    return recorded is None or now is None or recorded == now


# --- ports ---------------------------------------------------------------------------------


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when a server could listen on ``host:port`` now (TIME_WAIT leftovers don't count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def pick_free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports the kernel says are free (all bound at once, so distinct)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in socks:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


_PORT_OPTION = {
    "kafka": "--kafka-port",
    "kafka controller": "--kafka-port (the controller uses the next port)",
    "redis": "--redis-port",
}


def plan_ports(
    settings: Settings, free_ports: bool, need_kafka: bool = True, need_redis: bool = True
) -> dict[str, int]:
    """Ports for the components about to start: keys "kafka", "controller", "redis".

    Fixed ports come from the settings (the controller takes the port after Kafka's) and must
    be free; ``free_ports`` asks the kernel for unused ones instead.
    """
    names = (["kafka", "controller"] if need_kafka else []) + (["redis"] if need_redis else [])
    if free_ports:
        return dict(zip(names, pick_free_ports(len(names)), strict=True))
    wanted = {"kafka": settings.kafka_port, "controller": settings.kafka_port + 1}
    wanted["redis"] = settings.redis_port
    ports = {name: wanted[name] for name in names}
    for name, port in ports.items():
        label = "kafka controller" if name == "controller" else name
        if not port_is_free(port):
            raise InfraError(
                f"port {port} ({label}) is already in use on 127.0.0.1: stop what holds it, "
                f"pass --free-ports, or choose another port with {_PORT_OPTION[label]}"
            )
    return ports


# --- stopping ------------------------------------------------------------------------------


def _wait_dead(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _signal_group(pid: int, sig: signal.Signals) -> None:
    """Signal the process group ``pid`` leads (spawn_detached made one), else just ``pid``."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _terminate(pid: int, grace_s: float) -> None:
    """SIGTERM the group, wait up to ``grace_s``, then SIGKILL; reap stragglers of the group."""
    _signal_group(pid, signal.SIGTERM)
    if not _wait_dead(pid, grace_s):
        _signal_group(pid, signal.SIGKILL)
        if not _wait_dead(pid, 5.0):
            raise InfraError(f"process {pid} survived SIGKILL; check `ps -p {pid}`")
    try:  # anything the leader left behind in its group
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# --- public API ----------------------------------------------------------------------------


def _status_from(settings: Settings, state_dir: Path, state: dict[str, Entry]) -> InfraStatus:
    kafka, redis = state.get("kafka"), state.get("redis")
    return InfraStatus(
        kafka_bootstrap=kafka["bootstrap"] if kafka else settings.kafka_bootstrap,
        redis_url=redis["url"] if redis else settings.redis_url,
        kafka_pid=kafka["pid"] if kafka else None,
        redis_pid=redis["pid"] if redis else None,
        kafka_running=is_ours_and_alive(kafka),
        redis_running=is_ours_and_alive(redis),
        state_dir=state_dir,
    )


def status(settings: Settings) -> InfraStatus:
    """What ``up`` recorded in the state dir, with liveness checked now."""
    state_dir = state_dir_of(settings)
    return _status_from(settings, state_dir, load_state(state_dir))


def up(
    settings: Settings,
    free_ports: bool = False,
    progress: Progress = print,
    timeout_s: float = 60.0,
    die_with_parent: bool = False,
) -> InfraStatus:
    """Start (or find running) a KRaft broker and a Redis; return once both answer.

    The jars are fetched on first use (see ``kafka.fetch_jars``). Binaries and ports are checked
    before anything starts; if either component fails to come up, whatever this call started
    is stopped again, so a failed ``up`` leaves nothing behind. ``die_with_parent`` (Linux)
    makes what this call starts exit with the calling process: for test sessions.
    """
    t0 = time.monotonic()
    state_dir = state_dir_of(settings)
    state_dir.mkdir(parents=True, exist_ok=True)
    with file_lock(state_dir / "infra.lock"):
        state = load_state(state_dir)
        for name in COMPONENTS:  # forget what died; a fresh one takes its place
            if name in state and not is_ours_and_alive(state[name]):
                del state[name]
        need_kafka, need_redis = "kafka" not in state, "redis" not in state
        ports = plan_ports(settings, free_ports, need_kafka, need_redis)
        if need_redis:
            require_binary("redis-server", redis_mod.REDIS_HINT)
        if need_kafka:
            java = require_binary("java", kafka_mod.JAVA_HINT)
            libs = kafka_mod.fetch_jars(settings, progress)
        started: list[str] = []
        try:
            if need_redis:
                proc = redis_mod.start_redis(ports["redis"], state_dir, die_with_parent)
                url = redis_mod.redis_url(ports["redis"])
                state["redis"] = _entry(proc.pid, port=ports["redis"], url=url)
                started.append("redis")
                _save_state(state_dir, state)
                progress(f"redis: starting on {url} (pid {proc.pid})")
            if need_kafka:
                files = kafka_mod.write_broker_files(state_dir, ports["kafka"], ports["controller"])
                if kafka_mod.format_storage(java, libs, files):
                    progress(f"kafka: formatted storage in {files.data_dir}")
                proc = kafka_mod.start_broker(java, libs, files, die_with_parent)
                bootstrap = f"127.0.0.1:{ports['kafka']}"
                state["kafka"] = _entry(
                    proc.pid,
                    port=ports["kafka"],
                    controller_port=ports["controller"],
                    bootstrap=bootstrap,
                    version=settings.kafka_version,
                )
                started.append("kafka")
                _save_state(state_dir, state)
                progress(f"kafka: starting broker on {bootstrap} (pid {proc.pid}), log {files.log}")
            _wait_both(state, state_dir, timeout_s)
        except BaseException:
            for name in started:
                _terminate(state[name]["pid"], STOP_GRACE_S[name])
                del state[name]
            _save_state(state_dir, state)
            raise
        if not started:
            progress("already running")
        result = _status_from(settings, state_dir, state)
        progress(
            f"ready in {time.monotonic() - t0:.1f} s: kafka {result.kafka_bootstrap}, "
            f"redis {result.redis_url} (state in {state_dir})"
        )
        return result


def _wait_both(state: dict[str, Entry], state_dir: Path, timeout_s: float) -> None:
    """Wait for Redis, then Kafka, to answer; fail fast if either process dies."""
    redis, kafka = state["redis"], state["kafka"]
    wait_ready(
        "redis-server",
        lambda: redis_mod.redis_answers(redis["url"]),
        lambda: is_ours_and_alive(redis),
        timeout_s,
        [state_dir / "redis.log", state_dir / "redis.out"],
    )
    files = kafka_mod.BrokerFiles.under(state_dir)
    wait_ready(
        "Kafka broker",
        kafka_mod.MetadataProbe(kafka["bootstrap"]),
        lambda: is_ours_and_alive(kafka),
        timeout_s,
        [files.log, files.out],
    )


def down(settings: Settings) -> list[str]:
    """Stop what ``up`` recorded in this state dir (and nothing else); return what was stopped.

    Each component's whole process group gets SIGTERM, then SIGKILL after a grace period. Data
    and logs stay in the state dir; only the record of running processes is removed.
    """
    state_dir = state_dir_of(settings)
    if not (state_dir / STATE_FILE).exists():
        return []
    stopped: list[str] = []
    with file_lock(state_dir / "infra.lock"):
        state = load_state(state_dir)
        for name in COMPONENTS:  # the broker first: it may still flush to disk
            entry = state.pop(name, None)
            if entry and is_ours_and_alive(entry):
                _terminate(entry["pid"], STOP_GRACE_S[name])
                stopped.append(f"{name} (pid {entry['pid']})")
            (state_dir / f"{name}.pid").unlink(missing_ok=True)
        (state_dir / STATE_FILE).unlink(missing_ok=True)
    return stopped
