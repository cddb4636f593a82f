"""A spare stage process: started by ``up``'s supervisor ahead of need with ``SPARE_ENV`` set,
it imports its command and then waits until it is told to take a dead stage's place, so that a
restart does not wait for an interpreter to start and import its libraries on a busy machine
(``clipstream.supervise``, docs/design/0062)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # not imported at run time: every stage imports this module
    import subprocess

SPARE_ENV = "CLIPSTREAM_SPARE"
WAITING_LINE = b"spare: waiting"  # what a spare prints once its imports are done
SPARE_TITLE = "clipstream-spare: "  # before a waiting spare's command line, as ps shows it


def wait_if_spare(prepare: Callable[[], object] = lambda: None) -> None:
    """In a process started as a spare, run ``prepare`` (the imports a stage needs), then wait
    until the supervisor hands it its stage's place; exit when the supervisor is gone. Anywhere
    else, return at once."""
    if os.environ.pop(SPARE_ENV, None) is None:
        return
    prepare()
    # ps tells the waiting spare from the stage it stands in for. SPT_NOENV (read at the first
    # call): /proc/<pid>/environ, which the fault suite reads, stays whole, so a title must fit
    # in less than where the command line was: the spare's leaves out the interpreter and
    # ``-m clipstream.cli``, the stage's the interpreter's folder.
    os.environ["SPT_NOENV"] = "1"
    from setproctitle import setproctitle

    argv = list(sys.orig_argv)
    args = argv[3:] if argv[1:3] == ["-m", "clipstream.cli"] else argv[1:]
    setproctitle(SPARE_TITLE + " ".join(args))
    del os.environ["SPT_NOENV"]
    print(WAITING_LINE.decode(), flush=True)
    if not sys.stdin.readline():
        sys.exit(0)
    setproctitle(" ".join([os.path.basename(argv[0]), *argv[1:]]))


def end_spare(spare: subprocess.Popen[bytes]) -> None:
    """SIGKILL a spare the supervisor no longer needs: it has nothing to finish."""
    if spare.poll() is None:
        spare.kill()
    spare.wait(5)
