"""The README's benchmark table, rewritten in place from the reports in ``out/bench``.

Some rows come from runs this machine cannot make (a 16-core machine, a GPU, a 30-minute
soak), and their reports are not kept in the repository. So a row whose report is missing
keeps the reading the README already shows for it, and every other row is written afresh;
the table never loses a figure because one machine lacked a report (docs/design/0072).

    .venv/bin/python -m bench.figures --readme README.md
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

HEADER = "| figure | target | measured | met | report |"
_CELL_SPLIT = re.compile(r"(?<!\\)\|")


class TableNotFound(ValueError):
    """The file has no line that is the table's header."""


def cells(line: str) -> list[str]:
    """A Markdown row's cells, with escaped bars kept as they are written."""
    parts = _CELL_SPLIT.split(line.strip())
    return [p.strip() for p in parts[1:-1]]


def render_row(row: Sequence[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in row) + " |"


def table_span(lines: list[str]) -> tuple[int, int]:
    """[start, end) of the table: the header line and every ``|`` line right after it."""
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == HEADER)
    except StopIteration:
        raise TableNotFound(f"no line reads {HEADER!r}") from None
    end = start + 1
    while end < len(lines) and lines[end].lstrip().startswith("|"):
        end += 1
    return start, end


def earlier_rows(lines: list[str], start: int, end: int) -> dict[str, list[str]]:
    """The table's rows by their figure cell, the separator line left out."""
    rows = {}
    for line in lines[start + 2:end]:
        row = cells(line)
        if len(row) == 5:
            rows[row[0].replace("\\|", "|")] = [c.replace("\\|", "|") for c in row]
    return rows


def merge(fresh: Sequence[tuple[Sequence[str], bool]], earlier: dict[str, list[str]]) -> list[list[str]]:
    """Each fresh row whose report was read; else the earlier row of that figure, if any."""
    out = []
    for row, measured in fresh:
        kept = earlier.get(row[0])
        out.append(list(row) if measured or kept is None else kept)
    return out


def update(path: Path, fresh: Sequence[tuple[Sequence[str], bool]]) -> tuple[int, int]:
    """Rewrite the table in ``path``; return (rows written afresh, rows kept from before)."""
    lines = path.read_text().splitlines()
    start, end = table_span(lines)
    earlier = earlier_rows(lines, start, end)
    merged = merge(fresh, earlier)
    table = [HEADER, "| --- | --- | --- | --- | --- |", *(render_row(r) for r in merged)]
    path.write_text("\n".join(lines[:start] + table + lines[end:]) + "\n")
    renewed = sum(1 for _, measured in fresh if measured)
    kept = sum(1 for (row, measured) in fresh if not measured and row[0] in earlier)
    return renewed, kept

