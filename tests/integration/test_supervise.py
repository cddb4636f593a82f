"""`clipstream up`'s supervisor on real child processes: a stage killed again and again is
restarted every time, a stage that stops beating (SIGSTOP) is killed and restarted, and a
stage's spare takes a killed stage's place without its slow start.

The child is a tiny stage (``ready:`` line, heartbeat from its loop), so these tests need no
Kafka or Redis and carry no ``integration`` marker."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from clipstream.spare import SPARE_ENV, SPARE_TITLE
from clipstream.supervise import CHECK_S, Stage, Supervisor
from clipstream.testing.procs import wait_until
from topics.stage import read_heartbeat

ROOT = Path(__file__).resolve().parents[2]

CHILD = '''
import signal, time
from topics.stage import announce_ready, heartbeat
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a hung stage may not act on SIGTERM either
announce_ready("child")
while True:
    heartbeat("main")
    time.sleep(0.05)
'''

# a stage that takes SLOW_START_S to import, then (started as a spare) says so and waits
SLOW_CHILD = '''
import os, sys, time
from pathlib import Path
time.sleep(float(sys.argv[1]))
from clipstream.spare import SPARE_ENV, wait_if_spare
from topics.stage import announce_ready, heartbeat
if os.environ.get(SPARE_ENV):
    Path(sys.argv[2], str(os.getpid())).touch()
wait_if_spare()
announce_ready("child")
while True:
    heartbeat("main")
    time.sleep(0.05)
'''
SLOW_START_S = 3.0

# generous: a python start-up on the 2 shared cores of a loaded test machine can take seconds
RESTART_BOUND_S = 30.0


class Running:
    """A supervisor with ``up``'s check loop on a thread, its reports collected."""

    def __init__(self, tmp_path: Path, every_s: float = CHECK_S, **kw: float) -> None:
        self.every_s = every_s
        self.reports: list[str] = []
        self.reported_at: list[float] = []
        self.sup = Supervisor(tmp_path / "logs", report=self._report, **kw)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _report(self, line: str) -> None:
        self.reported_at.append(time.monotonic())
        self.reports.append(line)

    def _loop(self) -> None:
        self.sup.watch(self._stop, every_s=self.every_s)

    def start_child(self, script: Path, *args: str, spare: bool = False) -> Stage:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        stage = self.sup.add("child", [sys.executable, str(script), *args], env, spare=spare)
        self.sup.wait_ready(RESTART_BOUND_S)
        self._thread.start()
        return stage

    def close(self) -> None:
        self._stop.set()
        self.sup.interrupt()
        self._thread.join(5)
        for stage in self.sup.stages.values():
            if stage.proc is not None and stage.proc.poll() is None:
                stage.proc.kill()  # the child ignores SIGTERM: spare the stop its 10 s grace
        self.sup.stop_all()


@pytest.fixture
def child(tmp_path: Path) -> Path:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    return script


@pytest.fixture
def running(tmp_path: Path) -> Iterator[list[Running]]:
    made: list[Running] = []
    yield made
    for r in made:
        r.close()


def _restarted(stage: Stage, old_pid: int) -> bool:
    proc = stage.proc
    return proc is not None and proc.pid != old_pid and stage.ready.is_set()


def test_a_stage_killed_again_and_again_is_restarted_every_time_and_told_what_to_do(tmp_path, child, running) -> None:
    healthy_s = 3.0  # each kill below comes within ms of the ready line, far inside this
    r = Running(tmp_path, heartbeat_timeout_s=0, backoff_first_s=0.05, backoff_max_s=0.2, healthy_s=healthy_s)
    r.sup.hint = lambda stage: f"; what to do about {stage.name}"
    running.append(r)
    stage = r.start_child(child)
    for _ in range(8):  # the old supervisor gave a stage up after 5 restarts
        assert stage.proc is not None
        old = stage.proc.pid
        os.kill(old, signal.SIGKILL)
        wait_until(lambda: _restarted(stage, old), RESTART_BOUND_S, "the killed stage to be restarted")
    restarts = [line for line in r.reports if line.startswith("restarting child in ")]
    assert len(restarts) == 8 and stage.restarts == 8
    assert all("(exit code -9, SIGKILL)" in line for line in restarts)
    # it never served a healthy while, so each pause doubles up to the cap
    assert [line.split()[3] for line in restarts] == ["0.05s", "0.1s", "0.2s", "0.2s", "0.2s", "0.2s", "0.2s", "0.2s"]
    # what to do is said at the second death in a row (one death may be a one-off), then at
    # most once a minute: not again on each of the next deaths
    assert restarts[0].endswith(f"log: {stage.log_path}")
    assert restarts[1].endswith(f"log: {stage.log_path}; what to do about child")
    assert all(line.endswith(f"log: {stage.log_path}") for line in restarts[2:])

    # once it has served a healthy while, the next death is restarted after the first pause again
    wait_until(lambda: time.monotonic() - stage.ready_at > healthy_s, 2 * healthy_s, "a healthy while")
    assert stage.proc is not None
    old = stage.proc.pid
    os.kill(old, signal.SIGKILL)
    wait_until(lambda: _restarted(stage, old), RESTART_BOUND_S, "the killed stage to be restarted")
    assert r.reports[-2].startswith("restarting child in 0.05s (exit code -9, SIGKILL)"), r.reports
    assert r.reports[-2].endswith(f"log: {stage.log_path}"), r.reports  # a first death again
    assert r.reports[-1].startswith("child is ready again, "), r.reports


