"""What a daemon run reports (``brctl.daemon/1``) and what ``brctl daemon status`` reads.

``PollResult`` and ``DaemonReport`` are the loop's (``operations.daemon``) results;
``status`` reads the daemon's records for a job without contacting any machine;
``follow`` reads what it writes next.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from brctl.analysis.daemon.policy import Incident, Plan
from brctl.analysis.inventory import Inventory
from brctl.core.errors import ExitCode, exit_code_of
from brctl.operations.ledger.state import DaemonState
from brctl.state import Store


@dataclass
class PollResult:
    """One poll, for the caller's progress output."""

    at: float
    step: Optional[int]
    moved: bool
    incident: Optional[Incident] = None
    plan: Optional[Plan] = None
    refused: Optional[str] = None
    dry_run: bool = False

    def to_json(self) -> dict[str, Any]:
        """``{at, step, moved, incident, plan, refused, dry_run}``."""
        return {"at": self.at, "step": self.step, "moved": self.moved,
                "incident": self.incident.to_json() if self.incident else None,
                "plan": self.plan.to_json() if self.plan else None,
                "refused": self.refused, "dry_run": self.dry_run}


@dataclass
class DaemonReport:
    """What a run did: polls, handled incidents, refusals, the ETTR it recorded."""

    job: str
    iterations: int = 0
    handled: list[PollResult] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)
    members: list[str] = field(default_factory=list)
    ettr: Optional[float] = None
    stopped_by: str = ""
    lease_lost: Optional[str] = None

    @property
    def exit_code(self) -> ExitCode:
        """4 when the lease was lost; else 0 when stopped by SIGTERM/SIGINT (systemctl stop
        is a normal end); else 4 when anything was refused or abandoned, 1 when incidents
        were handled, 0 otherwise."""
        if self.stopped_by == "signal" and not self.lease_lost:
            return ExitCode.OK  # systemctl stop is a normal end, whatever the run saw
        return exit_code_of(refused=bool(self.lease_lost or self.refusals),
                            findings=bool(self.handled))

    def to_json(self) -> dict[str, Any]:
        """The payload of ``brctl.daemon/1``."""
        return {"job": self.job, "iterations": self.iterations,
                "incidents": [p.to_json() for p in self.handled], "refusals": self.refusals,
                "resumed": self.resumed, "members": self.members, "ettr": self.ettr,
                "stopped_by": self.stopped_by, "lease_lost": self.lease_lost}


@dataclass(frozen=True)
class StatusReport:
    """``brctl daemon status``: the lease, the last poll, recent events and actions."""

    job: str
    lease: Optional[dict[str, Any]]
    last_poll: Optional[float]
    summary: dict[str, Any]
    events: list[dict[str, Any]]
    actions: list[dict[str, Any]]
    quarantined: list[dict[str, Any]]
    now: float
    skipped: list[dict[str, str]] = field(default_factory=list)  # rows that did not decode

    @property
    def alive(self) -> bool:
        """A daemon holds an unexpired lease."""
        return self.lease is not None and float(self.lease["expires"]) > self.now

    @property
    def exit_code(self) -> ExitCode:
        """3 when rows were skipped (they did not decode), else 1 when no daemon watches
        the job, else 0."""
        return exit_code_of(incomplete=bool(self.skipped), findings=not self.alive)

    def to_json(self) -> dict[str, Any]:
        """The payload of ``brctl.daemon-status/1``."""
        return {"job": self.job, "running": self.alive, "lease": self.lease,
                "last_poll": self.last_poll, "summary": self.summary, "events": self.events,
                "actions": self.actions, "quarantined": self.quarantined,
                "skipped_rows": self.skipped}


def status(inv: Inventory, state_dir: Path, *, events: int = 20) -> StatusReport:
    """Read the daemon's records for ``inv``'s job (no machine is contacted)."""
    store = Store(state_dir)
    try:
        return read_status(inv, store, events=events)
    finally:
        store.close()


def read_status(inv: Inventory, store: Store, *, events: int = 20) -> StatusReport:
    """``status`` from an open state database (the run's own: ``Env.store()``)."""
    from brctl.core.errors import UsageError

    if inv.job is None:
        raise UsageError(f"daemon status: {inv.source} has no job: section")
    state = DaemonState(store, inv.job.name)
    last = state.status()
    lease = state.lease()
    recent = state.events(events)
    actions = [a.to_json() for a in state.actions(limit=events)]
    quarantined = [q.to_json() for q in state.quarantined().values()]
    return StatusReport(
        inv.job.name, lease, last[0] if last else None, last[1] if last else {},
        recent, actions, quarantined, time.time(), [d.to_json() for d in state.skipped()])


def follow(inv: Inventory, store: Store, first: StatusReport, *, events: int, every: float,
           sleep: Callable[[float], None] = time.sleep) -> Iterator[StatusReport]:
    """``daemon status --follow``: every ``every`` seconds, the records written since the
    last read (a report whose events and actions are only the new ones); until interrupted."""
    report = first
    while True:
        seen = max([e["id"] for e in report.events] + [0])
        done = max([a["id"] for a in report.actions] + [0])
        sleep(every)
        report = read_status(inv, store, events=events)
        yield dataclasses.replace(report, events=[e for e in report.events if e["id"] > seen],
                                  actions=[a for a in report.actions if a["id"] > done],
                                  quarantined=[])
