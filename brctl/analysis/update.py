"""Hot-update planning: pure functions on what the machines hold and what the history says.

No I/O and no clock: the operations layer (``brctl.operations.update``) inspects
the machines, then asks this module what to send where (``plan_transfer``), who
is ready to switch (``plan_switch``), who drifted (``drift``), whether a lazy
update is due (``is_due``) and where a rollback goes (``rollback_target``).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from brctl.core.errors import UsageError

VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")
DEFAULT_WINDOW_S = 24 * 3600.0  # ByteRobust applies non-urgent changes within a day

Action = Literal["push", "apply", "rollback"]
Outcome = Literal["ok", "incomplete", "failed", "rolled_back", "refused", "noop"]


def check_version(version: str) -> str:
    """A release name safe as a directory name on every machine.

    Raises:
        UsageError: it is empty, too long, starts with a dot or dash, or has a slash/space.
    """
    if not VERSION_RE.match(version):
        raise UsageError(
            f"--version {version!r}: expected 1-128 characters of letters, digits and . _ + -, "
            "starting with a letter or digit")
    return version


@dataclass(frozen=True)
class NodeView:
    """What one machine holds under the update root (the ``inspect`` answer)."""

    current: Optional[str]
    releases: Mapping[str, str]  # version -> sha256 of each complete release
    partial: Mapping[str, int] = field(default_factory=dict)  # sha256 -> bytes received

    @classmethod
    def from_document(cls, doc: Mapping[str, Any]) -> NodeView:
        """Build from the probe's JSON (unknown or malformed parts become empty)."""
        releases = doc.get("releases") or {}
        partial = doc.get("partial") or {}
        current = doc.get("current")
        return cls(
            current=current if isinstance(current, str) else None,
            # a checksum that is no string is none (str() of deep nesting would recurse)
            releases={str(k): v for k, v in releases.items() if isinstance(v, str)}
            if isinstance(releases, dict) else {},
            # a hostile or broken node's byte count that is no integer is no resume point
            partial={str(k): v for k, v in partial.items()
                     if isinstance(v, int) and not isinstance(v, bool)}
            if isinstance(partial, dict) else {},
        )

    def has(self, version: str, sha256: str) -> bool:
        """The release is complete here with this checksum."""
        return self.releases.get(version) == sha256


@dataclass(frozen=True)
class TransferPlan:
    """Which machines get which bytes of the artifact."""

    skip: tuple[str, ...]  # already hold the verified release
    send: Mapping[str, int]  # machine -> resume offset (0: from the start)
    conflict: Mapping[str, str]  # machine -> why (same version, other checksum)
    unknown: tuple[str, ...]  # no answer: unreachable, timed out, probe failed


def plan_transfer(
    views: Mapping[str, Optional[NodeView]], version: str, sha256: str, size: int
) -> TransferPlan:
    """Decide per machine: skip, send (from a resume offset), refuse, or report unknown.

    A partial artifact of this checksum that is not longer than the artifact is
    resumed from its end; anything else starts from zero.
    """
    skip, unknown = [], []
    send: dict[str, int] = {}
    conflict: dict[str, str] = {}
    for name, view in views.items():
        if view is None:
            unknown.append(name)
        elif view.has(version, sha256):
            skip.append(name)
        elif version in view.releases:
            conflict[name] = (f"release {version} is already staged with sha256 "
                              f"{view.releases[version][:12]}; releases are immutable")
        else:
            have = view.partial.get(sha256, 0)
            send[name] = have if 0 <= have <= size else 0
    return TransferPlan(tuple(skip), send, conflict, tuple(unknown))


@dataclass(frozen=True)
class SwitchPlan:
    """Who is ready to switch to a version, who must be caught up first, who is unknown."""

    ready: tuple[str, ...]  # complete release present (switching is one rename)
    already: tuple[str, ...]  # current already points at it
    lagging: tuple[str, ...]  # reachable but missing the release: send it first
    unknown: tuple[str, ...]  # no answer: switching the others would mix versions


