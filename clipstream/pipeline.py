"""The stages ``clipstream up`` runs for what the registry serves, kept in step with it.

Per model a batcher (or one for every model) and one worker per replica: ``wanted_stages``
names them from a registry view, and ``Pipeline`` starts what is missing, stops what is no
longer wanted, and lets a replaced version's workers serve until their partitions are handed
over (docs/design/0021).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from dataclasses import dataclass

import click

from clipstream.metrics_targets import MetricTargets
from clipstream.supervise import Stage, Supervisor
from registry.topic import RegistryView

__all__ = ["LEAVE_GRACE_S", "Leaving", "Pipeline", "gateway_stages", "say", "stage_argv", "wanted_stages"]

# an old version's worker normally stops by itself when the batcher hands its partition over;
# one still running this long after the new version's workers were all ready is stopped
LEAVE_GRACE_S = 30.0


def say(msg: str) -> None:
    """A line on stderr that never fails: whoever read ``up``'s output may be gone (a closed pipe)."""
    try:
        click.echo(msg, err=True)
    except OSError:
        pass


def _failing(stage: Stage) -> bool:
    """A worker never ready that exited or restarted since its start: its model does not load.
    One still loading is not stopped at once, but left as a serving one is: the batcher may
    hand its partition to it the moment it is ready, before ``up`` reads its ready line, and
    stopping it then would leave the model no worker until the next version loads."""
    if stage.ready_line:
        return False
    return stage.restarts > 0 or stage.proc is None or stage.proc.poll() is not None


def stage_argv(*args: str) -> list[str]:
    """A stage's command line: this interpreter's ``clipstream`` CLI, so every stage runs in the
    environment ``up`` runs in."""
    return [sys.executable, "-m", "clipstream.cli", *args]


def gateway_stages(count: int, port: str) -> list[tuple[str, list[str]]]:
    """The gateway stages: one ``gateway``, or ``gateway-1..n`` sharing the port, each with its
    own reply topic, named by port and member so a restart reuses it."""
    if count == 1:
        return [("gateway", stage_argv("gateway"))]
    return [(f"gateway-{i}", stage_argv("gateway", "--reuse-port", "--instance", f"gw{port}-{i}"))
            for i in range(1, count + 1)]


