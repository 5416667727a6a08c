"""The audit trail of hand-made changes: recorded and announced as the daemon's are.

A human's ``evict``, ``unevict``, ``ckpt restore`` or ``update`` is an event in the
job's ``daemon_events`` (what ``brctl daemon status`` and ``/metrics`` read), a line
in the daemon's event log (``daemon.event_log``, default ``<state>/daemon-events.jsonl``)
and a message through the daemon's notifier (``daemon.notify_webhook`` /
``notify_command``), each naming the operator. Delivery is best effort: a failed
notification is itself an event (``notify_failed``), never an error of the command.
A dry run calls none of this.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from brctl.analysis.inventory import Inventory
from brctl.config.daemon import DaemonSection
from brctl.core.nodeset import fold
from brctl.operations.jobadapter import Notifier
from brctl.operations.ledger.state import DaemonState

EVENT_LOG = "daemon-events.jsonl"


def event_log_path(cfg: DaemonSection, state_dir: Path) -> Path:
    """The daemon's event log: ``daemon.event_log``, else ``<state dir>/daemon-events.jsonl``."""
    return Path(cfg.event_log).expanduser() if cfg.event_log else state_dir / EVENT_LOG


def append_private(path: Path, line: str) -> None:
    """Append ``line`` to ``path``, created 0600 (events name machines and reasons)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        if os.fstat(fd).st_mode & 0o077:
            os.fchmod(fd, 0o600)
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Audit:
    """Where one hand command records and announces what it changed."""

    state: DaemonState
    log: Path
    notifier: Notifier
    operator: str

    @classmethod
    def of(cls, inv: Inventory, state: DaemonState, state_dir: Path, operator: str) -> Audit:
        """The audit trail of ``inv``'s job, as the daemon of that job keeps it."""
        cfg = inv.daemon
        return cls(state, event_log_path(cfg, state_dir),
                   Notifier(inv.job_key, cfg.notify_webhook, cfg.notify_command), operator)

    def record(self, kind: str, nodes: Sequence[str], detail: Mapping[str, Any], *,
               outcome: str, reason: str, at: Optional[float] = None) -> list[str]:
        """Record event ``kind`` (``by: hand`` and the operator added), then notify.

        Returns the notification errors (also recorded as a ``notify_failed`` event).
        """
        when = time.time() if at is None else at
        doc = {**detail, "by": "hand", "operator": self.operator}
        self._write(kind, nodes, doc, when)
        try:
            errors = self.notifier.send(kind, outcome, fold(nodes) if nodes else None, reason, doc)
        except Exception as exc:  # a page is never worth a failed command
            errors = [f"notifier: {type(exc).__name__}"]
        if errors:
            self._write("notify_failed", nodes, {"errors": errors, "operator": self.operator},
                        time.time())
        return errors

    def _write(self, kind: str, nodes: Sequence[str], detail: dict[str, Any], at: float) -> None:
        event_id = self.state.event(kind, nodes, detail, at)
        line = {"id": event_id, "at": at, "job": self.state.job, "kind": kind,
                "nodes": list(nodes), "detail": detail}
        append_private(self.log, json.dumps(line, default=str) + "\n")
