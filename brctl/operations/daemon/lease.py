"""The daemon's lease from this process's side: who holds it, and a heartbeat.

``this_holder`` records what a successor needs to prove this process dead (host,
boot id, PID namespace inode, pid, start time); ``proven_dead`` reads ``/proc`` to
judge a recorded holder (``analysis.daemon.plan.holder_dead``). ``Heartbeat``
renews the lease from a thread while the loop works (a diagnose or a restart hook
may run far longer than ``daemon.lease_ttl``), every ``ttl / 4`` seconds; when the
renewal finds another generation it sets ``lost`` and stops, and the loop stops
before its next step (every step's record is fenced by the generation anyway).
"""

from __future__ import annotations

import os
import socket
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from brctl.analysis.daemon.plan import Holder, holder_dead
from brctl.operations.ledger.state import DaemonState
from brctl.state import StateBusy, StateDamaged

RENEWALS_PER_TTL = 4  # a lease survives three missed renewals


def _read(path: str) -> Optional[str]:
    try:
        return Path(path).read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None


def proc_start(pid: int) -> Optional[int]:
    """Start time of ``pid`` in clock ticks since boot (``/proc/<pid>/stat`` field 22), or
    None when no such process is visible here."""
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # the command name may hold spaces and ')'
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def this_holder(pid: Optional[int] = None) -> Optional[Holder]:
    """This process (or ``pid``, in this namespace) as a lease holder; None off Linux."""
    pid = os.getpid() if pid is None else pid
    boot = _read("/proc/sys/kernel/random/boot_id")
    start = proc_start(pid)
    try:
        pidns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
    if boot is None or start is None:
        return None
    return Holder(socket.gethostname(), boot, pidns, pid, start)


def proven_dead(doc: Optional[dict[str, Any]]) -> Optional[str]:
    """Why the recorded lease holder ``doc`` is provably dead, or None."""
    here = this_holder()
    holder = Holder.from_json(doc)
    if here is None or holder is None:
        return None
    return holder_dead(holder, here, proc_start(holder.pid))


class Heartbeat:
    """Renews ``generation``'s lease every ``ttl / RENEWALS_PER_TTL`` seconds until stopped."""

    def __init__(self, state: DaemonState, generation: int, ttl: float,
                 clock: Callable[[], float] = time.time) -> None:
        """Start renewing (a daemon thread)."""
        self.state, self.generation, self.ttl, self.clock = state, generation, ttl, clock
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="brctl-lease", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.ttl / RENEWALS_PER_TTL):
            try:
                renewed = self.state.renew_lease(self.generation, self.clock(), self.ttl)
            except (sqlite3.Error, StateBusy, StateDamaged):  # a busy database: the next beat retries
                continue
            if not renewed:
                self.lost.set()
                return

    def stop(self) -> None:
        """Stop renewing (the lease is then released or left to expire)."""
        self._stop.set()
        self._thread.join(timeout=5)
