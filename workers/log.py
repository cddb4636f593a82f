"""The worker process's log lines, shared by its modules: one line each on stderr, named for the stage."""

from __future__ import annotations

import sys


def log(msg: str) -> None:
    print(f"worker: {msg}", file=sys.stderr, flush=True)
