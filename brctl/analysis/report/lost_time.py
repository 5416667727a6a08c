"""Where the job's time went: productive, or lost to a cause (pure).

The daemon records each poll interval as productive or not (``ettr_intervals``)
and every incident, decision and step in its event log. ``attribute`` lays the
two side by side and names the cause of every unproductive second by what the
daemon was doing at that moment:

- ``detection``: the job stopped making progress and nothing had been detected
  yet (the stall timeout, the poll interval, a crash not yet seen);
- ``diagnosis``: an incident was detected and the analysis (diagnose, stacks)
  was deciding what to do;
- ``standby``: machines were being replaced: evicted, a standby's checkpoint
  restored, the swap recorded, or a plan refused for want of a checked standby;
- ``restart``: the job was stopped, its code switched or rolled back, restarted,
  and until its first new step;
- ``replay``: the replay hunted for silent data corruption;
- ``human``: the daemon paged and waited (a refused, failed or abandoned plan,
  a halted daemon).

Time the daemon did not watch is in no interval, so it is not counted either way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Optional

from brctl.analysis.ettr import Interval

Cause = Literal["detection", "diagnosis", "standby", "restart", "replay", "human"]
CAUSES: tuple[Cause, ...] = ("detection", "diagnosis", "standby", "restart", "replay", "human")
CAUSE_TEXT: Mapping[Cause, str] = {
    "detection": "detection (stopped, not yet detected)",
    "diagnosis": "diagnosis (deciding what to do)",
    "standby": "standby (evicting, swapping a standby in)",
    "restart": "restart (stop, code switch, relaunch)",
    "replay": "replay (hunting silent data corruption)",
    "human": "waiting for a human (refused, failed, halted)",
}
INCIDENT_KINDS = frozenset({"gpu_fault", "hand_evict", "crash", "hang", "fail_slow"})
# The refusal the daemon writes when no checked standby can replace an evicted machine.
NO_STANDBY = "no checked standby"
_STEP_CAUSE: Mapping[str, Cause] = {
    "evict": "standby", "restore": "standby", "swap": "standby",
    "stop": "restart", "apply": "restart", "rollback": "restart", "restart": "restart",
    "replay": "replay",
}


@dataclass(frozen=True)
class Record:
    """One entry of the daemon's event log: ``at``, ``kind``, the machines, the reason."""

    at: float
    kind: str
    nodes: tuple[str, ...] = ()
    reason: str = ""
    state: str = ""  # an action's outcome (done, failed, …); "" for other events


@dataclass(frozen=True)
class StepStart:
    """One step of a plan as the action log holds it: its kind and when it began."""

    kind: str
    start: float


@dataclass(frozen=True)
class Segment:
    """``[start, end)``: productive time (``cause`` None) or time lost to ``cause``."""

    start: float
    end: float
    cause: Optional[Cause]

    @property
    def seconds(self) -> float:
        """Its length."""
        return self.end - self.start


def cause_of_record(record: Record) -> Optional[Cause]:
    """The cause an event starts (None: it changes nothing)."""
    if record.kind in INCIDENT_KINDS:
        return "diagnosis"
    if record.kind == "refused":
        return "standby" if record.reason.startswith(NO_STANDBY) else "human"
    if record.kind in ("halted", "plan_failed", "plan_abandoned", "lease_lost"):
        return "human"
    if record.kind == "daemon_start":
        return "detection"
    return None


def changes(records: Iterable[Record], steps: Iterable[StepStart]) -> list[tuple[float, Cause]]:
    """The moments the cause of lost time changes, in time order.

    A step's cause holds from its start until the next change; a restart's holds
    until the job's next productive interval (``attribute`` resets it there).
    """
    points = [(r.at, c) for r in records if (c := cause_of_record(r)) is not None]
    points += [(s.start, _STEP_CAUSE[s.kind]) for s in steps if s.kind in _STEP_CAUSE]
    return sorted(points, key=lambda p: p[0])


def attribute(intervals: Sequence[Interval], records: Iterable[Record],
              steps: Iterable[StepStart]) -> list[Segment]:
    """Every observed second, productive or lost to a cause, as ordered segments.

    The cause is a step function of time: it starts as ``detection``, each
    change (``changes``) sets it, and a productive interval resets it to
    ``detection`` (the next loss begins undetected).
    """
    marks = changes(records, steps)
    out: list[Segment] = []
    cause: Cause = "detection"
    i = 0
    for iv in sorted(intervals, key=lambda v: v.start):
        if iv.end <= iv.start:
            continue
        while i < len(marks) and marks[i][0] <= iv.start:
            cause = marks[i][1]
            i += 1
        if iv.productive:
            _append(out, Segment(iv.start, iv.end, None))
            while i < len(marks) and marks[i][0] < iv.end:
                i += 1  # what the daemon did while the job trained cost nothing
            cause = "detection"
            continue
        at = iv.start
        while i < len(marks) and marks[i][0] < iv.end:
            _append(out, Segment(at, marks[i][0], cause))
            at, cause = max(at, marks[i][0]), marks[i][1]
            i += 1
        _append(out, Segment(at, iv.end, cause))
    return out


def _append(out: list[Segment], seg: Segment) -> None:
    """Add ``seg``, merged into the last one when it continues it with the same cause."""
    if seg.end <= seg.start:
        return
    if out and out[-1].cause == seg.cause and abs(out[-1].end - seg.start) < 1e-6:
        out[-1] = Segment(out[-1].start, seg.end, seg.cause)
        return
    out.append(seg)


def lost_by_cause(segments: Iterable[Segment]) -> dict[Cause, float]:
    """Seconds lost per cause (every cause present, in ``CAUSES`` order)."""
    lost = dict.fromkeys(CAUSES, 0.0)
    for seg in segments:
        if seg.cause is not None:
            lost[seg.cause] += seg.seconds
    return lost
