"""``up``/``down``/``status`` of the local Kafka broker and Redis, tracked in one state dir.

Everything ``up`` starts is recorded in ``<state_dir>/infra.json`` (pid, the pid's start time,
ports, addresses) before it is waited on, so ``down`` can stop exactly those processes, and only
those: a recorded pid is signalled only while its start time still matches, which guards
against the pid having been reused by somebody else's process. ``up`` is idempotent: recorded
processes that are alive and answering are reported, not started again. Kafka is one node or a
cluster of n (``brokers``; see ``cluster``), recorded as its list of nodes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
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
from clipstream.infra import cluster
from clipstream.infra import kafka as kafka_mod
from clipstream.infra import redis as redis_mod
from clipstream.infra.ports import (  # noqa: F401 (pick_free_ports, port_is_free: re-exported)
    kafka_port_names,
    last_ports,
    pick_free_ports,
    plan_ports,
    port_is_free,
    remember_ports,
)
from clipstream.infra.stopping import terminate
from clipstream.settings import Settings

STATE_FILE = "infra.json"
COMPONENTS = ("kafka", "redis")
STOP_GRACE_S = {"kafka": 20.0, "redis": 5.0}  # a broker's controlled shutdown takes seconds

Progress = Callable[[str], None]
Entry = dict[str, Any]


@dataclass(frozen=True)
class NodeStatus:
    """One recorded Kafka node."""

    node_id: int
    address: str
    pid: int
    running: bool


@dataclass
class InfraStatus:
    """Where the local infrastructure is and whether its processes are alive.

    ``kafka_pid`` is node 1's; ``kafka_running`` means every node runs; ``kafka_nodes`` lists
    each recorded node (one for the single broker).
    """

    kafka_bootstrap: str
    redis_url: str
    kafka_pid: int | None = None
    redis_pid: int | None = None
    kafka_running: bool = False
    redis_running: bool = False
    state_dir: Path | None = None
    kafka_nodes: list[NodeStatus] = field(default_factory=list)

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
    """Write atomically, and keep one ``<name>.pid`` file per running component (for Kafka,
    node 1's pid).

    Kafka's node 1 is also copied to the top of its record, where readers of a one-broker
    record look for the pid and ports (``bench.common``).
    """
    kafka = state.get("kafka")
    if kafka and kafka.get("nodes"):
        lead = kafka["nodes"][0]
        kafka.update({k: lead[k] for k in ("pid", "start_ticks", "port", "controller_port") if k in lead})
    tmp = state_dir / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
    tmp.replace(state_dir / STATE_FILE)
    for name in COMPONENTS:
        pid_file = state_dir / f"{name}.pid"
        if name in state:
            pid_file.write_text(f"{_processes(name, state[name])[0]['pid']}\n")
        else:
            pid_file.unlink(missing_ok=True)


def _entry(pid: int, **fields: Any) -> Entry:
    return {"pid": pid, "start_ticks": process_start_ticks(pid), **fields}


def _processes(name: str, entry: Entry) -> list[Entry]:
    """The processes of a recorded component: Kafka's nodes (a record from before clusters
    holds its one node inline), or the entry itself."""
    nodes = entry.get("nodes") if name == "kafka" else None
    if isinstance(nodes, list) and nodes:
        return nodes
    return [{"node_id": 1, **entry}] if name == "kafka" else [entry]


def _all_alive(name: str, entry: Entry | None) -> bool:
    return entry is not None and all(is_ours_and_alive(p) for p in _processes(name, entry))


def is_ours_and_alive(entry: Entry | None) -> bool:
    """True when the recorded process still runs and is the same process (not a reused pid)."""
    if not entry or not isinstance(entry.get("pid"), int):
        return False
    pid = entry["pid"]
    if not pid_alive(pid):
        return False
    recorded, now = entry.get("start_ticks"), process_start_ticks(pid)
    return recorded is None or now is None or recorded == now


# --- stopping ------------------------------------------------------------------------------


def _stop(name: str, entry: Entry) -> list[str]:
    """Stop a recorded component's live processes; describe each stopped one."""
    procs = [p for p in _processes(name, entry) if is_ours_and_alive(p)]
    terminate(*(p["pid"] for p in procs), grace_s=STOP_GRACE_S[name])
    if name == "kafka" and len(_processes(name, entry)) > 1:
        return [f"kafka node {p['node_id']} (pid {p['pid']})" for p in procs]
    return [f"{name} (pid {p['pid']})" for p in procs]


# --- public API ----------------------------------------------------------------------------


def _status_from(settings: Settings, state_dir: Path, state: dict[str, Entry]) -> InfraStatus:
    kafka, redis = state.get("kafka"), state.get("redis")
    nodes = [
        NodeStatus(p["node_id"], f"{cluster.HOST}:{p['port']}", p["pid"], is_ours_and_alive(p))
        for p in (_processes("kafka", kafka) if kafka else [])
    ]
    return InfraStatus(
        kafka_bootstrap=kafka["bootstrap"] if kafka else settings.kafka_bootstrap,
        redis_url=redis["url"] if redis else settings.redis_url,
        kafka_pid=nodes[0].pid if nodes else None,
        redis_pid=redis["pid"] if redis else None,
        kafka_running=_all_alive("kafka", kafka),
        redis_running=is_ours_and_alive(redis),
        state_dir=state_dir,
        kafka_nodes=nodes,
    )


