"""Formatting and checking helpers that every ``bench.figures`` row shares.

A row function reads one report and returns what it measured and whether the target was met;
these keep the numbers in one style across rows, so a table read side by side compares like
with like.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

YES, NO, NONE = "yes", "**no**", "—"
Result = tuple[str, str]  # (measured, met)


def get(d: Any, *path: str) -> Any:
    """d[path[0]][path[1]]...; KeyError when a step is absent (a None value is returned as is)."""
    for key in path:
        if not isinstance(d, dict) or key not in d:
            raise KeyError(key)
        d = d[key]
    return d


def met(*ok: bool) -> str:
    return YES if all(ok) else NO


def ge(v: float | None, t: float) -> bool:
    return v is not None and v >= t


def q(v: float | None) -> str:
    """A rate in q/s: whole numbers from 100 up."""
    return "n/a" if v is None else f"{v:,.0f}" if abs(v) >= 100 else f"{v:.1f}"


def x(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}x"


def ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"


pts: Callable[[float], str] = "{:.2f}".format


def j(values: list[Any], fmt: Callable[[Any], str]) -> str:
    return " / ".join(fmt(v) for v in values)