def plan_switch(views: Mapping[str, Optional[NodeView]], version: str, sha256: str) -> SwitchPlan:
    """Classify machines for an all-or-nothing switch to ``version``."""
    ready, already, lagging, unknown = [], [], [], []
    for name, view in views.items():
        if view is None:
            unknown.append(name)
        elif not view.has(version, sha256):
            lagging.append(name)
        elif view.current == version:
            already.append(name)
        else:
            ready.append(name)
    return SwitchPlan(tuple(ready), tuple(already), tuple(lagging), tuple(unknown))


def drift(currents: Mapping[str, Optional[str]], job_version: Optional[str]) -> list[str]:
    """Machines not on the job's version (or, with none recorded, not on the majority's).

    Args:
        currents: machine -> the version its ``current`` points at (None: no release).
        job_version: the version the job was last switched to, from the history.
    """
    if not currents:
        return []
    expected = job_version
    if expected is None:
        counts = Counter(v for v in currents.values() if v is not None)
        if not counts:
            return []
        top = counts.most_common()
        # A tie has no majority: everyone not on the alphabetically first winner drifts,
        # which is stable between runs rather than random.
        best = max(c for _, c in top)
        expected = min(v for v, c in top if c == best)
    return [name for name, cur in currents.items() if cur != expected]


@dataclass(frozen=True)
class Pending:
    """A pushed release waiting to be applied to the job."""

    version: str
    sha256: str
    since: float  # epoch seconds of the push
    window_s: float  # applied by the next `apply`, or when this much time has passed
    urgent: bool = False

    @property
    def due_at(self) -> float:
        """When the window expires (epoch seconds)."""
        return self.since + self.window_s

    def to_json(self) -> dict[str, object]:
        """JSON form."""
        return {"version": self.version, "sha256": self.sha256, "since": self.since,
                "window_s": self.window_s, "due_at": self.due_at, "urgent": self.urgent}


def is_due(pending: Optional[Pending], now: float) -> bool:
    """An urgent pending update is always due; a lazy one once its window has passed."""
    if pending is None:
        return False
    return pending.urgent or now >= pending.due_at


@dataclass(frozen=True)
class Event:
    """One row of the update history: every push, apply and rollback."""

    id: int
    at: float
    who: str
    action: Action
    version: str
    sha256: str
    from_version: Optional[str]
    machines: tuple[str, ...]
    outcome: Outcome
    detail: Mapping[str, Any] = field(default_factory=dict)

    @property
    def switched(self) -> bool:
        """This event moved the job to ``version``."""
        return self.action in ("apply", "push", "rollback") and self.outcome == "ok" and bool(
            self.detail.get("switched"))

    def to_json(self) -> dict[str, object]:
        """JSON form (``machines`` as a list)."""
        return {"id": self.id, "at": self.at, "who": self.who, "action": self.action,
                "version": self.version, "sha256": self.sha256,
                "from_version": self.from_version, "machines": list(self.machines),
                "outcome": self.outcome, "detail": dict(self.detail)}


def rollback_target(events: Sequence[Event], current: Optional[str]) -> Optional[str]:
    """The version to roll back to: undo the forward update that brought the job to ``current``.

    Rollbacks are skipped when looking for that update, so two rollbacks in a row
    walk back two updates (v3 → v2 → v1) instead of bouncing between two versions.
    """
    if current is None:
        return None
    for event in reversed(events):
        if event.switched and event.action != "rollback" and event.version == current:
            return event.from_version
    return None


def retained(pushed: Sequence[str], keep: int, protect: Sequence[Optional[str]]) -> set[str]:
    """The releases to keep: the ``keep`` most recently pushed, plus every protected one.

    Args:
        pushed: versions in push order, oldest first.
        keep: how many recent releases to keep.
        protect: the job's version, the one before it (a rollback target, and what a
            lazily updated job may still run), the pending one; None entries are ignored.
    """
    recent = list(pushed)[-keep:] if keep > 0 else []
    return set(recent) | {v for v in protect if v is not None}
