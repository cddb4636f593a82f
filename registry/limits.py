"""The bounds of what the registry records: a count or a time past them is a typo, and would
cost the cluster before anything else noticed. Each replica is a partition of its model's
topics, and a broker ran out of memory creating a hundred thousand of them; a batch size or a
delay past any SLO cannot serve a query in time."""

from __future__ import annotations

from clipstream.errors import ConfigError

# replicas of one model: each is a worker process and a partition of its model's topics
MAX_REPLICAS = 256
# the longest SLO an app may be registered with (a caller's own slo_ms stays within 60 s)
MAX_APP_SLO_MS = 3_600_000.0
# each batching knob's range: (lowest, lowest allowed itself, highest)
KNOBS: dict[str, tuple[float, bool, float]] = {
    "latency_objective_ms": (0.0, False, 60_000.0),
    "max_batch_size": (1, True, 65_536),
    "batch_delay_ms": (0.0, True, 60_000.0),
}


def check_replicas(replicas: int, what: str) -> int:
    """``replicas`` within [1, MAX_REPLICAS], else a ConfigError naming ``what``."""
    if not 1 <= replicas <= MAX_REPLICAS:
        raise ConfigError(f"{what} must be from 1 to {MAX_REPLICAS}, not {replicas!r}: each replica is a "
                          "worker process and a partition of its model's topics")
    return replicas


def check_slo(slo_ms: float, what: str) -> float:
    """An app's SLO within (0, MAX_APP_SLO_MS]; a NaN compares false and is refused too."""
    if not 0 < slo_ms <= MAX_APP_SLO_MS:
        raise ConfigError(f"{what} must be more than 0 and at most {MAX_APP_SLO_MS:,.0f} ms (an hour), not {slo_ms:g}")
    return slo_ms


def check_knob(key: str, value: float, what: str) -> float:
    """A batching knob within its range in ``KNOBS``."""
    low, inclusive, high = KNOBS[key]
    if not ((value >= low) if inclusive else (value > low)) or not value <= high:
        floor = f"at least {low:g}" if inclusive else f"more than {low:g}"
        raise ConfigError(f"{what} must be {floor} and at most {high:,g}, not {value:g}")
    return value