def status(settings: Settings) -> InfraStatus:
    """What ``up`` recorded in the state dir, with liveness checked now."""
    state_dir = state_dir_of(settings)
    return _status_from(settings, state_dir, load_state(state_dir))


def _recorded_kafka(state: dict[str, Entry], brokers: int | None, state_dir: Path) -> list[Entry]:
    """Check the recorded Kafka against the size asked for; return its dead nodes to restart.

    A Kafka whose every node is dead is forgotten (a fresh one takes its place); one with some
    nodes alive keeps its ports and data, and only the dead nodes start again.
    """
    kafka = state.get("kafka")
    if kafka is None:
        return []
    nodes = _processes("kafka", kafka)
    dead = [p for p in nodes if not is_ours_and_alive(p)]
    if len(dead) == len(nodes):
        del state["kafka"]
        return []
    if brokers is not None and brokers != len(nodes):
        raise InfraError(
            f"a {len(nodes)}-broker Kafka is already running from {state_dir}: stop it with "
            "`clipstream infra down` first, or use another --state-dir"
        )
    return dead


def up(
    settings: Settings,
    free_ports: bool = False,
    progress: Progress = print,
    timeout_s: float = 60.0,
    die_with_parent: bool = False,
    brokers: int | None = None,
) -> InfraStatus:
    """Start (or find running) a KRaft Kafka of ``brokers`` nodes and a Redis; return once both
    answer (every node registered).

    ``brokers`` None: whatever runs already, else one. The jars are fetched on first use (see
    ``kafka.fetch_jars``). Binaries and ports are checked before anything starts; if either
    component fails to come up, whatever this call started is stopped again, so a failed
    ``up`` leaves nothing behind. Dead nodes of a cluster whose others still run are restarted
    in place. ``die_with_parent`` (Linux) makes what this call starts exit with the calling
    process: for test sessions.
    """
    if brokers is not None and brokers < 1:
        raise InfraError(f"--brokers must be 1 or more, not {brokers}")
    t0 = time.monotonic()
    state_dir = state_dir_of(settings)
    state_dir.mkdir(parents=True, exist_ok=True)
    with file_lock(state_dir / "infra.lock"):
        plan = _plan(settings, state_dir, free_ports, brokers, die_with_parent, progress)
        try:
            if plan.need_redis:
                _start_redis(plan, progress)
            if plan.need_kafka:
                _start_kafka(plan, settings.kafka_version, progress)
            for node in plan.revive:
                _restart_node(plan, node, progress)
            _wait_both(plan.state, state_dir, timeout_s, plan.redis_password)
        except BaseException:
            _undo(plan)
            raise
        if not plan.started:
            progress("already running")
        result = _status_from(settings, state_dir, plan.state)
        progress(
            f"ready in {time.monotonic() - t0:.1f} s: kafka {result.kafka_bootstrap}, "
            f"redis {result.redis_url} (state in {state_dir})"
        )
        return result


@dataclass
class _Plan:
    """What one ``up`` call starts, and what it has started: the steps that start each component
    share it, and a failure stops exactly the processes in ``started``."""

    state_dir: Path
    state: dict[str, Entry]
    revive: list[Entry]  # recorded Kafka nodes that died while the others run
    need_kafka: bool
    need_redis: bool
    size: int
    ports: dict[str, int]
    die_with_parent: bool
    redis_password: str | None = None  # CLIPSTREAM_REDIS_PASSWORD: a Redis started here asks for it
    java: str | None = None  # with ``libs``: found only when a Kafka node starts
    libs: Path | None = None
    started: list[Entry] = field(default_factory=list)  # the processes this call started, to undo on failure


def _plan(settings: Settings, state_dir: Path, free_ports: bool, brokers: int | None,
          die_with_parent: bool, progress: Progress) -> _Plan:
    """Decide what to start and check that it can (ports, binaries, jars) before anything starts,
    so that a refusal has nothing to undo."""
    state = load_state(state_dir)
    revive = _recorded_kafka(state, brokers, state_dir)
    if "redis" in state and not is_ours_and_alive(state["redis"]):
        del state["redis"]  # forget a dead one; a fresh one takes its place
    need_kafka, need_redis = "kafka" not in state, "redis" not in state
    size = brokers or 1
    ports = plan_ports(settings, free_ports, need_kafka, need_redis, size, last=last_ports(state_dir))
    if free_ports:
        remember_ports(state_dir, ports)
    password = settings.redis_password.get_secret_value() if settings.redis_password is not None else None
    plan = _Plan(state_dir, state, revive, need_kafka, need_redis, size, ports, die_with_parent, password)
    if need_redis:
        require_binary("redis-server", redis_mod.REDIS_HINT)
    if need_kafka or revive:
        plan.java = require_binary("java", kafka_mod.JAVA_HINT)
        plan.libs = kafka_mod.fetch_jars(settings, progress)
    return plan


