"""What ``brctl update`` reports: per-machine outcomes, a switch, a push, the status.

Each report carries its exit code and its JSON (``to_json``); ``operations.update``
builds them, ``commands/_render_update`` shows them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, Optional

from brctl.analysis.update import Pending
from brctl.core.errors import ExitCode, exit_code_of
from brctl.core.transport import NodeState
from brctl.operations.jobadapter import HookRun

_TRANSPORT_STATES = {s.value for s in NodeState if not s.ran}



@dataclass(frozen=True)
class NodeOutcome:
    """What happened on one machine in one step.

    ``state``: staged, present (already held it), switched, already (was on it),
    reverted (switched, then switched back), failed, conflict, lagging, or a
    transport state (unreachable, timeout, auth, hostkey).
    """

    state: str
    message: str = ""
    bytes_sent: int = 0

    @property
    def answered(self) -> bool:
        """The machine answered (its state is not a transport failure)."""
        return self.state not in _TRANSPORT_STATES

    def to_json(self) -> dict[str, object]:
        """JSON form."""
        return {"state": self.state, "message": self.message, "bytes_sent": self.bytes_sent}


SwitchOutcome = Literal["ok", "noop", "incomplete", "failed", "rolled_back"]


@dataclass(frozen=True)
class SwitchReport:
    """The result of apply, rollback, or the switch of an urgent push.

    ``outcome``: ok (every machine is on ``version``), noop (nothing to do),
    incomplete (not started: machines did not answer), failed (not started:
    lagging machines could not be caught up; or the switch back failed too),
    rolled_back (a machine failed to switch; the others were switched back).
    """

    action: str
    job: str
    version: Optional[str]
    from_version: Optional[str]
    outcome: SwitchOutcome
    reason: str
    nodes: Mapping[str, NodeOutcome]
    restart: Optional[HookRun] = None

    @property
    def exit_code(self) -> ExitCode:
        """4 when brctl refused a machine, 3 when machines did not answer, 1 when the switch
        or the hook failed, else 0."""
        return exit_code_of(
            refused=any(o.state == NodeState.REFUSED.value for o in self.nodes.values()),
            incomplete=any(not o.answered for o in self.nodes.values()),
            findings=self.outcome not in ("ok", "noop") or bool(self.restart and not self.restart.ok))

    def to_json(self) -> dict[str, object]:
        """JSON form."""
        return {"action": self.action, "job": self.job, "version": self.version,
                "from_version": self.from_version, "outcome": self.outcome,
                "reason": self.reason, "nodes": {n: o.to_json() for n, o in self.nodes.items()},
                "restart": self.restart.to_json() if self.restart else None}


@dataclass(frozen=True)
class PushReport:
    """The result of a push: where the release is staged, and what became of it."""

    job: str
    version: str
    sha256: str
    size: int
    source: str
    urgent: bool
    nodes: Mapping[str, NodeOutcome]
    pending: Optional[Pending]
    switch: Optional[SwitchReport]
    message: str

    @property
    def bytes_sent(self) -> int:
        """Artifact bytes sent over all machines (resumed and skipped ones send less)."""
        return sum(o.bytes_sent for o in self.nodes.values())

    @property
    def exit_code(self) -> ExitCode:
        """4 when brctl refused a machine, 3 when machines did not answer, 1 when
        staging/switch/hook failed, else 0."""
        own = exit_code_of(
            refused=any(o.state == NodeState.REFUSED.value for o in self.nodes.values()),
            incomplete=any(not o.answered for o in self.nodes.values()),
            findings=any(o.state in ("failed", "conflict") for o in self.nodes.values()))
        # the switch's own outcome folds in (its refusal too)
        return ExitCode.worst(own, *([self.switch.exit_code] if self.switch else []))

    def to_json(self) -> dict[str, object]:
        """JSON form."""
        return {"job": self.job, "version": self.version, "sha256": self.sha256,
                "size": self.size, "source": self.source, "urgent": self.urgent,
                "bytes_sent": self.bytes_sent, "message": self.message,
                "nodes": {n: o.to_json() for n, o in self.nodes.items()},
                "pending": self.pending.to_json() if self.pending else None,
                "switch": self.switch.to_json() if self.switch else None}


@dataclass(frozen=True)
class NodeStatus:
    """One machine's releases."""

    state: str  # ok, or a transport state / failed when it did not answer
    current: Optional[str]
    releases: tuple[str, ...]
    pending_staged: Optional[bool]  # None without a pending release
    drift: bool
    error: str = ""

    def to_json(self) -> dict[str, object]:
        """JSON form."""
        return {"state": self.state, "current": self.current, "releases": list(self.releases),
                "pending_staged": self.pending_staged, "drift": self.drift, "error": self.error}


@dataclass(frozen=True)
class StatusReport:
    """Current and pending release per machine, and which machines drifted."""

    job: str
    version: Optional[str]
    sha256: Optional[str]
    pending: Optional[Pending]
    due: bool
    nodes: Mapping[str, NodeStatus]

    @property
    def drifted(self) -> list[str]:
        """Machines not on the job's version."""
        return [n for n, s in self.nodes.items() if s.drift]

    @property
    def unknown(self) -> list[str]:
        """Machines whose releases are unknown (no answer, or the probe failed there)."""
        return [n for n, s in self.nodes.items() if s.state != "ok"]

    @property
    def exit_code(self) -> ExitCode:
        """4 when brctl refused a machine, 3 when machines did not answer, 1 on drift or a
        probe failure there, else 0."""
        return exit_code_of(
            refused=any(s.state == NodeState.REFUSED.value for s in self.nodes.values()),
            incomplete=any(s.state in _TRANSPORT_STATES for s in self.nodes.values()),
            findings=bool(self.drifted or self.unknown))

    def to_json(self) -> dict[str, object]:
        """JSON form."""
        return {"job": self.job, "version": self.version, "sha256": self.sha256,
                "pending": self.pending.to_json() if self.pending else None, "due": self.due,
                "drift": self.drifted, "unknown": self.unknown,
                "nodes": {n: s.to_json() for n, s in self.nodes.items()}}