# ready, then (once the test says go: not before the supervisor has seen it ready) an error
FAILING = '''
import os, sys, time
from topics.stage import announce_ready
announce_ready("child")
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
print("note: child: took its new batching knobs", flush=True)
print("alert: child: its model fails on every call", flush=True)
print("alert: child: 40% given up: add replicas", flush=True)
print("error: the model raised ValueError", flush=True)
print("sys:1: RuntimeWarning: coroutine 'Model.predict_batch' was never awaited", flush=True)  # Python's, as it exits
sys.exit(1)
'''


def test_a_restart_line_quotes_the_error_the_stage_exited_on(tmp_path, running) -> None:
    """An operator reads why a stage died in the restart line itself, and a stage's alert in
    up's output, not only in its log."""
    script = tmp_path / "failing.py"
    script.write_text(FAILING)
    r = Running(tmp_path, heartbeat_timeout_s=0, backoff_first_s=0.05, backoff_max_s=0.2)
    running.append(r)
    r.start_child(script, str(tmp_path / "go"))
    (tmp_path / "go").touch()
    wait_until(lambda: any(line.startswith("restarting child in ") for line in r.reports), RESTART_BOUND_S,
               "a restart line")
    line = next(line for line in r.reports if line.startswith("restarting child in "))
    assert "(exit code 1: error: the model raised ValueError); log: " in line, line
    assert "alert: child: its model fails on every call" in r.reports  # an alert is shown, not only logged
    assert "child: took its new batching knobs" in r.reports  # and so is a note


def test_an_alert_after_a_restart_names_the_restarted_stage(tmp_path, running) -> None:
    """Requests given up while a stage restarts read as a lack of capacity to whoever counts
    them: the alert says what restarted, so nobody adds replicas for a crash."""
    script = tmp_path / "failing.py"
    script.write_text(FAILING)
    (tmp_path / "go").touch()
    r = Running(tmp_path, heartbeat_timeout_s=0, backoff_first_s=0.05, backoff_max_s=0.2)
    running.append(r)
    r.start_child(script, str(tmp_path / "go"))
    alerts = lambda: [line for line in r.reports if line.startswith("alert: child: ")]  # noqa: E731
    wait_until(lambda: len(alerts()) >= 4, RESTART_BOUND_S, "the alerts of the restarted child")
    first, capacity, failing, again = alerts()[:4]
    assert (first, capacity) == ("alert: child: its model fails on every call", "alert: child: 40% given up: add replicas")
    assert failing == first  # no capacity blamed: a restart explains nothing there
    assert again == ("alert: child: 40% given up: add replicas (child restarted, back less than 20 s ago or "
                     "not yet: more likely the cause than a lack of capacity)"), again


def test_a_stage_started_while_serving_says_when_it_is_ready(tmp_path, child, running) -> None:
    """A worker a registry change starts gets traffic once ready: up says when that is."""
    r = Running(tmp_path, heartbeat_timeout_s=0)
    running.append(r)
    r.sup.serving = True
    r.start_child(child)
    wait_until(lambda: any(line.startswith("child is ready, ") for line in r.reports), RESTART_BOUND_S,
               "the ready report")


