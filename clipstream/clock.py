"""Wall-clock time in epoch microseconds: the unit of every deadline and trace stamp on the wire."""

from __future__ import annotations

import time


def now_us() -> int:
    return time.time_ns() // 1000
