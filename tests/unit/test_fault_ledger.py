"""The fault suite's ledger (``clipstream.testing.faults``): what counts as lost, duplicated,
and when real answers resumed, on hand-made queries."""

from __future__ import annotations

from clipstream.testing.faults import Query, gap_s, ledger, timeline

FAULT = 1000.0
SLO = 0.3


def q(sent: float, outcome: str = "real", took: float = 0.02, missing: int = 0, reason: str = "",
      yielded: int = 0) -> Query:
    done = FAULT + sent + took if outcome else 0.0
    return Query("kafka", f"q{sent}", FAULT + sent, SLO, done, outcome, reason, missing, yielded)


def steady(start: float, end: float, **kw: object) -> list[Query]:
    return [q(round(start + i * 0.05, 3), **kw) for i in range(int(round((end - start) / 0.05)))]  # type: ignore[arg-type]


def test_a_fault_that_costs_nothing_has_no_gap() -> None:
    qs = steady(-2, 5)
    row = ledger(qs, FAULT)
    assert (row["gap_s"], row["lost"], row["duplicates"], row["last_not_real_s"]) == (0.0, 0, 0, None)
    assert row["answered_real"] == row["sent"] == len(qs)


def test_the_gap_ends_at_the_first_answer_of_the_first_clean_window() -> None:
    # queries sent in the first 2 s get defaults; those sent from 2 s on are answered, at 3.5 s
    # the earliest (they waited for the stage to come back, within their SLO)
    bad = steady(0, 2, outcome="default", reason="no prediction arrived by the deadline", took=SLO)
    good = [q(s, took=max(0.02, 2.25 - s)) for s in (x.sent - FAULT for x in steady(2, 6))]
    row = ledger(steady(-2, 0) + bad + good, FAULT)
    assert row["gap_s"] == 2.25
    assert row["answered_default"] == len(bad) and row["default_reasons"] == {"no prediction arrived by the deadline": len(bad)}
    assert row["last_not_real_s"] == 1.95


def test_answers_past_their_slo_are_not_a_resumption() -> None:
    late = steady(0, 3, took=4.0)  # real, but held 4 s (a dead leader's partition)
    assert gap_s(late + steady(3, 6), FAULT) == 3.02  # the first answer in time
    assert ledger(late, FAULT)["real_late"] == len(late)


def test_partial_answers_are_real_but_not_complete() -> None:
    qs = steady(0, 2, missing=1) + steady(2, 5)
    assert gap_s(qs, FAULT) == 0.0
    assert gap_s(qs, FAULT, complete=True) == 2.02


def test_no_answer_is_lost_and_a_second_yield_is_a_duplicate() -> None:
    qs = steady(-1, 3) + [q(0.5, outcome=""), q(0.6, yielded=2), q(0.7, outcome="refused", reason="connection: ConnectError")]
    row = ledger(qs, FAULT)
    assert (row["lost"], row["duplicates"], row["refused"]) == (1, 1, 1)
    assert row["refusal_reasons"] == {"connection: ConnectError": 1}
    assert row["gap_s"] == 0.77  # the first window after the refusal and the lost one


def test_no_clean_window_means_no_resumption() -> None:
    assert gap_s(steady(-1, 0) + steady(0, 3, outcome="default"), FAULT) is None


def test_the_timeline_gives_each_second_the_tenths_answered_in_time() -> None:
    # second 0 all defaults, second 1 half of it (the first ten of twenty), second 2 none sent,
    # second 3 all real and in time; what came before the fault is not on it
    qs = (steady(-1, 0, outcome="default") + steady(0, 1, outcome="default") + steady(1, 1.5, outcome="default")
          + steady(1.5, 2) + steady(3, 4))
    row = ledger(qs, FAULT)
    assert row["good_by_second"] == "05-9"
    assert timeline(steady(0, 2, took=1.0), FAULT) == "00"  # real, but past the SLO and its slack
    assert timeline(steady(-2, 0), FAULT) == ""


def test_late_answers_say_whether_the_gateway_or_the_way_to_it_took_the_time() -> None:
    on_time = steady(0, 1)
    late = steady(1, 2, took=1.2)
    for i, x in enumerate(late):
        x.served_ms = 250.0 if i % 2 else 290.0  # the gateway answered within the SLO
    row = ledger(on_time + late, FAULT)
    assert row["real_late"] == len(late)
    assert row["late_ms"] == {"caller_p50": 1200.0, "gateway_p50": 270.0}
    assert ledger(on_time, FAULT)["late_ms"] is None
    kafka_late = ledger(steady(0, 1, took=0.9), FAULT)["late_ms"]
    assert kafka_late == {"caller_p50": 900.0}  # no gateway on the Kafka path


def _gap_by_every_window(queries: list[Query], fault_at: float, window_s: float = 1.0, late_s: float = 0.5,
                         complete: bool = False) -> float | None:
    """The gap by its definition: every window built anew from its first query."""
    seen = sorted((x for x in queries if x.sent >= fault_at - x.slo_s), key=lambda x: x.sent)
    for i, first in enumerate(seen):
        if seen[-1].sent < first.sent + window_s:
            return None
        window = [x for x in seen[i:] if x.sent <= first.sent + window_s]
        if all(x.good(late_s, complete) for x in window):
            return 0.0 if i == 0 else round(max(0.0, min(x.done for x in window) - fault_at), 3)
    return None


def test_the_one_pass_gap_agrees_with_the_definition_on_random_ledgers() -> None:
    import random

    rng = random.Random(7)
    for trial in range(300):
        n, bad_share = rng.randint(0, 120), rng.choice([0.0, 0.02, 0.1, 0.5, 1.0])
        qs = []
        for i in range(n):
            sent = round(rng.uniform(-1.0, 8.0), 3)
            outcome = "default" if rng.random() < bad_share else "real"
            qs.append(q(sent, outcome=outcome, took=rng.choice([0.02, 0.1, 0.9]), missing=rng.choice([0, 0, 1])))
        for complete in (False, True):
            assert gap_s(qs, FAULT, complete=complete) == _gap_by_every_window(qs, FAULT, complete=complete), trial
