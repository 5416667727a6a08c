"""Waiting in tests on the event meant, never on a sleep that another thread may outrun.

``wait_for`` polls a predicate (a file, a log line, a socket state, a process exit) under a
generous timeout and fails naming what it awaited; ``wait_event`` does the same for a
``threading.Event``; ``deadline`` asserts that a block ended before a budget at least five
times its expected time and far below the timeout it proves was not waited out. Every
budget is multiplied by ``$BRCTL_TIMEOUT_SCALE`` (``scaled``), which slow CI stretches.
``alive`` tells whether a pid still runs, for waits on a process that is not our child.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

# Long enough that only a real hang reaches it on a loaded 2-core machine; tests end at
# their event, so a generous outer timeout costs nothing when they pass.
PATIENCE = 60.0


def scaled(seconds: float) -> float:
    """``seconds`` times ``$BRCTL_TIMEOUT_SCALE`` (default 1): slow CI stretches timeouts."""
    return seconds * float(os.environ.get("BRCTL_TIMEOUT_SCALE", "1") or 1)


def wait_for(predicate: Callable[[], T], what: str, timeout: float = PATIENCE,
             *, every: float = 0.01) -> T:
    """The first truthy value of ``predicate()``, polled every ``every`` s.

    Raises:
        AssertionError: naming ``what`` when ``scaled(timeout)`` passed first.
    """
    limit = time.monotonic() + scaled(timeout)
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() >= limit:
            raise AssertionError(f"timed out after {scaled(timeout):.0f} s waiting for {what}")
        time.sleep(every)


def wait_event(event: threading.Event, what: str, timeout: float = PATIENCE) -> None:
    """Wait for ``event``; an AssertionError naming ``what`` if ``scaled(timeout)`` passes."""
    if not event.wait(scaled(timeout)):
        raise AssertionError(f"timed out after {scaled(timeout):.0f} s waiting for {what}")


@contextmanager
def deadline(seconds: float, what: str, clock: Callable[[], float] = time.monotonic) -> Iterator[None]:
    """Assert that the block ends within ``scaled(seconds)``.

    ``seconds`` is at least 5x what the block is expected to take, and far below the
    timeout the test proves was not waited out (e.g. srun gone before its 600 s timeout:
    ``deadline(30, ...)``). Never an assertion that something was fast. Work that only
    computes is timed on ``clock=time.process_time``: on a shared machine its wall time
    is the machine's load (0.1 s of CPU took 5.5 s of wall at a load of 13 on 2 cores).
    """
    start = clock()
    yield
    took = clock() - start
    assert took < scaled(seconds), f"{what} took {took:.1f} s, past its {scaled(seconds):.0f} s deadline"


def alive(pid: int) -> bool:
    """Whether ``pid`` runs: a zombie (dead, not yet reaped: where pid 1 does not reap,
    for ever) does not, and ``os.kill(pid, 0)`` cannot tell the two apart."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False
