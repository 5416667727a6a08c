"""The diagnose decision: evict | reattempt | rollback | replay (ByteRobust's flow).

Pure: the playbook's rules, the machines whose evidence matched it, what the stages
found, and the job's earlier verdicts (from the state database) go in; the decision,
the machines to evict and the reason come out.

1. User-code failure (``on_match: rollback``) → rollback at once, never evict.
2. Confident hardware signal (``on_match: evict``) → evict the machines that show it.
3. A stage named faulty machines → evict them.
4. Nothing found: the same symptom right after a reattempt → rollback (the last
   code update); still failing after a rollback → replay (find silent corruption);
   else the playbook's ``on_clean`` (reattempt, or rollback for e.g. OOM).

"Nothing found" is only "clean" when the stages tested something: the reason says
which stages passed and which were skipped (and why), and when every stage was
skipped it says no stage could test anything, never that the machines are clean
(the operation then reports the machines as having no verdict: exit 3).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Union, get_args

from brctl.analysis.playbook import Classification
from brctl.core.nodeset import fold

DecisionName = Literal["evict", "reattempt", "rollback", "replay"]
DECISIONS: tuple[DecisionName, ...] = get_args(DecisionName)
Decision = Union[DecisionName, Literal["notify"]]  # diagnose's, and the daemon's own: tell a person
_DECISION_VALUES: tuple[Decision, ...] = (*DECISIONS, "notify")


def as_decision(value: object) -> Decision | None:
    """``value`` when it is a decision (read back from a database row), else None."""
    return next((d for d in _DECISION_VALUES if d == value), None)


@dataclass(frozen=True)
class PastConclusion:
    """An earlier diagnosis of the same job."""

    symptom: str  # the playbook name
    decision: Decision  # as recorded; next_rung reads it
    at: float  # seconds since the epoch


@dataclass(frozen=True)
class StageOutcome:
    """What one stage of the ladder managed to test (for the wording of the reason)."""

    name: str
    tested: tuple[str, ...] = ()  # machines it gave a verdict (pass, warn or fail)
    warned: tuple[str, ...] = ()  # machines it found not clean, but not faulty
    skip_reasons: tuple[str, ...] = ()  # distinct reasons it could not test machines


def nothing_tested(stages: Sequence[StageOutcome]) -> bool:
    """True when stages ran but none of them could test a single machine."""
    return bool(stages) and not any(s.tested for s in stages)


def describe_clean(stages: Sequence[StageOutcome]) -> str:
    """What "no faulty machine" rests on, e.g. ``alltoall passed; eud skipped (...)``."""
    if not stages:
        return "the playbook runs no stage: no machine was tested"
    if nothing_tested(stages):
        why = "; ".join(f"{s.name}: {', '.join(s.skip_reasons) or 'nothing to test'}"
                        for s in stages)
        return f"no stage could test anything ({why}): the machines are not known to be clean"
    if all(s.tested and not s.skip_reasons and not s.warned for s in stages):
        return "every stage passed"
    parts = []
    ran = [s for s in stages if s.tested]
    parts.append(f"{_names(ran)} passed" if ran else "")
    for s in ran:
        if s.warned:
            parts.append(f"{s.name} warned on {fold(s.warned)}")
        if s.skip_reasons:
            parts.append(f"{s.name} skipped some machines ({', '.join(s.skip_reasons)})")
    for s in stages:
        if not s.tested:
            parts.append(f"{s.name} skipped ({', '.join(s.skip_reasons) or 'nothing to test'})")
    return "; ".join(p for p in parts if p)


def _names(stages: Sequence[StageOutcome]) -> str:
    names = [s.name for s in stages]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


@dataclass(frozen=True)
class Conclusion:
    """The decision and why."""

    decision: DecisionName
    faulty: tuple[str, ...]
    reason: str


def next_rung(previous: str | None) -> DecisionName | None:
    """ByteRobust's escalation ladder, the one place it lives.

    The same failure again after a reattempt → roll the last code update back;
    after a rollback (or a replay) → replay, to find a machine with silent data
    corruption. None: nothing before it, the caller's default applies. Callers feed
    it what actually happened (a rollback that failed did not happen).
    """
    if previous == "reattempt":
        return "rollback"
    if previous in ("rollback", "replay"):
        return "replay"
    return None


def last_repeat(history: Sequence[PastConclusion], symptom: str, now: float,
                window: float) -> PastConclusion | None:
    """The most recent earlier verdict if it was for the same symptom within ``window`` s."""
    recent = [p for p in history if now - p.at <= window]
    if not recent:
        return None
    last = max(recent, key=lambda p: p.at)
    return last if last.symptom == symptom else None


def decide(
    found: Classification,
    stage_faulty: Sequence[str],
    history: Sequence[PastConclusion],
    *,
    now: float,
    window: float,
    faulty_stage: str | None = None,
    stages: Sequence[StageOutcome] = (),
) -> Conclusion:
    """Decide what to do with the job.

    Args:
        found: the classification (playbook and the machines whose evidence matched).
        stage_faulty: machines the ladder found faulty, in machine order.
        history: earlier verdicts of this job (any order).
        now: the current time (seconds since the epoch), given so this stays pure.
        window: how long an earlier verdict counts as "the same failure again".
        faulty_stage: the stage that found ``stage_faulty`` (for the reason).
        stages: what each stage that ran could test (the reason never calls skipped
            stages passed).
    """
    book = found.playbook
    first = f": {found.hits[0].text}" if found.hits else ""
    if book.decision.on_match == "rollback" and found.nodes:
        return Conclusion("rollback", (), f"{book.symptom} on {fold(found.nodes)}{first} — a bug in "
                       "the job's code or config, not a machine: roll back, evict nothing")
    if book.decision.on_match == "evict" and found.nodes:
        return Conclusion("evict", tuple(found.nodes), f"{book.symptom} on {fold(found.nodes)}"
                       f"{first} — a confident hardware signal")
    if stage_faulty:
        return Conclusion("evict", tuple(stage_faulty),
                       f"stage {faulty_stage or '?'} found {fold(stage_faulty)} faulty")
    clean = describe_clean(stages)
    last = last_repeat(history, book.name, now, window)
    rung = next_rung(last.decision if last is not None else None)
    if last is not None and rung == "rollback":
        return Conclusion("rollback", (), f"{book.symptom} again after a reattempt and {clean}: "
                       "roll back the last code update")
    if last is not None and rung == "replay":
        return Conclusion("replay", (), f"{book.symptom} still fails after a {last.decision} and "
                       f"{clean}: replay to find a machine with silent data corruption")
    if nothing_tested(stages) or not stages:
        # Untested is not clean: no stage result supports a cause, so take the
        # playbook's cheap default and say plainly that the machines were not checked.
        return Conclusion(book.decision.on_clean, (), f"{book.symptom}; {clean}. Nothing was found "
                       f"because nothing was tested: {book.decision.on_clean} on the evidence "
                       "alone, or make the stages runnable (dcgmi, torch) and diagnose again")
    if book.decision.on_clean == "rollback":
        return Conclusion("rollback", (), f"{book.symptom}, {clean}: the likeliest cause "
                       "is a code or configuration change, roll back")
    return Conclusion("reattempt", (), f"{book.symptom}, {clean}: likely transient, reattempt")