def _start_redis(plan: _Plan, progress: Progress) -> None:
    """Start a fresh Redis and record it at once, before it is waited on, so that ``down`` or a
    failed ``up`` finds it."""
    proc = redis_mod.start_redis(plan.ports["redis"], plan.state_dir, plan.die_with_parent, plan.redis_password)
    url = redis_mod.redis_url(plan.ports["redis"])
    plan.state["redis"] = _entry(proc.pid, port=plan.ports["redis"], url=url)
    plan.started.append(plan.state["redis"])
    _save_state(plan.state_dir, plan.state)
    progress(f"redis: starting on {url} (pid {proc.pid})")


def _start_kafka(plan: _Plan, version: str, progress: Progress) -> None:
    """Write, format and start every node of a fresh Kafka, then record them as one component:
    its nodes share one bootstrap list and one cluster id."""
    assert plan.java is not None and plan.libs is not None  # _plan finds them when Kafka is needed
    pairs = [plan.ports[name] for name in kafka_port_names(plan.size)]
    nodes = cluster.nodes_from_ports(pairs)
    all_files = cluster.write_node_files(plan.state_dir, nodes)
    for data_dir in cluster.format_nodes(plan.java, plan.libs, all_files):
        progress(f"kafka: formatted storage in {data_dir}")
    entries = []
    for node, files in zip(nodes, all_files, strict=True):
        proc = kafka_mod.start_broker(plan.java, plan.libs, files, plan.die_with_parent)
        entries.append(
            _entry(proc.pid, node_id=node.node_id, port=node.port,
                   controller_port=node.controller_port)
        )  # fmt: skip
        plan.started.append(entries[-1])
        progress(
            f"kafka: starting node {node.node_id} on {node.address} "
            f"(pid {proc.pid}), log {files.log}"
        )
    plan.state["kafka"] = {"bootstrap": cluster.bootstrap(nodes), "version": version, "nodes": entries}
    _save_state(plan.state_dir, plan.state)


def _restart_node(plan: _Plan, node: Entry, progress: Progress) -> None:
    """Start a dead node of a running cluster again in place: it keeps its ports and data, so the
    others take it back as the same node."""
    assert plan.java is not None and plan.libs is not None  # _plan finds them when a node revives
    files = cluster.node_files(plan.state_dir, node["node_id"], len(_processes("kafka", plan.state["kafka"])))
    proc = kafka_mod.start_broker(plan.java, plan.libs, files, plan.die_with_parent)
    node.update(_entry(proc.pid))
    plan.started.append(node)
    _save_state(plan.state_dir, plan.state)
    progress(f"kafka: restarting node {node['node_id']} (pid {proc.pid}), log {files.log}")


def _undo(plan: _Plan) -> None:
    """Stop what a failed ``up`` started and forget the components it added, so that it leaves
    nothing behind."""
    terminate(*(e["pid"] for e in plan.started if is_ours_and_alive(e)),
              grace_s=STOP_GRACE_S["kafka"])  # fmt: skip
    for name, fresh in (("redis", plan.need_redis), ("kafka", plan.need_kafka)):
        if fresh:
            plan.state.pop(name, None)
    _save_state(plan.state_dir, plan.state)


def _wait_both(state: dict[str, Entry], state_dir: Path, timeout_s: float, redis_password: str | None = None) -> None:
    """Wait for Redis, then every Kafka node, to answer; fail fast if a process dies."""
    redis, kafka = state["redis"], state["kafka"]
    wait_ready(
        "redis-server",
        lambda: redis_mod.redis_answers(redis["url"], redis_password),
        lambda: is_ours_and_alive(redis),
        timeout_s,
        [state_dir / "redis.log", state_dir / "redis.out"],
    )
    nodes = _processes("kafka", kafka)
    logs = [cluster.node_files(state_dir, p["node_id"], len(nodes)) for p in nodes]
    wait_ready(
        "Kafka broker" if len(nodes) == 1 else f"Kafka cluster of {len(nodes)} nodes",
        kafka_mod.MetadataProbe(kafka["bootstrap"], brokers=len(nodes)),
        lambda: _all_alive("kafka", kafka),
        timeout_s,
        [path for files in logs for path in (files.log, files.out)],
    )


def down(settings: Settings) -> list[str]:
    """Stop what ``up`` recorded in this state dir (and nothing else); return what was stopped.

    Each process's whole group gets SIGTERM, then SIGKILL after a grace period. Data and logs
    stay in the state dir; only the record of running processes is removed.
    """
    state_dir = state_dir_of(settings)
    if not (state_dir / STATE_FILE).exists():
        return []
    stopped: list[str] = []
    with file_lock(state_dir / "infra.lock"):
        state = load_state(state_dir)
        for name in COMPONENTS:  # the broker first: it may still flush to disk
            entry = state.pop(name, None)
            if entry:
                stopped += _stop(name, entry)
            (state_dir / f"{name}.pid").unlink(missing_ok=True)
        (state_dir / STATE_FILE).unlink(missing_ok=True)
    return stopped