def test_an_exit_wakes_the_supervisor_at_once_however_seldom_it_looks(tmp_path, child, running) -> None:
    # an hour between looks: only the end of the child's output can bring the restart in time
    r = Running(tmp_path, every_s=3600.0, heartbeat_timeout_s=0, backoff_first_s=0.05)
    running.append(r)
    stage = r.start_child(child)
    assert stage.proc is not None
    old = stage.proc.pid
    os.kill(old, signal.SIGKILL)
    wait_until(lambda: _restarted(stage, old), RESTART_BOUND_S, "the killed stage to be restarted")
    assert r.reports[0] == "restarting child in 0.05s (exit code -9, SIGKILL); log: " + str(stage.log_path)
    # the restart's own time, from its spawn to its ready line
    took = float(r.reports[1].removeprefix("child is ready again, ").removesuffix("s after its restart"))
    assert len(r.reports) == 2 and 0 < took <= round(stage.ready_at - stage.started_at, 1) + 0.05, r.reports


def test_a_stage_that_stops_beating_is_killed_and_restarted(tmp_path, child, running) -> None:
    timeout_s = 3.0  # above two of the child's 1 s beat intervals, as the supervisor requires
    r = Running(tmp_path, heartbeat_timeout_s=timeout_s, kill_grace_s=0.5, backoff_first_s=0.05)
    running.append(r)
    stage = r.start_child(child)
    wait_until(lambda: read_heartbeat(stage.heartbeat_path), 10, "the child's first heartbeat")
    assert stage.proc is not None
    hung = stage.proc
    os.kill(hung.pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    wait_until(lambda: _restarted(stage, hung.pid), RESTART_BOUND_S, "the hung stage to be restarted")
    assert hung.returncode == -signal.SIGKILL  # it ignored SIGTERM, so the grace ran out
    found = [i for i, line in enumerate(r.reports) if line.startswith("stage child is hung: no heartbeat for")]
    assert len(found) == 1, r.reports
    # found hung once its last beat written was older than the timeout: at most a beat interval
    # (1 s) before that, a check period after; a slack of 5 s for a loaded machine's scheduling
    assert timeout_s - 1.0 <= r.reported_at[found[0]] - stopped_at <= timeout_s + 5.0
    restart = [line for line in r.reports if line.startswith("restarting child in 0.05s (hung: no heartbeat for")]
    assert len(restart) == 1, r.reports
    # the new run beats into a fresh file, and a stage that beats is not taken for hung: a
    # window of twice the timeout in which nothing may happen (a check, not a wait)
    wait_until(lambda: read_heartbeat(stage.heartbeat_path), 10, "the new child's first heartbeat")
    time.sleep(2 * timeout_s)
    assert stage.restarts == 1 and stage.proc is not None and stage.proc.poll() is None


def _took(report: str) -> float:
    """The seconds in ``child is ready again, <s>s after its restart``."""
    return float(report.removeprefix("child is ready again, ").removesuffix("s after its restart"))


def _shown(pid: int) -> str:
    """A process's command line as ps shows it."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")


def test_a_spare_takes_a_killed_stages_place_without_its_slow_start(tmp_path, running) -> None:
    script, spares = tmp_path / "slow_child.py", tmp_path / "spares"
    script.write_text(SLOW_CHILD)
    spares.mkdir()
    r = Running(tmp_path, heartbeat_timeout_s=0, backoff_first_s=0.05, spare_after_s=0.2)
    running.append(r)
    stage = r.start_child(script, str(SLOW_START_S), str(spares), spare=True)
    # the spare is started once the stage is ready, and waits with its imports done
    wait_until(lambda: any(spares.iterdir()), RESTART_BOUND_S, "the spare to finish its imports")
    spare_pid = int(next(spares.iterdir()).name)
    assert stage.proc is not None and stage.proc.pid != spare_pid
    # ps tells the waiting spare from the stage, and the spare that took the place from a spare
    wait_until(lambda: _shown(spare_pid).startswith(SPARE_TITLE), RESTART_BOUND_S, "the spare's title in ps")
    assert str(script) in _shown(spare_pid) and not _shown(stage.proc.pid).startswith(SPARE_TITLE)
    assert _shown(spare_pid).rstrip().endswith(str(spares)), _shown(spare_pid)  # whole, to its last argument
    assert SPARE_ENV.encode() in Path(f"/proc/{spare_pid}/environ").read_bytes(), "the environment stays whole"

    old = stage.proc.pid
    os.kill(old, signal.SIGKILL)
    wait_until(lambda: _restarted(stage, old), RESTART_BOUND_S, "the killed stage to be restarted")
    assert stage.proc is not None and stage.proc.pid == spare_pid, "the spare took the stage's place"
    wait_until(lambda: not _shown(spare_pid).startswith(SPARE_TITLE), RESTART_BOUND_S, "the stage's own title")
    assert str(script) in _shown(spare_pid) and _shown(spare_pid).rstrip().endswith(str(spares)), _shown(spare_pid)
    # a fresh process needs SLOW_START_S before it can even be ready
    assert _took(r.reports[-1]) < SLOW_START_S, r.reports

    # a new spare follows; one that dies before it is needed is said, and the next restart
    # starts a fresh process
    wait_until(lambda: len(list(spares.iterdir())) == 2, RESTART_BOUND_S, "a new spare")
    second = stage.spare_proc
    assert second is not None and second.pid != spare_pid
    second.kill()
    wait_until(lambda: any(line.startswith("the spare process of child ended with code -9") for line in r.reports),
               RESTART_BOUND_S, "the dead spare to be reported")
    os.kill(spare_pid, signal.SIGKILL)
    wait_until(lambda: _restarted(stage, spare_pid), RESTART_BOUND_S, "the stage restarted without a spare")
    assert _took(r.reports[-1]) >= SLOW_START_S, r.reports
    assert stage.spare_proc is None and not stage.spare


def test_stopping_stops_the_spares(tmp_path, running) -> None:
    script = tmp_path / "slow_child.py"
    script.write_text(SLOW_CHILD)
    (tmp_path / "spares").mkdir()
    r = Running(tmp_path, heartbeat_timeout_s=0, spare_after_s=0.0)
    running.append(r)
    stage = r.start_child(script, "0", str(tmp_path / "spares"), spare=True)
    wait_until(lambda: stage.spare_proc is not None, RESTART_BOUND_S, "the spare to start")
    spare = stage.spare_proc
    assert spare is not None and spare.poll() is None
    r.close()
    assert spare.poll() is not None and stage.spare_proc is None


def test_spares_start_when_asked_and_are_waited_for(tmp_path, running) -> None:
    script, spares = tmp_path / "slow_child.py", tmp_path / "spares"
    script.write_text(SLOW_CHILD)
    spares.mkdir()
    r = Running(tmp_path, heartbeat_timeout_s=0, spare_after_s=3600.0)  # never by itself here
    running.append(r)
    stage = r.start_child(script, "1", str(spares), spare=True)
    assert stage.spare_proc is None
    r.sup.start_spares()  # what `up` does before its warm-up
    spare = stage.spare_proc
    assert spare is not None and spare.poll() is None
    r.sup.wait_spares(0.01)  # a second's imports are not done in 10 ms: said, not waited for
    assert r.reports[-1].startswith("the spare process of child is still starting after 0.01s"), r.reports
    r.sup.wait_spares(RESTART_BOUND_S)  # what `up` does before its ready line
    assert stage.spare_waiting.is_set() and any(spares.iterdir())  # its imports are done
    r.sup.start_spares()  # one is enough
    assert stage.spare_proc is spare


# a stage that, told to stop, takes STOP_TAKES_S (callers in flight) and notes when it got the signal
STOPPING_CHILD = '''
import signal, sys, time
from pathlib import Path
from topics.stage import announce_ready

def stop(*_):
    Path(sys.argv[1]).write_text(f"{time.time()}")
    time.sleep(float(sys.argv[2]))
    sys.exit(0)

signal.signal(signal.SIGTERM, stop)
announce_ready("child")
while True:
    time.sleep(0.05)
'''


def test_the_gateways_stop_before_the_stages_that_answer_their_callers(tmp_path: Path) -> None:
    script = tmp_path / "stopping.py"
    script.write_text(STOPPING_CHILD)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    sup = Supervisor(tmp_path / "logs", report=lambda _: None)
    for name, takes in (("gateway-1", "1.0"), ("worker-m-0", "0")):
        sup.add(name, [sys.executable, str(script), str(tmp_path / name), takes], env)
    sup.wait_ready(RESTART_BOUND_S)
    sup.stop_all(first=("gateway",))
    told = {name: float((tmp_path / name).read_text()) for name in ("gateway-1", "worker-m-0")}
    assert told["worker-m-0"] - told["gateway-1"] >= 0.9  # the worker served until the gateway had gone
