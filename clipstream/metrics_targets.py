"""The /metrics port of every stage ``clipstream up`` runs, and the Prometheus file_sd JSON
listing them.

``up`` picks a free port per stage name once and hands it to the stage as
``CLIPSTREAM_METRICS_PORT``, so a restarted stage serves on the same port and a Prometheus
following the file (``file_sd_configs``) keeps one series per stage. The file is rewritten
(atomically) whenever the set of stages changes; the gateway's dashboard reads it too
(``CLIPSTREAM_METRICS_TARGETS``).
"""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path

PORT_ENV = "CLIPSTREAM_METRICS_PORT"
TARGETS_ENV = "CLIPSTREAM_METRICS_TARGETS"
FILE_NAME = "prometheus-targets.json"
# how `up` tells where the file is (the demo reads the path back from this line)
TARGETS_LINE = "metrics: targets for Prometheus (file_sd) in "


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def stage_kind(name: str) -> str:
    """``selector-2`` -> ``selector``, ``worker-knn-v1-0`` -> ``worker``, ``batchers-a+b`` -> ``batcher``."""
    head = name.split("-", 1)[0]
    return "batcher" if head == "batchers" else head


class MetricTargets:
    """Stage name -> metrics port, written as a file_sd JSON at ``path``."""

    def __init__(self, path: Path, host: str = "127.0.0.1") -> None:
        self.path, self.host = Path(path), host
        self.ports: dict[str, int] = {}
        self._lock = threading.Lock()

    def env(self, name: str, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` for stage ``name``, with its metrics port (picked now, or the one it had)."""
        with self._lock:
            port = self.ports.get(name)
            if port is None:
                taken = set(self.ports.values())
                port = free_port(self.host)
                while port in taken:
                    port = free_port(self.host)
                self.ports[name] = port
                self._write()
        return {**env, PORT_ENV: str(port), TARGETS_ENV: str(self.path)}

    def keep(self, names: Iterable[str]) -> None:
        """Forget the stages not in ``names`` (removed by the registry, or retired)."""
        names = set(names)
        with self._lock:
            gone = [n for n in self.ports if n not in names]
            for n in gone:
                del self.ports[n]
            if gone:
                self._write()

    def url(self, name: str) -> str:
        return f"http://{self.host}:{self.ports[name]}/metrics"

    def lines(self, names: Iterable[str] | None = None) -> list[str]:
        """``metrics: <stage> http://HOST:PORT/metrics`` per stage."""
        with self._lock:
            chosen = sorted(self.ports) if names is None else [n for n in names if n in self.ports]
            return [f"metrics: {n} {self.url(n)}" for n in chosen]

    def _write(self) -> None:
        groups = [{"targets": [f"{self.host}:{port}"], "labels": {"stage": stage_kind(name), "name": name}}
                  for name, port in sorted(self.ports.items())]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(groups, indent=1) + "\n")
        os.replace(tmp, self.path)  # Prometheus and the dashboard never read half a file
