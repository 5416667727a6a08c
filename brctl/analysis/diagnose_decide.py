"""The diagnose decision: evict | reattempt | rollback | replay (ByteRobust's flow).

Pure: the playbook's rules, the machines whose evidence matched it, what the stages
found, and the job's earlier verdicts (from the state database) go in; the decision,
the machines to evict and the reason come out.

1. User-code failure (``on_match: rollback``) → rollback at once, never evict.
2. Confident hardware signal (``on_match: evict``) → evict the machines that show it.
3. A stage named faulty machines → evict them.
4. Everything passed: the same symptom right after a reattempt → rollback (the last
   code update); still failing after a rollback → replay (find silent corruption);
   else the playbook's ``on_clean`` (reattempt, or rollback for e.g. OOM).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from brctl.analysis.nodeset import fold
from brctl.analysis.playbook import Classification

DecisionName = Literal["evict", "reattempt", "rollback", "replay"]
DECISIONS = ("evict", "reattempt", "rollback", "replay")


@dataclass(frozen=True)
class PastVerdict:
    """An earlier diagnosis of the same job."""

    symptom: str  # the playbook name
    decision: str
    at: float  # seconds since the epoch


@dataclass(frozen=True)
class Verdict:
    """The decision and why."""

    decision: DecisionName
    faulty: tuple[str, ...]
    reason: str


def last_repeat(history: Sequence[PastVerdict], symptom: str, now: float,
                window: float) -> PastVerdict | None:
    """The most recent earlier verdict if it was for the same symptom within ``window`` s."""
    recent = [p for p in history if now - p.at <= window]
    if not recent:
        return None
    last = max(recent, key=lambda p: p.at)
    return last if last.symptom == symptom else None


def decide(
    found: Classification,
    stage_faulty: Sequence[str],
    history: Sequence[PastVerdict],
    *,
    now: float,
    window: float,
    faulty_stage: str | None = None,
) -> Verdict:
    """Decide what to do with the job.

    Args:
        found: the classification (playbook and the machines whose evidence matched).
        stage_faulty: machines the ladder found faulty, in machine order.
        history: earlier verdicts of this job (any order).
        now: the current time (seconds since the epoch), given so this stays pure.
        window: how long an earlier verdict counts as "the same failure again".
        faulty_stage: the stage that found ``stage_faulty`` (for the reason).
    """
    book = found.playbook
    first = f": {found.hits[0].text}" if found.hits else ""
    if book.decision.on_match == "rollback" and found.nodes:
        return Verdict("rollback", (), f"{book.symptom} on {fold(found.nodes)}{first} — a bug in "
                       "the job's code or config, not a machine: roll back, evict nothing")
    if book.decision.on_match == "evict" and found.nodes:
        return Verdict("evict", tuple(found.nodes), f"{book.symptom} on {fold(found.nodes)}"
                       f"{first} — a confident hardware signal")
    if stage_faulty:
        return Verdict("evict", tuple(stage_faulty),
                       f"stage {faulty_stage or '?'} found {fold(stage_faulty)} faulty")
    last = last_repeat(history, book.name, now, window)
    if last is not None and last.decision == "reattempt":
        return Verdict("rollback", (), f"{book.symptom} again after a reattempt and every stage "
                       "passed: roll back the last code update")
    if last is not None and last.decision in ("rollback", "replay"):
        return Verdict("replay", (), f"{book.symptom} still fails after a {last.decision} and "
                       "every stage passed: replay to find a machine with silent data corruption")
    if book.decision.on_clean == "rollback":
        return Verdict("rollback", (), f"{book.symptom}, every stage passed: the likeliest cause "
                       "is a code or configuration change, roll back")
    return Verdict("reattempt", (), f"{book.symptom}, every stage passed: likely transient, "
                   "reattempt")
