"""The broker-request and wake-up counts of bench.cost, from ``ss`` and /proc text."""

from __future__ import annotations

from pathlib import Path

from bench.trips import context_switches, parse_ss, per_query

SS = """\
ESTAB 0 0 127.0.0.1:40100 127.0.0.1:9092 users:(("python",pid=101,fd=12))
\t cubic wscale:7,7 rto:201 rtt:0.1/0.05 bytes_sent:900 segs_out:40 segs_in:50 data_segs_out:30 data_segs_in:45 send 1Gbps
ESTAB 0 0 127.0.0.1:40102 127.0.0.1:9092 users:(("python",pid=101,fd=13))
\t cubic data_segs_out:5 data_segs_in:9
ESTAB 0 0 127.0.0.1:9092 127.0.0.1:40100 users:(("java",pid=7,fd=200))
\t cubic data_segs_out:45 data_segs_in:30
ESTAB 0 0 127.0.0.1:40200 127.0.0.1:6379 users:(("python",pid=101,fd=14))
\t cubic data_segs_out:70 data_segs_in:70
ESTAB 0 0 127.0.0.1:40300 127.0.0.1:9092 users:(("python",pid=202,fd=3),("python",pid=202,fd=4))
\t cubic data_segs_out:8 data_segs_in:8
"""


def test_segments_to_the_broker_are_counted_per_process_and_only_towards_its_port() -> None:
    # the broker's own side (local port 9092) and the Redis socket are not requests to the broker;
    # a socket listed twice for one process counts once
    assert parse_ss(SS, 9092) == {101: 35, 202: 8}
    assert parse_ss(SS, 6379) == {101: 70}
    assert parse_ss("", 9092) == {}


def test_growth_per_query_is_sorted_and_missing_counts_stay_missing() -> None:
    assert per_query({"a": 10, "b": 0}, {"a": 40, "b": 100, "c": 5}, 10) == {"b": 10.0, "a": 3.0, "c": 0.5}
    assert per_query(None, {"a": 1}, 10) is None


def test_context_switches_add_up_every_thread_of_a_process(tmp_path: Path) -> None:
    for pid, tids in {11: {1: (5, 2), 2: (10, 0)}, 12: {3: (1, 1)}}.items():
        for tid, (vol, invol) in tids.items():
            d = tmp_path / str(pid) / "task" / str(tid)
            d.mkdir(parents=True)
            (d / "status").write_text(f"Name:\tpython\nvoluntary_ctxt_switches:\t{vol}\n"
                                      f"nonvoluntary_ctxt_switches:\t{invol}\n")
    # two processes under one label add up; a process that is gone counts nothing
    assert context_switches({11: "selector", 12: "selector", 99: "gone"}, proc=tmp_path) == {"selector": 19}


def test_a_baseline_server_is_every_process_of_its_session(tmp_path: Path) -> None:
    from bench.baselines import session_pids

    # pid 30 put itself in a process group of its own (Ray's workers do) but stays in session 20
    for pid, pgrp, sid in ((20, 20, 20), (21, 20, 20), (30, 30, 20), (40, 40, 40)):
        d = tmp_path / str(pid)
        d.mkdir()
        (d / "stat").write_text(f"{pid} (ray::Proxy Actor) S 1 {pgrp} {sid} 0 -1 4194560 0 0\n")
    (tmp_path / "self").mkdir()
    assert sorted(session_pids(20, proc=tmp_path)) == [20, 21, 30]
