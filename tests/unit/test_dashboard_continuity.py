"""The dashboard's counters across a stage that misses scrapes or restarts: no burst of work
that never happened, and no work lost from the stages that went on."""

from __future__ import annotations

import pytest

from frontend.dashboard.series import Continuity, Series, merge, parse


def selector(answers: float, inflight: float = 0.0) -> list:
    return parse(f'clipstream_selector_answers_total{{app="d",outcome="prediction"}} {answers}\n'
                 f'clipstream_gateway_inflight {inflight}\n')


def rows(scrapes: list[dict]) -> list[float]:
    """The throughput of app d in each row, one scrape a second, a window of one scrape."""
    series, continuity, out = Series(keep=20, window=1), Continuity(), []
    for t, scraped in enumerate(scrapes):
        row = series.add(float(t), merge(continuity.samples(scraped)), {"d": 50.0})
        out.append(row["throughput"].get("d", 0.0))
    return out


def test_a_stage_that_misses_scrapes_shows_no_burst_when_it_answers_again() -> None:
    # selector-2 has answered 1,000 in its life, then hangs for two scrapes, idle, and comes back
    seen = rows([{"selector-1": selector(10), "selector-2": selector(1000)},
                 {"selector-1": selector(20), "selector-2": None},
                 {"selector-1": selector(30), "selector-2": None},
                 {"selector-1": selector(40), "selector-2": selector(1000)},
                 {"selector-1": selector(50), "selector-2": selector(1005)}])
    assert seen[1:] == [10.0, 10.0, 10.0, 15.0]


def test_a_restarted_stage_counts_on_from_where_it_was() -> None:
    seen = rows([{"selector-1": selector(10), "selector-2": selector(500)},
                 {"selector-1": selector(20), "selector-2": selector(510)},
                 {"selector-1": selector(30), "selector-2": []},  # restarted: its counter not yet made
                 {"selector-1": selector(40), "selector-2": selector(3)},  # counting from 0
                 {"selector-1": selector(50), "selector-2": selector(8)}])
    assert seen[1:] == [20.0, 10.0, 13.0, 15.0]  # selector-1's 10 a second are never hidden


def test_a_stage_no_longer_listed_is_forgotten_and_gauges_stand_while_it_is_away() -> None:
    continuity = Continuity()
    continuity.samples({"gateway-1": selector(5, inflight=7)})
    held = merge(continuity.samples({"gateway-1": None}))
    assert held[("clipstream_gateway_inflight", ())] == pytest.approx(7.0)
    assert merge(continuity.samples({})) == {}
    back = merge(continuity.samples({"gateway-1": selector(2)}))  # a new stage of that name
    assert back[("clipstream_selector_answers_total", (("app", "d"), ("outcome", "prediction")))] == 2.0
