"""Replay's judge: compare one round's fingerprints and name each group's status.

Pure functions on typed data (no I/O, no clock) for ``brctl replay``; the planner
and decoder that call it are in ``brctl/analysis/replay/groups.py``.

``judge_round`` compares the groups of one round with each other: per step the
strict majority of identical finite fingerprints, else a unique plurality of at
least two; later rounds run the very same replay job, so they compare with the
healthy fingerprints round 1 agreed on (a confirm round may hold one job, or two
faulty suspects that deviate alike). ``nan``/``inf`` is deviant on its own; a
group that errored or timed out is ``incomplete``, never SDC. With repeats, a
deviation seen in exactly one run is ``unconfirmed``.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Optional

Group = tuple[str, ...]  # a replay job's machines in slot (node rank) order
RoundKind = Literal["horizontal", "vertical", "confirm"]
GroupStatus = Literal["clean", "deviant", "unconfirmed", "undecided", "incomplete"]
NON_FINITE = ("nan", "inf")


@dataclass(frozen=True)
class GroupRun:
    """One group's outcome in one run of a round.

    Attributes:
        nodes: the group's machines in slot order.
        status: ok (fingerprints came back), error (a machine failed) or timeout.
        steps: per-step fingerprints (hex, or ``nan``/``inf``).
        error: why the group gave no fingerprints.
        seconds: wall time of the group.
        losses: per-step loss when the workload reports it (None: not finite, diverged).
    """

    nodes: Group
    status: Literal["ok", "error", "timeout"]
    steps: tuple[str, ...] = ()
    error: Optional[str] = None
    seconds: float = 0.0
    losses: tuple[Optional[float], ...] = ()


@dataclass(frozen=True)
class JudgedGroup:
    """A group's verdict over all runs of its round.

    Attributes:
        nodes: the machines, slot order.
        status: clean | deviant | unconfirmed (deviant in exactly one of ≥2 runs)
            | undecided (no majority to compare with) | incomplete (did not run).
        fingerprint: a short digest of the per-step fingerprints (``nan@3`` when
            step 3 was not finite), or None when it did not run.
        first_deviant_step: the first step that differed from the expected value.
        deviant_runs: in how many runs it deviated.
        runs: every run's raw outcome.
        suspects: the machines a confirm job tests (empty in rounds 1 and 2, and for a
            confirm round's control job of known-good machines only).
    """

    nodes: Group
    status: GroupStatus
    fingerprint: Optional[str]
    first_deviant_step: Optional[int]
    deviant_runs: int
    runs: tuple[GroupRun, ...]
    suspects: tuple[str, ...] = ()

    @property
    def suspect(self) -> Optional[str]:
        """The one machine a confirm job tests, when it tests exactly one."""
        return self.suspects[0] if len(self.suspects) == 1 else None

    @property
    def deviant(self) -> bool:
        """Confirmed deviant (the SDC signal)."""
        return self.status == "deviant"


@dataclass(frozen=True)
class JudgedRound:
    """One round, judged.

    Attributes:
        kind: horizontal (round 1), vertical (the grid's round 2) or confirm
            (suspects with known-good fillers).
        groups: the judged groups.
        expected: the healthy per-step fingerprints this round agreed on, if any.
    """

    kind: RoundKind
    groups: tuple[JudgedGroup, ...]
    expected: Optional[tuple[str, ...]]


def summarize(steps: Sequence[str]) -> str:
    """A short digest of a run's per-step fingerprints (``nan@STEP`` if one is not finite)."""
    for i, value in enumerate(steps):
        if value in NON_FINITE:
            return f"{value}@{i}"
    return hashlib.sha256("|".join(steps).encode()).hexdigest()[:12]


def _expected_at(values: Sequence[str], reference: Optional[str]) -> Optional[str]:
    if reference is not None:
        return reference  # same replay job, agreed by an earlier vote: beats a small round
    counts = Counter(v for v in values if v not in NON_FINITE)
    if not counts:
        return None
    (top, n), *rest = counts.most_common()
    if len(values) >= 2 and n * 2 > sum(counts.values()):
        return top  # a strict majority of the finite values (nan/inf is wrong on its own)
    if n >= 2 and (not rest or rest[0][1] < n):
        return top  # unique plurality: healthy groups agree, faulty ones rarely do
    return None


def expected_steps(
    runs: Sequence[GroupRun], reference: Optional[Sequence[str]]
) -> list[Optional[str]]:
    """The healthy value of each step among ``runs`` (None where nobody can tell).

    A group that already deviated stops voting: after a corruption its later
    values say nothing about the healthy ones.
    """
    voters = [r for r in runs if r.status == "ok"]
    n_steps = max((len(r.steps) for r in voters), default=0)
    out: list[Optional[str]] = []
    agreed = False  # an earlier step had a healthy value; the voters left are its holders
    for s in range(n_steps):
        ref = reference[s] if reference is not None and s < len(reference) else None
        values = [r.steps[s] if s < len(r.steps) else "missing" for r in voters]
        want = _expected_at(values, ref)
        if want is None and agreed and len(values) == 1 and values[0] not in NON_FINITE:
            # the others dropped out as proven deviant (NaN/inf or against the agreed
            # value): the one group still on the agreed path stays the healthy one
            want = values[0]
        out.append(want)
        if want is not None:
            agreed = True
            voters = [r for r, v in zip(voters, values) if v == want]
    return out


def _compare(run: GroupRun, expected: Sequence[Optional[str]]) -> tuple[str, Optional[int]]:
    """``deviant``/``clean``/``undecided`` and the first deviant step."""
    undecided = False
    for s, want in enumerate(expected):
        value = run.steps[s] if s < len(run.steps) else "missing"
        if value in NON_FINITE or (want is not None and value != want):
            return "deviant", s
        if want is None:
            undecided = True
    return ("undecided" if undecided else "clean"), None


def judge_round(
    kind: RoundKind,
    runs: Sequence[Sequence[GroupRun]],
    reference: Optional[Sequence[str]] = None,
    suspects: Optional[Sequence[Sequence[str]]] = None,
) -> JudgedRound:
    """Compare the groups of one round with each other, run by run.

    Args:
        kind: the round's kind.
        runs: ``runs[r][g]`` is group ``g`` in repetition ``r`` (same groups each time).
        reference: healthy per-step fingerprints from an earlier round of the same
            replay job; when given it is what every group must match.
        suspects: the machines each group tests (confirm rounds; empty: a control job).

    Returns:
        The judged round; ``expected`` is set when every step had a healthy value
        in the first run.
    """
    n_groups = len(runs[0]) if runs else 0
    per_rep = [expected_steps(rep, reference) for rep in runs]
    groups = []
    for g in range(n_groups):
        mine = tuple(rep[g] for rep in runs)
        if any(r.status != "ok" for r in mine):
            status: GroupStatus = "incomplete"
            groups.append(JudgedGroup(mine[0].nodes, status, None, None, 0, mine,
                                      tuple(suspects[g]) if suspects else ()))
            continue
        outcomes = [_compare(run, exp) for run, exp in zip(mine, per_rep)]
        deviant = [step for verdict, step in outcomes if verdict == "deviant" and step is not None]
        if deviant:
            status = "unconfirmed" if len(mine) >= 2 and len(deviant) == 1 else "deviant"
        elif any(verdict == "undecided" for verdict, _ in outcomes):
            status = "undecided"
        else:
            status = "clean"
        shown = next((run for run, (v, _) in zip(mine, outcomes) if v == "deviant"), mine[-1])
        groups.append(JudgedGroup(mine[0].nodes, status, summarize(shown.steps),
                                  min(deviant) if deviant else None, len(deviant), mine,
                                  tuple(suspects[g]) if suspects else ()))
    expected: Optional[tuple[str, ...]] = None
    if per_rep and per_rep[0] and all(v is not None for v in per_rep[0]):
        expected = tuple(v for v in per_rep[0] if v is not None)
    return JudgedRound(kind, tuple(groups), expected)
