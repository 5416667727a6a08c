"""The data behind ``brctl report`` (pure): ETTR over time, lost time by cause, what
happened and to which machines.

``incident_report`` takes what the state database holds, already typed (the ETTR
intervals, the event log as ``Record``s, the steps' start times, the quarantine
records, the job's machines) and returns one frozen ``IncidentReport``; the HTML
page and ``brctl ettr`` render it. Nothing here reads a clock or a file.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from brctl.analysis.ettr import Interval, ratio, totals, window_series
from brctl.analysis.report.lost_time import (
    CAUSES,
    INCIDENT_KINDS,
    Cause,
    Record,
    Segment,
    StepStart,
    attribute,
    lost_by_cause,
)

# Events a post-mortem reads; the rest (daemon start/stop, pool checks, resumes) is routine.
NOTABLE = INCIDENT_KINDS | {
    "analysis", "decision", "refused", "halted", "evict", "unevict", "lease_lost",
    "plan_done", "plan_failed", "plan_abandoned", "replay",
    *(f"action_{k}" for k in ("evict", "stop", "restore", "swap", "apply", "rollback",
                               "replay", "restart")),
}
TIMELINE_KEEP = 1000  # newest entries shown; the page says how many older ones it left out


@dataclass(frozen=True)
class Eviction:
    """A quarantine record, as the report shows it."""

    node: str
    at: float
    reason: str
    source: str  # daemon | hand
    operator: Optional[str]
    released: Optional[float]


@dataclass(frozen=True)
class Machine:
    """A machine the incidents touched, and what happened to it."""

    node: str
    roles: tuple[str, ...]  # evicted | released | swapped in | swapped out | in the job
    first: float
    last: float
    events: int
    eviction: Optional[Eviction]

    def to_json(self) -> dict[str, Any]:
        """``{roles, first, last, events, evicted_at, reason, released}`` (keyed by node)."""
        ev = self.eviction
        return {"roles": list(self.roles), "first": self.first, "last": self.last,
                "events": self.events, "evicted_at": ev.at if ev else None,
                "reason": ev.reason if ev else None, "released": ev.released if ev else None}


@dataclass(frozen=True)
class IncidentReport:
    """Everything ``brctl report`` draws, for one job over the recorded time."""

    job: str
    start: Optional[float]  # first observed second (None: nothing recorded)
    end: Optional[float]
    cumulative: Optional[float]
    productive_seconds: float
    observed_seconds: float
    window: float
    series: tuple[tuple[float, Optional[float]], ...]
    segments: tuple[Segment, ...]
    lost: Mapping[Cause, float]
    timeline: tuple[Record, ...]
    left_out: int  # older notable entries not in ``timeline``
    machines: tuple[Machine, ...]
    members: tuple[str, ...]

    @property
    def lost_seconds(self) -> float:
        """All lost time."""
        return sum(self.lost.values())

    @property
    def incidents(self) -> int:
        """Incidents detected in the timeline."""
        return sum(1 for r in self.timeline if r.kind in INCIDENT_KINDS)

    def to_json(self) -> dict[str, Any]:
        """The summary the ``brctl.report/1`` document carries."""
        return {"job": self.job, "start": self.start, "end": self.end,
                "cumulative": self.cumulative, "productive_seconds": self.productive_seconds,
                "observed_seconds": self.observed_seconds, "window_seconds": self.window,
                "lost_seconds": dict(self.lost), "incidents": self.incidents,
                "nodes": {m.node: m.to_json() for m in self.machines},
                "members": list(self.members)}


def record_of(event: Mapping[str, Any]) -> Record:
    """An event-log row (``{at, kind, nodes, detail}``) as a ``Record`` with its reason in words."""
    kind = str(event["kind"])
    detail = event.get("detail") or {}
    if not isinstance(detail, Mapping):
        detail = {}
    nodes = tuple(str(n) for n in (event.get("nodes") or []))
    return Record(float(event["at"]), kind, nodes, _reason(kind, detail),
                  str(detail.get("state") or "") if kind.startswith("action_") else "")


def _reason(kind: str, d: Mapping[str, Any]) -> str:
    if kind == "decision":
        plan = d.get("plan") or {}
        evict = f" {', '.join(map(str, plan.get('evict') or []))}" if plan.get("evict") else ""
        dry = " (dry run)" if d.get("dry_run") else ""
        return f"{plan.get('decision')}{evict}: {plan.get('reason')}{dry}"
    if kind == "analysis":
        return f"{d.get('decision') or 'nothing found'}: {d.get('reason') or ''}".rstrip(": ")
    if kind in ("evict", "unevict") and d.get("by") == "hand":
        said = d.get("reason") or d.get("was") or ""
        return f"by hand ({d.get('operator') or 'someone'}): {said}"
    if kind == "daemon_start":
        return f"members {', '.join(map(str, d.get('members') or []))}"
    return str(d.get("reason") or d.get("detail") or d.get("errors") or "")


def incident_report(job: str, intervals: Sequence[Interval], records: Sequence[Record],
                    steps: Iterable[StepStart], evictions: Iterable[Eviction],
                    members: Sequence[str], listed: Sequence[str], *, window: float,
                    points: int) -> IncidentReport:
    """The report of ``job``.

    Args:
        job: the job's name.
        intervals: its ETTR intervals (productive or not).
        records: its event log, oldest first.
        steps: when each plan step began (the causes of lost time).
        evictions: the quarantine records.
        members: the job's machines now; ``listed``: the inventory's (swaps are the difference).
        window: seconds of the sliding-window ETTR; ``points``: samples of it.
    """
    segments = attribute(intervals, records, steps)
    productive, observed = totals(intervals)
    start = min((iv.start for iv in intervals), default=None)
    end = max((iv.end for iv in intervals), default=None)
    notable = [r for r in records if r.kind in NOTABLE]
    timeline = tuple(notable[-TIMELINE_KEEP:])
    return IncidentReport(
        job, start, end, ratio(intervals), productive, observed, window,
        tuple(window_series(intervals, window=window, points=points)) if intervals else (),
        tuple(segments), lost_by_cause(segments), timeline, len(notable) - len(timeline),
        machines(notable, list(evictions), members, listed), tuple(members))


def machines(records: Sequence[Record], evictions: Sequence[Eviction], members: Sequence[str],
             listed: Sequence[str]) -> tuple[Machine, ...]:
    """Every machine an incident, step or eviction named, in order of first appearance."""
    now, was = set(members), set(listed)
    seen: dict[str, list[float]] = {}
    for r in records:
        for n in r.nodes:
            seen.setdefault(n, []).append(r.at)
    last_eviction = {e.node: e for e in sorted(evictions, key=lambda e: e.at)}
    for e in last_eviction.values():
        seen.setdefault(e.node, []).append(e.at)
    for n in (now ^ was):
        seen.setdefault(n, [])
    out = []
    for node, times in seen.items():
        ev = last_eviction.get(node)
        roles = [("evicted" if ev.released is None else "released")] if ev else []
        if node in now and node not in was:
            roles.append("swapped in")
        if node in was and node not in now:
            roles.append("swapped out")
        if node in now:
            roles.append("in the job")
        out.append(Machine(node, tuple(roles), min(times, default=0.0), max(times, default=0.0),
                           sum(1 for r in records if node in r.nodes), ev))
    out.sort(key=lambda m: (m.first == 0.0, m.first, m.node))
    return tuple(out)


__all__ = ["CAUSES", "Eviction", "IncidentReport", "Machine", "incident_report", "record_of"]