class Pipeline:
    """Keeps the batcher(s) and one worker per replica in step with the registry."""

    def __init__(self, supervisor: Supervisor, env: dict[str, str], shared_batcher: bool = True,
                 targets: MetricTargets | None = None, batcher_members: int = 1, spares: bool = False) -> None:
        self.supervisor = supervisor
        self.spares = spares  # each stage keeps a spare process (docs/design/0062)
        self.batcher_members = batcher_members
        self.env = env
        self.targets = targets  # each stage's metrics port (``clipstream.metrics_targets``)
        self.shared_batcher = shared_batcher
        self._lock = threading.Lock()
        self.retiring: list[str] = []  # shared batchers replaced, stopped once the new one is ready
        # workers of a version the registry replaced: out of the supervisor's care, serving
        # until the batcher hands their partitions over to the new version's workers
        self.leaving: dict[str, Leaving] = {}
        self.view: RegistryView | None = None  # the last one synced to
        self.app_file: str | None = None  # while ``up`` starts from it: where a failed worker is fixed
        self._unserved: set[tuple[str, str, str]] = set()  # (model, version, why) said already

    def sync(self, view: RegistryView) -> list[str]:
        """Start what the registry asks for and is not running; stop what it no longer asks for.

        Worker names carry the model version, so a deploy or a rollback starts the new
        version's workers beside the old ones, which leave once their partitions are handed
        over (``retire``); the batcher follows the version itself (the cache key carries it,
        so no stale answer leaks).
        """
        started: list[str] = []
        with self._lock:
            self.view = view
            self._say_unserved(view)
            wanted = wanted_stages(view, self.shared_batcher, self.batcher_members)
            for stage, args in wanted.items():
                if stage in self.supervisor.stages:
                    continue
                back = self.leaving.pop(stage, None)
                if back is not None and back.stage.proc is not None and back.stage.proc.poll() is None:
                    self.supervisor.adopt(back.stage)  # rolled back before it left: it serves on
                    say(f"{stage} serves on (registry change)")
                    continue
                self.supervisor.add(stage, stage_argv(*args),
                                    self.targets.env(stage, self.env) if self.targets else self.env,
                                    spare=self.spares)
                started.append(stage)
            for stage in list(self.supervisor.stages):
                if stage in wanted or stage in self.retiring:
                    continue
                model = _arg(self.supervisor.stages[stage], "--model")
                served = view.served().get(model or "")
                if stage.startswith("worker-") and _failing(self.supervisor.stages[stage]):
                    self.supervisor.remove(stage)  # it has served nothing, and would not
                    say(f"stopped {stage} (registry change; it was never ready)")
                elif stage.startswith("worker-") and served is not None and served.spec is not None:
                    if _arg(self.supervisor.stages[stage], "--version") != served.version:
                        self._leave(stage, model or "", f"version {served.version} of {model} is ready")
                    else:  # a replica the registry removed: its batches are served, then it stops
                        self._leave(stage, model or "", f"the batches sent to it are served ({model} now has "
                                    f"{served.replicas} replica{'s' * (served.replicas != 1)})")
                elif stage.startswith(("worker-", "batcher-")):
                    self.supervisor.remove(stage)
                    say(f"stopped {stage} (registry change)")  # as ``up`` says each start
                elif stage.startswith("batchers-"):
                    self.retiring.append(stage)
        self.retire()
        return started

    def _say_unserved(self, view: RegistryView) -> None:
        """A model whose folder this host cannot read gets no worker: said once per version and
        reason, as nothing else would show it (its callers get defaults, ``inspect`` elsewhere
        may read the folder well)."""
        for name, model in view.models.items():
            key = (name, model.version, model.spec_error or "")
            if model.spec is not None or not model.spec_error or key in self._unserved:
                continue
            self._unserved.add(key)
            say(f"alert: up: model {name} version {model.version} is not served, as this host cannot read it: "
                f"{model.spec_error}; fix it here (a location in a model repository needs "
                f"CLIPSTREAM_MODEL_REPOSITORY set for up as for deploy-model), or deploy it again")

    def hint(self, stage: Stage) -> str:
        """What to do about a stage that exited before it was ready, for ``Supervisor.wait_ready``:
        a worker whose model does not load fails again at every restart, so the way out is a
        fixed version or the previous one, which the error should name."""
        model = _arg(stage, "--model")
        if not stage.name.startswith("worker-") or model is None:
            return ""
        if self.app_file is not None:  # starting: the file is applied again at the next start
            return (f"; {self.app_file} is applied at every start: fix the model's `path:` or `version:` "
                    f"there, or take the model out of it, then run up again")
        group = self.view.groups.get(model) if self.view is not None else None
        if group is not None:  # a group's worker loads every member: the member is what gets fixed
            members = ", ".join(m.name for m in group.members)
            return (f"; if a member of group {model} ({members}) does not load or keeps failing, fix it and "
                    f"deploy it as a new version (clipstream deploy-model MEMBER PATH --version N), roll it "
                    f"back (clipstream rollback MEMBER), or remove it (clipstream remove-model MEMBER --unlink)")
        return (f"; if its model does not load or keeps failing, fix the model and deploy it as a new version "
                f"(clipstream deploy-model {model} PATH --version N), roll it back (clipstream rollback {model}), "
                f"or remove it (clipstream remove-model {model} --unlink, and take it out of the app file)")

    def _leave(self, name: str, model: str, until: str) -> None:
        stage = self.supervisor.release(name)
        if stage is None:
            return
        self.leaving[name] = Leaving(stage, model)
        say(f"{name} serves until {until}")

    def retire(self) -> None:
        """Stop replaced shared batchers once every wanted one is ready, and see the workers of
        replaced versions out (called at each check)."""
        self._see_out(time.monotonic())
        with self._lock:
            if not self.retiring:
                return
            stages = self.supervisor.stages
            new = [s for name, s in stages.items() if name.startswith("batchers-") and name not in self.retiring]
            if all(s.ready.is_set() for s in new):
                for name in self.retiring:
                    self.supervisor.remove(name)
                    say(f"stopped {name} (registry change)")
                self.retiring = []

    def _see_out(self, now: float) -> None:
        """A leaving worker stops by itself at the handover; one still running ``LEAVE_GRACE_S``
        after its model's current workers were all ready gets SIGTERM, and SIGKILL after as long again."""
        with self._lock:
            for name, leaving in list(self.leaving.items()):
                proc = leaving.stage.proc
                if proc is None or proc.poll() is not None:
                    del self.leaving[name]
                    how = "stopped by up" if leaving.signalled else "its partition was handed over"
                    say(f"{name} stopped ({how}, exit code {proc.returncode if proc else '-'})")
                    continue
                current = [s for s in self.supervisor.stages.values()
                           if s.name.startswith("worker-") and _arg(s, "--model") == leaving.model]
                if not leaving.successors_ready_at and current and all(s.ready.is_set() for s in current):
                    leaving.successors_ready_at = now
                waited = now - leaving.successors_ready_at if leaving.successors_ready_at else 0.0
                step = 2 if waited > 2 * LEAVE_GRACE_S else 1 if waited > LEAVE_GRACE_S else 0
                if step > leaving.signalled:
                    sig = signal.SIGKILL if step == 2 else signal.SIGTERM
                    say(f"{name} was not handed over {waited:.0f}s after its successors were ready; "
                         f"stopping it ({sig.name})")
                    _killpg(proc.pid, sig)
                    leaving.signalled = step

    def hand_back(self) -> None:
        """Leaving workers go back to the supervisor, to be stopped with everything else."""
        with self._lock:
            for leaving in self.leaving.values():
                self.supervisor.adopt(leaving.stage, restart=False)
            self.leaving.clear()


