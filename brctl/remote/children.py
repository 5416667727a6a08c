"""The local processes a transport has running (commands, srun steps), for Ctrl-C.

``cancel`` sends each SIGTERM (the node-side reaper, or srun, then ends what it
started) and refuses every later start, so a fan-out that is being interrupted
does not launch new work behind the kill.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
from collections.abc import Iterator


class Children:
    """A thread-safe set of running child processes, and whether they were cancelled."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[subprocess.Popen[bytes]] = set()
        self._cancelled = False

    @property
    def cancelled(self) -> bool:
        """``cancel`` was called: start nothing more."""
        return self._cancelled

    @contextlib.contextmanager
    def tracked(self, proc: subprocess.Popen[bytes]) -> Iterator[None]:
        """``proc`` is among the running while the block runs."""
        with self._lock:
            self._running.add(proc)
            late = self._cancelled  # started after cancel() looked: stop it as cancel() would
        if late:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        try:
            yield
        finally:
            with self._lock:
                self._running.discard(proc)

    def cancel(self) -> None:
        """SIGTERM every running child; refuse later starts."""
        with self._lock:
            self._cancelled = True
            running = list(self._running)
        for proc in running:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
