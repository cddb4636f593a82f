"""Process supervision for `clipstream up`: start stages, wait for their `ready:` line, restart.

Each stage prints exactly one line starting with ``ready:`` when it can serve (models loaded,
partitions assigned). Waiting on that line, not on a sleep, is what lets ``up`` promise that
the first query after its own ready line is answered by the models.

A stage that dies is restarted, always: after a pause that doubles with each death in a row
(``Backoff``) and starts over once the stage has served for a healthy while. A stage whose
heartbeat file (``topics.stage.heartbeat``) goes stale is hung: it gets SIGTERM, then SIGKILL,
and is restarted the same way (docs/design/0014).

A stage added with ``spare`` gets a spare process once it has been ready a while: the same
command, started ahead of need, which does its imports and then waits (``clipstream.spare``). A
restart hands the stage's place to it, so a failover does not wait for an interpreter to start
and import its libraries on a busy machine (docs/design/0062).
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from clipstream.backoff import Backoff
from clipstream.endings import drop_spare, send_signal, tail, terminate, why_it_died
from clipstream.errors import ClipstreamError
from clipstream.spare import SPARE_ENV, WAITING_LINE, end_spare
from topics.stage import (ALERT_PREFIX, CAPACITY_ADVICE, HEARTBEAT_EVERY_S, HEARTBEAT_FILE_ENV, NOTE_PREFIX,
                          read_heartbeat, relayed)

Report = Callable[[str], None]
MIN_HEARTBEAT_TIMEOUT_S = 2 * HEARTBEAT_EVERY_S  # a beat on time is up to one interval old
# how often ``watch`` reads the heartbeats when nothing happens; an exit is seen at once
CHECK_S = 0.5
# a stage's spare is started once the stage has been ready this long: not while the pipeline
# is still starting, where its imports would compete with the stages' own
SPARE_AFTER_S = 5.0
ALERT = ALERT_PREFIX.encode()
NOTE = NOTE_PREFIX.encode()
HINT_EVERY_S = 60.0  # what to do about a stage that keeps dying: said at most this often
# a capacity alert names the stages back from a restart this recently: its window (10 s) and
# its relay fit, while a restart long served since explains none of it
RECENT_RESTART_S = 20.0


@dataclass
class Stage:
    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    backoff: Backoff = field(default_factory=Backoff)
    proc: subprocess.Popen[bytes] | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    restarts: int = 0
    next_start: float = 0.0
    started_at: float = 0.0
    ready_at: float = 0.0
    ready_line: str = ""
    log_from: int = 0  # the log's size as this process started: its output is what follows
    hung: str = ""  # why it is being killed, while it is
    hung_for_s: float = 0.0
    hinted_at: float = float("-inf")  # when a restart line last said what to do
    kill_at: float = 0.0  # SIGKILL then, if SIGTERM has not ended it
    removed: bool = False
    spare: bool = False  # keep a spare process ready to take its place
    spare_proc: subprocess.Popen[bytes] | None = None
    spare_waiting: threading.Event = field(default_factory=threading.Event)  # its imports are done

    @property
    def heartbeat_path(self) -> Path:
        return self.log_path.with_suffix(".heartbeat")


class Supervisor:
    """Starts stages as subprocesses, tees their output to logs, restarts the ones that die and
    kills (then restarts) the ones whose heartbeat stops.

    ``heartbeat_timeout_s`` 0 turns hang detection off; ``kill_grace_s`` is how long a hung
    stage gets to act on SIGTERM before SIGKILL."""

    def __init__(self, log_dir: Path, report: Report = print, heartbeat_timeout_s: float = 15.0,
                 healthy_s: float = 60.0, backoff_first_s: float = 0.1, backoff_max_s: float = 30.0,
                 kill_grace_s: float = 5.0, spare_after_s: float = SPARE_AFTER_S) -> None:
        self.log_dir = log_dir
        self.spare_after_s = spare_after_s
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.report = report
        if 0 < heartbeat_timeout_s <= MIN_HEARTBEAT_TIMEOUT_S:
            raise ValueError(f"a heartbeat timeout must be 0 (off) or above {MIN_HEARTBEAT_TIMEOUT_S:g} s, "
                             f"got {heartbeat_timeout_s:g}: stages write their heartbeat every "
                             f"{HEARTBEAT_EVERY_S:g} s")
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.kill_grace_s = kill_grace_s
        Backoff(backoff_first_s, backoff_max_s, healthy_s)  # bad values fail here, not at a death
        self._backoff = (backoff_first_s, backoff_max_s, healthy_s)
        self.stages: dict[str, Stage] = {}
        self._lock = threading.Lock()
        self._stopping = False
        self._wake = threading.Event()  # a stage's output ended (it exited), or ``interrupt``
        self.hint: Callable[[Stage], str] = lambda stage: ""  # what to do about one that keeps dying
        self.serving = False  # set by ``up`` once ready: a stage started later says when it is ready

    def add(self, name: str, argv: list[str], env: dict[str, str], spare: bool = False) -> Stage:
        """Start a stage; with ``spare``, its restarts are taken over by a spare process
        (``clipstream.spare.wait_if_spare`` must be called by the command once its imports are
        done)."""
        stage = Stage(name, argv, env, self.log_dir / f"{name}.log", Backoff(*self._backoff), spare=spare)
        with self._lock:
            self.stages[name] = stage
        self._spawn(stage)
        return stage

    def _spawn(self, stage: Stage) -> None:
        stage.ready.clear()
        stage.started_at, stage.ready_at = time.monotonic(), 0.0
        stage.hung, stage.hung_for_s, stage.kill_at = "", 0.0, 0.0
        stage.heartbeat_path.unlink(missing_ok=True)  # the last run's beats are not this one's
        stage.log_from = stage.log_path.stat().st_size if stage.log_path.exists() else 0  # logs span runs
        if not self._take_spare(stage):  # a spare's output is already teed to the stage's log
            self._start(stage, spare=False)

    def _start(self, stage: Stage, spare: bool) -> None:
        """Run the stage's command as the stage or as its spare (told to wait, on stdin), its
        output teed to the stage's log; set as ``proc`` or ``spare_proc`` before the tee reads."""
        env = {**stage.env, HEARTBEAT_FILE_ENV: str(stage.heartbeat_path)}
        if spare:
            env[SPARE_ENV] = "1"
            stage.spare_waiting.clear()
        proc = subprocess.Popen(stage.argv, env=env, stdin=subprocess.PIPE if spare else None,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        if spare:
            stage.spare_proc = proc
        else:
            stage.proc = proc
        threading.Thread(target=self._tee, args=(stage, proc), daemon=True).start()

    def _take_spare(self, stage: Stage) -> bool:
        """Make the stage's spare the stage and tell it to go on; False when it has none alive."""
        spare, stage.spare_proc = stage.spare_proc, None
        if spare is None:
            return False
        try:
            if spare.poll() is None and spare.stdin is not None:
                stage.proc = spare  # before it can print its ready line
                spare.stdin.write(b"go\n")
                spare.stdin.close()
                return True
        except OSError:  # it died as it was told
            pass
        self._spare_lost(stage, spare)
        return False

    def _spare_lost(self, stage: Stage, spare: subprocess.Popen[bytes]) -> None:
        """A spare that ended before it was used: said once, and the stage has no more of them
        (its restarts start a fresh process, as without spares)."""
        stage.spare = False
        end_spare(spare)
        self.report(f"the spare process of {stage.name} ended with code {spare.returncode} before it was "
                    f"needed; its restarts start a fresh process (its output: {stage.log_path})")

    def _tee(self, stage: Stage, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        with open(stage.log_path, "ab") as log:
            for raw in proc.stdout:
                log.write(raw)
                log.flush()
                if raw.startswith(WAITING_LINE) and proc is stage.spare_proc:
                    stage.spare_waiting.set()
                if raw.startswith(ALERT):  # meant for whoever runs up, not only for the log
                    said = relayed(stage.name, raw[len(ALERT):].decode(errors="replace"), ALERT_PREFIX)
                    self.report(said + (self._restarts_before() if CAPACITY_ADVICE in said else ""))
                elif raw.startswith(NOTE):
                    self.report(relayed(stage.name, raw[len(NOTE):].decode(errors="replace")))
                if raw.startswith(b"ready:") and proc is stage.proc and not stage.ready.is_set():
                    stage.ready_line = raw.decode(errors="replace").strip()
                    stage.ready_at = time.monotonic()
                    if stage.restarts:  # how long a restart took, for whoever watches a failover
                        self.report(f"{stage.name} is ready again, {stage.ready_at - stage.started_at:.1f}s "
                                    f"after its restart")
                    elif self.serving:  # a stage a registry change started: its traffic may move now
                        self.report(f"{stage.name} is ready, {stage.ready_at - stage.started_at:.1f}s after its start")
                    stage.ready.set()
        proc.wait()  # its output ends as it exits: ``watch`` restarts it now, not at its next look
        self._wake.set()

    def _restarts_before(self) -> str:
        """What an alert that blames capacity should be read beside: the stages restarted
        lately. Requests given up while a worker restarts look like a lack of capacity to the
        stage that counts them."""
        now = time.monotonic()
        names = sorted(s.name for s in list(self.stages.values()) if s.restarts and (
            not s.ready.is_set() or now - s.ready_at <= RECENT_RESTART_S))  # still restarting, or just back
        return (f" ({', '.join(names)} restarted, back less than {RECENT_RESTART_S:g} s ago or not yet: more likely "
                "the cause than a lack of capacity)") if names else ""

    def wait_ready(self, timeout_s: float, names: list[str] | None = None) -> None:
        """Block until the named stages (default all) are ready; a stage that exits is an error,
        which quotes its output and adds ``self.hint(stage)``: what to do, which only ``up`` knows."""
        deadline = time.monotonic() + timeout_s
        names = names if names is not None else list(self.stages)
        pending = set(names)
        while pending:
            for name in list(pending):
                stage = self.stages[name]
                if stage.ready.is_set():
                    pending.discard(name)
                elif stage.proc is not None and stage.proc.poll() is not None:
                    raise ClipstreamError(
                        f"stage {name} exited with code {stage.proc.returncode} before it was ready"
                        f"{self.hint(stage)}; see {stage.log_path}:\n{tail(stage.log_path, start=stage.log_from)}"
                    )
            if pending and time.monotonic() > deadline:
                raise ClipstreamError(
                    f"stages not ready after {timeout_s:.0f}s: {sorted(pending)}; logs in {self.log_dir}"
                )
            time.sleep(0.05)

    def watch(self, stop: threading.Event, upkeep: Callable[[], None] = lambda: None,
              every_s: float = CHECK_S) -> None:
        """``up``'s loop, until ``stop`` is set (then call ``interrupt``): ``check`` as soon as
        a stage exits or a restart or kill is due, else every ``every_s``, then ``upkeep``.

        Waiting on the exits rather than looking often sees a death sooner and leaves ``up``
        asleep while nothing happens (docs/design/0049)."""
        while not stop.is_set():
            self._wake.wait(self._until_due(every_s))
            self._wake.clear()
            if stop.is_set():
                return
            self.check()
            upkeep()

    def interrupt(self) -> None:
        """End ``watch``'s wait now (its ``stop`` was set)."""
        self._wake.set()

    def _until_due(self, every_s: float) -> float:
        """Until the next restart or kill falls due (those past due were acted on), at most ``every_s``."""
        now = time.monotonic()
        return min([every_s, *(t - now for s in list(self.stages.values()) for t in (s.next_start, s.kill_at)
                               if t > now)])

    def check(self) -> None:
        """Restart stages that died, after their backoff, and kill the ones that hung; each
        restart is reported with its reason. ``watch`` calls it."""
        if self._stopping:
            return
        now = time.monotonic()
        for stage in list(self.stages.values()):
            if stage.removed or stage.proc is None:
                continue
            if stage.proc.poll() is None:
                self._watch(stage, now)
                self._keep_spare(stage, now)
                continue
            if stage.next_start == 0.0:
                why = why_it_died(stage, stage.proc.returncode)
                served = max(0.0, now - stage.hung_for_s - stage.ready_at) if stage.ready_at else 0.0
                delay = stage.backoff.next_delay(served)
                stage.next_start = now + delay
                # what to do, from the second death in a row, then once a minute: a stage
                # that keeps dying must not print the same advice every few seconds
                again = ""
                if stage.backoff.streak >= 2 and now - stage.hinted_at >= HINT_EVERY_S:
                    again, stage.hinted_at = self.hint(stage), now
                self.report(f"restarting {stage.name} in {delay:g}s ({why}); log: {stage.log_path}{again}")
            if now >= stage.next_start and not self._stopping:
                stage.restarts += 1
                stage.next_start = 0.0
                self._spawn(stage)

    def start_spares(self) -> None:
        """Start the spare of every ready stage that keeps one and has none, now: ``up`` does so
        before its warm-up, whose traffic absorbs their imports, rather than in the first
        seconds of serving."""
        now = time.monotonic()
        for stage in list(self.stages.values()):
            self._keep_spare(stage, now, after_s=0.0)

    def wait_spares(self, timeout_s: float) -> None:
        """Wait until every spare has done its imports, so that none of them competes with the
        first seconds of serving; one that takes longer is said, and waited for no more."""
        deadline = time.monotonic() + timeout_s
        for stage in list(self.stages.values()):
            spare = stage.spare_proc
            if spare is None:
                continue
            while not stage.spare_waiting.wait(0.1) and spare.poll() is None:
                if time.monotonic() > deadline:
                    self.report(f"the spare process of {stage.name} is still starting after {timeout_s:g}s; "
                                f"going on without waiting for it")
                    return

    def _keep_spare(self, stage: Stage, now: float, after_s: float | None = None) -> None:
        """Start the spare of a stage that has been ready ``after_s`` (``spare_after_s`` unless
        given), or say that its spare died."""
        if not stage.spare or self._stopping:
            return
        if stage.spare_proc is None:
            wait_s = self.spare_after_s if after_s is None else after_s
            if stage.ready.is_set() and now - stage.ready_at >= wait_s:
                self._start(stage, spare=True)
        elif stage.spare_proc.poll() is not None:
            spare, stage.spare_proc = stage.spare_proc, None
            self._spare_lost(stage, spare)

    def _watch(self, stage: Stage, now: float) -> None:
        """A live stage: SIGKILL it if its SIGTERM grace is over; SIGTERM it if it hung."""
        if stage.kill_at:
            if now >= stage.kill_at:
                send_signal(stage, signal.SIGKILL)
            return
        if not self.heartbeat_timeout_s:
            return
        beats = read_heartbeat(stage.heartbeat_path)  # None until its loops first beat
        if beats is None:
            return
        age = now - min(beats.values())
        if age > self.heartbeat_timeout_s:
            loops = ", ".join(f"{name} {now - t:.0f}s" for name, t in sorted(beats.items(), key=lambda b: b[1]))
            stage.hung = f"hung: no heartbeat for {age:.0f}s ({loops})"
            stage.hung_for_s = age
            stage.kill_at = now + self.kill_grace_s
            self.report(f"stage {stage.name} is {stage.hung}; stopping it (SIGTERM, "
                        f"SIGKILL after {self.kill_grace_s:g}s)")
            send_signal(stage, signal.SIGTERM)
            send_signal(stage, signal.SIGCONT)  # a stopped stage acts on its SIGTERM (as systemd does)

    def release(self, name: str) -> Stage | None:
        """Take a stage out of the supervisor's care without stopping it (a worker of a replaced
        version serves on until its handover): it is no longer restarted or stopped from here."""
        with self._lock:
            stage = self.stages.pop(name, None)
            if stage is not None:
                stage.removed = True  # under the lock, so a ``check`` under way does not restart it
        if stage is not None:
            drop_spare(stage)
        return stage

    def adopt(self, stage: Stage, restart: bool = True) -> None:
        """Take a released stage back: into care (a rollback before it left), or, with
        ``restart`` false, only to be stopped with the others (the final stop)."""
        with self._lock:
            stage.removed = not restart
            self.stages.setdefault(stage.name, stage)

    def remove(self, name: str) -> None:
        with self._lock:
            stage = self.stages.pop(name, None)
        if stage is not None:
            stage.removed = True  # ``check`` must not restart it
            terminate([stage])

    def stop_all(self, first: tuple[str, ...] = ()) -> None:
        """Stop every stage; those named with a prefix in ``first`` first, so that the callers
        they hold are answered while the stages behind them still serve."""
        self._stopping = True
        stages = list(self.stages.values())
        terminate([s for s in stages if s.name.startswith(first)] if first else [])
        terminate([s for s in stages if not (first and s.name.startswith(first))])