@dataclass
class Leaving:
    """A worker of a replaced version, serving until its partition is handed over."""

    stage: Stage
    model: str
    successors_ready_at: float = 0.0
    signalled: int = 0  # 1: SIGTERM sent, 2: SIGKILL sent


def _arg(stage: Stage, option: str) -> str | None:
    """The value of ``option`` a stage was started with (the first one)."""
    argv = stage.argv
    return next((argv[i + 1] for i in range(len(argv) - 1) if argv[i] == option), None)


def _killpg(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)  # stages run in their own session: the group is the stage
    except ProcessLookupError:
        pass


def wanted_stages(view: RegistryView, shared_batcher: bool = True, batcher_members: int = 1) -> dict[str, list[str]]:
    """Stage name -> CLI arguments: one batcher per model (or one for all), one worker per replica.

    A batcher follows the models' versions through the registry itself, so its stage name
    carries only the model names: a shared one is replaced when a model comes or goes. With
    ``batcher_members`` above one, each batcher runs that many times (names ending ``.1``,
    ``.2``, ...); every member is a static group member named ``batcher-<i>``."""
    wanted: dict[str, list[str]] = {}

    def batchers(name: str, models: list[str]) -> None:
        args = ["batcher", *[a for n in models for a in ("--model", n)]]
        if batcher_members == 1:
            wanted[name] = [*args, "--member", "batcher-1"]
            return
        for i in range(1, batcher_members + 1):
            wanted[f"{name}.{i}"] = [*args, "--member", f"batcher-{i}"]

    # a group (docs/design/0088) is served as one model: its batcher and workers, not its members'
    units = view.served()
    served = sorted(name for name, model in units.items() if model.spec is not None)
    if shared_batcher and served:
        batchers("batchers-" + "+".join(served), served)
    for name, model in units.items():
        if model.spec is None:
            continue
        v = model.version
        if not shared_batcher:  # it follows the model's version through the registry itself
            batchers(f"batcher-{name}", [name])
        for r in range(model.replicas):
            wanted[f"worker-{name}-v{v}-{r}"] = [
                "worker", "--model", name, "--version", v,
                "--replica", str(r), "--replicas", str(model.replicas),
            ]
    return wanted
