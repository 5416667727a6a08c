"""Dual-phase replay: plan the replay groups, decide what next from the judged rounds.

Pure functions on typed data (no I/O, no clock) for ``brctl replay``:

* ``shape_of`` (in ``brctl/analysis/replay/shape.py``) finds the machines' *roles*:
  the model-parallel positions (tp, cp, pp) each machine hosts; any ``k`` machines
  of every role form a complete smaller job that keeps each machine on its stage.
* ``plan`` builds round 1 ("horizontal": disjoint complete jobs, consecutive DP
  rows) and, when the shape allows it, round 2 ("vertical": every group meets
  every round-1 group in at most one machine and is still a complete job) with a
  cyclic Latin layout: the machine at slot ``p`` of round-1 group ``i`` goes to
  round-2 group ``(i + p) mod g``. That needs ``g >= slots per job``; otherwise
  round 2 is adaptive (one suspect plus known-good machines per job).
* the judging of each round's fingerprints (``judge_round``) is in
  ``brctl/analysis/replay/judge.py``.
* ``decide`` turns the judged rounds so far into the next round to run or a
  verdict: candidates are the machines of deviant groups that no clean group
  clears; a candidate alone in some deviant group is definite; the rest are
  replayed one per job with known-good fillers (the third round of the two-fault
  case), as many per round as the known-good machines can staff.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Literal, Optional, Union

from brctl.analysis.replay.judge import (
    NON_FINITE,
    Group,
    GroupRun,
    JudgedRound,
    RoundKind,
    judge_round,
    summarize,
)
from brctl.analysis.replay.shape import MIN_VOTERS, ReplayShape
from brctl.analysis.replay.shape import shape_of as shape_of  # re-exported: plan(shape_of(...))

VerdictName = Literal["found", "none", "ambiguous", "not_reproduced", "incomplete"]


@dataclass(frozen=True)
class ReplayPlan:
    """The groups of round 1 and (when a grid exists) of round 2.

    Attributes:
        shape: roles and the replay job.
        round1: disjoint horizontal groups covering every machine.
        round2: vertical groups meeting each round-1 group in at most one machine,
            or None when round 2 must be adaptive.
    """

    shape: ReplayShape
    round1: tuple[Group, ...]
    round2: Optional[tuple[Group, ...]]

    @property
    def can_vote(self) -> bool:
        """Round 1 has enough groups for a majority."""
        return len(self.round1) >= MIN_VOTERS

    @property
    def grid(self) -> bool:
        """Round 2 is fixed in advance (a grid); else it is adaptive."""
        return self.round2 is not None

    @property
    def thin(self) -> bool:
        """Round 1 votes with exactly three groups: a 2-1 majority may be two faults alike."""
        return len(self.round1) == MIN_VOTERS

    def rounds_single_fault(self, wrong: str = "bad") -> Optional[int]:
        """The most rounds one faulty machine takes to be named (None: it cannot be).

        ``wrong`` is what the fault makes of a step: a finite value, or ``nan``.
        Only 3 machines that each hold the whole model never name a finite fault: the
        two others corrupting alike would give the very same fingerprints (the verdict
        says so); NaN is wrong on its own and is named.
        """
        return self._fault_bounds[wrong]

    @cached_property
    def _fault_bounds(self) -> dict[str, Optional[int]]:
        """Found by running the decoder itself against every position of one round-1
        group (the groups are alike): 1 for one-machine jobs, 2 with a grid, at
        most 1 + ceil(log_g S) when confirm jobs split S suspects g ways; with only
        three groups 3 with a grid, 2 + ceil(log2 S) without (the documented bound,
        held by tests/unit/test_replay_plan.py for every shape up to 64 machines)."""
        out: dict[str, Optional[int]] = {}
        for wrong in ("bad", "nan"):
            worst: Optional[int] = 0 if self.can_vote else None
            for bad in self.round1[0] if self.can_vote else ():
                verdict, rounds = _simulate(self, bad, wrong)
                if verdict.verdict != "found":
                    worst = None
                    break
                worst = max(worst or 0, rounds)
            out[wrong] = worst
        return out

    def default_max_rounds(self) -> int:
        """What ``--max-rounds`` defaults to: the single-fault bound, plus two for a second fault."""
        return (self.rounds_single_fault() or self.rounds_single_fault("nan") or 1) + 2


def _simulate(plan_: ReplayPlan, bad: str, wrong: str = "bad") -> tuple[Verdict, int]:
    """Decode one fault in ``bad`` with a model workload (groups holding it deviate)."""
    rounds: list[JudgedRound] = []
    while True:
        decision = decide(plan_, rounds, max_rounds=4 * len(plan_.shape.machines))
        if isinstance(decision, Verdict):
            return decision, len(rounds)
        runs = [GroupRun(g, "ok", ("ok", wrong if bad in g else "ok")) for g in decision.groups]
        rounds.append(judge_round(decision.kind, [runs], reference_of(rounds), decision.suspects))


def plan(shape: ReplayShape) -> ReplayPlan:
    """Round 1 (consecutive DP rows) and the cyclic round-2 grid when ``g >= slots``."""
    g, k = shape.n_groups, shape.k
    round1: list[Group] = []
    for i in range(g):
        taken = [0] * len(shape.classes)
        members = []
        for cls in shape.slot_classes:
            members.append(shape.classes[cls][i * k + taken[cls]])
            taken[cls] += 1
        round1.append(tuple(members))
    round2: Optional[tuple[Group, ...]] = None
    if g >= shape.slots >= 2:
        # Slot p of V_j comes from round-1 group (j - p) mod g: one machine per H
        # group (slots < g keeps them distinct), and slot p keeps its role.
        round2 = tuple(tuple(round1[(j - p) % g][p] for p in range(shape.slots))
                       for j in range(g))
    return ReplayPlan(shape, tuple(round1), round2)


# -- deciding --------------------------------------------------------------------------

@dataclass(frozen=True)
class RoundSpec:
    """The next round to run.

    Attributes:
        kind: horizontal | vertical | confirm.
        groups: the replay jobs, each in slot order.
        suspects: for confirm rounds, the machines each job tests (empty: a control job
            of known-good machines only, checking the reference itself).
    """

    kind: RoundKind
    groups: tuple[Group, ...]
    suspects: tuple[tuple[str, ...], ...] = ()


@dataclass(frozen=True)
class Verdict:
    """The replay's answer.

    Attributes:
        verdict: found | none | ambiguous | not_reproduced | incomplete.
        faulty: machines proven to corrupt data.
        candidates: machines still suspected but not resolved.
        cleared: suspects (members of deviant groups) that clean replays cleared.
        reason: one sentence for the operator.
    """

    verdict: VerdictName
    faulty: tuple[str, ...]
    candidates: tuple[str, ...]
    cleared: tuple[str, ...]
    reason: str


NextStep = Union[RoundSpec, Verdict]


def split_jobs(
    shape: ReplayShape, suspects: Sequence[str], good: Sequence[str],
    stand_ins: Optional[Sequence[str]] = None,
) -> tuple[list[tuple[tuple[str, ...], Group]], list[str]]:
    """Spread suspects over as many confirm jobs as known-good fillers can staff.

    Group testing: each job carries several suspects (at most its slots of each
    role) and known-good machines in the other slots; the job that deviates
    holds the fault, so g jobs cut S suspects to S/g per round (about
    1 + ceil(log_g S) rounds in all), and one suspect per job names it.

    Args:
        shape: the replay job's roles.
        suspects: machines to test, in order of preference.
        good: machines known to be healthy, in order of preference.
        stand_ins: when given, also staff a control job (returned with no suspects):
            the first job with each suspect swapped for one of these machines of its
            role (they must be among ``good``); it must match the reference, or the
            reference is wrong. No control job when a suspect's role has none.

    Returns:
        ``([(its suspects, group)], suspects left for a later round)``.
    """
    class_of = shape.class_of()
    cap = Counter(shape.slot_classes)
    pool: dict[int, list[str]] = {c: [] for c in range(len(shape.classes))}
    for m in good:
        pool[class_of[m]].append(m)
    jobs: list[tuple[tuple[str, ...], Group]] = []
    spare: dict[int, list[str]] = {c: [] for c in pool}
    for m in stand_ins or ():  # kept out of the fillers: the control job needs them
        if m in pool[class_of[m]]:
            pool[class_of[m]].remove(m)
            spare[class_of[m]].append(m)
    by_role = Counter(class_of[m] for m in suspects)
    # J jobs use J·cap slots of each role: suspects of that role plus fillers
    n_jobs = min([len(suspects)] + [(len(pool[c]) + by_role[c]) // n for c, n in cap.items()])
    if n_jobs < 1:
        return jobs, list(suspects)
    placed: list[list[str]] = [[] for _ in range(n_jobs)]
    used: list[Counter[int]] = [Counter() for _ in range(n_jobs)]
    left: list[str] = []
    for m in sorted(suspects, key=lambda x: class_of[x]):  # stable: preference kept per role
        c = class_of[m]
        open_jobs = [j for j in range(n_jobs) if used[j][c] < cap[c]]
        if not open_jobs:
            left.append(m)
            continue
        j = min(open_jobs, key=lambda j: (len(placed[j]), j))
        placed[j].append(m)
        used[j][c] += 1
    for mine, counts in zip(placed, used):
        need = {c: n - counts[c] for c, n in cap.items()}
        if not mine or any(len(pool[c]) < n for c, n in need.items()):
            left.extend(mine)
            continue
        fill = {c: [pool[c].pop(0) for _ in range(n)] for c, n in need.items()}
        own = {c: [m for m in mine if class_of[m] == c] for c in cap}
        group = tuple((own[c] or fill[c]).pop(0) for c in shape.slot_classes)
        jobs.append((tuple(sorted(mine, key=suspects.index)), group))
    if stand_ins is not None and jobs and all(
            len(spare[c]) >= n for c, n in Counter(class_of[m] for m in jobs[0][0]).items()):
        # the first job again with its suspects swapped for stand-ins: the two differ
        # only there, so only a suspect can make one deviate and not the other
        first, group = jobs[0]
        swap = {m: spare[class_of[m]].pop(0) for m in first}
        jobs.append(((), tuple(swap.get(m, m) for m in group)))
    return jobs, sorted(left, key=suspects.index)


def _ordered(names: set[str], order: Mapping[str, int]) -> tuple[str, ...]:
    return tuple(sorted(names, key=lambda n: order.get(n, len(order))))


def decide(plan_: ReplayPlan, rounds: Sequence[JudgedRound], *,
           max_rounds: Optional[int] = None) -> NextStep:
    """The next round to run, or the verdict, from the rounds judged so far.

    Args:
        plan_: the replay plan.
        rounds: every round run so far, judged, in order.
        max_rounds: stop with ``ambiguous`` rather than run more rounds than this
            (None: ``plan_.default_max_rounds()``, what the shape needs).

    Returns:
        A ``RoundSpec`` to run next, or the ``Verdict``.
    """
    if not rounds:
        return RoundSpec("horizontal", plan_.round1)
    if max_rounds is None:
        max_rounds = plan_.default_max_rounds()
    order = {m: i for i, m in enumerate(plan_.shape.machines)}
    groups = [g for rnd in rounds for g in rnd.groups]
    clean = {m for g in groups if g.status == "clean" for m in g.nodes}
    deviant = [g for g in groups if g.deviant]
    flagged = {m for g in groups if g.status in ("deviant", "unconfirmed") for m in g.nodes}
    cleared = _ordered(flagged & clean, order)
    last = rounds[-1]
    stuck = [g for g in last.groups if g.status == "incomplete"]
    if stuck:
        where = "; ".join(",".join(g.nodes) for g in stuck)
        suspects = _ordered({m for g in deviant for m in g.nodes} - clean, order)
        return Verdict("incomplete", (), suspects, cleared,
                       f"{len(stuck)} replay group(s) did not finish ({where}): no verdict on them")
    undecided = [g for g in last.groups if g.status == "undecided"]
    if undecided:
        suspects = _ordered({m for g in undecided for m in g.nodes} - clean, order)
        return Verdict("ambiguous", (), suspects, cleared,
                       "replay groups disagree and no majority says which is right "
                       f"({len(last.groups)} groups; a vote needs {MIN_VOTERS} or more)")
    control = [g for rnd in rounds if rnd.kind == "confirm" for g in rnd.groups
               if not g.suspects and g.status in ("deviant", "unconfirmed")]
    if control:
        tested = {m for g in deviant if g.suspects for m in g.suspects}
        return Verdict("ambiguous", (), _ordered(tested - clean, order), cleared,
                       "a control job of machines the vote called healthy deviated: the "
                       f"{len(plan_.round1)}-group majority itself may be wrong (two machines "
                       "corrupting alike)")
    if not deviant:
        unconfirmed = _ordered(flagged - clean, order)
        if flagged:
            return Verdict("not_reproduced", (), unconfirmed, cleared,
                           "a deviation was seen once and did not reproduce: intermittent "
                           "corruption is possible, the machines are not proven healthy")
        return Verdict("none", (), (), (), "every replay group produced identical fingerprints")
    candidates = {m for g in deviant for m in g.nodes} - clean
    if not candidates:
        return Verdict("not_reproduced", (), _ordered(flagged - clean, order), cleared,
                       "deviant groups were not confirmed by later rounds: every member "
                       "replayed cleanly elsewhere (intermittent corruption?)")
    definite = {next(iter(c)) for g in deviant if len(c := set(g.nodes) & candidates) == 1}
    open_ = candidates - definite
    misled = plan_.thin and not _self_evident(rounds[0])  # a 2-1 vote may be 2 faults alike
    if not open_ and (not misled or _settled(plan_.shape, rounds, definite)):
        return Verdict("found", _ordered(definite, order), (), cleared,
                       f"the deviant groups meet in {len(definite)} machine(s)")
    if len(rounds) == 1 and plan_.round2 is not None:
        return RoundSpec("vertical", plan_.round2)
    # With three groups a 2-1 vote may be two machines corrupting alike, one in each
    # group of the majority: then the "clean" machines include both and only the
    # round-1 deviant group is surely healthy. Every confirm round runs a control job
    # whose stand-ins come from that group, and a lone intersection is confirmed by it.
    stand_ins = ([m for g in rounds[0].groups if g.deviant for m in g.nodes if m in clean]
                 if misled else None)
    test = open_ or definite
    jobs, _left = split_jobs(plan_.shape, _ordered(test, order), _ordered(clean, order),
                             _ordered(set(stand_ins), order) if stand_ins is not None else None)
    if misled and not open_ and len(jobs) < 2:
        others = _ordered(_same_role(plan_.shape, definite) - definite, order)
        return _control_round(plan_, rounds, definite, max_rounds) or Verdict(
            "ambiguous", (), _ordered(definite, order) + others, cleared,
            f"{', '.join(_ordered(definite, order))} deviates alone, but with "
            f"{len(plan_.round1)} groups {', '.join(others) or 'other machines'} "
            "corrupting alike would give the very same fingerprints in every replay job, "
            "and no machine is known healthy either way to tell them apart (more machines "
            "per position, or a larger --dp, can)")
    if not any(sus for sus, _ in jobs) or len(rounds) >= max_rounds \
            or reference_of(rounds) is None:
        why = ("not enough known-good machines to replay a suspect" if not jobs
               else f"the round limit ({max_rounds}) was reached" if len(rounds) >= max_rounds
               else "no round agreed on a healthy fingerprint to compare with")
        if not open_:
            return Verdict("ambiguous", (), _ordered(definite, order), cleared,
                           f"the deviant groups meet in {len(definite)} machine(s), but with "
                           f"{len(plan_.round1)} groups that needs confirming: {why}")
        return Verdict("ambiguous", _ordered(definite, order), _ordered(open_, order), cleared,
                       f"{len(open_)} candidate(s) could not be told apart: {why}")
    return RoundSpec("confirm", tuple(g for _, g in jobs), tuple(s for s, _ in jobs))


def _self_evident(first: JudgedRound) -> bool:
    """Every deviant group of round 1 went NaN/inf: wrong on its own, whatever the vote said."""
    return all((g.fingerprint or "").split("@")[0] in NON_FINITE for g in first.groups if g.deviant)


def _same_role(shape: ReplayShape, machines: set[str]) -> set[str]:
    """The machines that share a role with any of ``machines``."""
    class_of = shape.class_of()
    roles = {class_of[m] for m in machines}
    return {m for m in shape.machines if class_of[m] in roles}


def _settled(shape: ReplayShape, rounds: Sequence[JudgedRound], definite: set[str]) -> bool:
    """A 2-1 vote's lone candidates are found: each confirmed beside its control job, or
    one machine and no other reading of the rounds (one fault elsewhere, two alike)."""
    return _confirmed(definite, rounds) or (
        len(definite) == 1 and not _alternatives(shape, rounds, next(iter(definite))))


def _control_round(plan_: ReplayPlan, rounds: Sequence[JudgedRound], definite: set[str],
                   max_rounds: int) -> Optional[RoundSpec]:
    """A control job alone in its round, when no machine of the one suspect's role is
    healthy under every reading the rounds allow (it alone, or two others corrupting
    alike, e.g. its role-mates): staffed by machines no such reading touches, one of
    another role with as many positions in the suspect's slot. Clean, it rules every
    other reading out. None when there is more than one suspect, no round left, no such
    staff, or a reading with the same healthy fingerprint (a control could not tell it
    apart)."""
    if len(definite) != 1 or len(rounds) >= max_rounds:
        return None
    x = next(iter(definite))
    others = _alternatives(plan_.shape, rounds, x)
    reference = reference_of(rounds)
    if reference is None or any(f == summarize(reference) for _, f in others):
        return None
    control = _staff(plan_.shape, [m for m in plan_.shape.machines
                                   if m != x and not any(m in h for h, _ in others)])
    return None if control is None else RoundSpec("confirm", (control,), ((),))


def _staff(shape: ReplayShape, machines: Sequence[str]) -> Optional[Group]:
    """A complete replay job of ``machines`` (each once): a slot takes a machine of its own
    role, else one of another role hosting as many positions (the workload gives a machine
    its slot's ranks, whatever it ran in the job). None when they cannot fill it."""
    class_of = shape.class_of()
    pool = {c: [m for m in machines if class_of[m] == c] for c in range(len(shape.classes))}
    group: list[Optional[str]] = [pool[c].pop(0) if pool[c] else None
                                  for c in shape.slot_classes]
    for slot, c in enumerate(shape.slot_classes):
        if group[slot] is None:
            alike = [d for d in pool if pool[d] and len(shape.roles[d]) == len(shape.roles[c])]
            if not alike:
                return None
            group[slot] = pool[alike[0]].pop(0)
    return tuple(m for m in group if m is not None)


def _alternatives(shape: ReplayShape, rounds: Sequence[JudgedRound], x: str
                  ) -> list[tuple[frozenset[str], str]]:
    """Every other reading of the rounds: one machine, or two corrupting alike, none of
    them ``x``, under which each job without them gave one same finite fingerprint and
    each job with one of them another. With their healthy fingerprints.

    Groups are bitmasks: a reading is checked in a few integer operations, so all pairs
    of a few hundred machines cost milliseconds."""
    seen = [g for rnd in rounds for g in rnd.groups
            if g.status in ("clean", "deviant") and g.fingerprint is not None]
    member: dict[str, int] = {}
    by_print: dict[str, int] = {}
    for i, g in enumerate(seen):
        for m in g.nodes:
            member[m] = member.get(m, 0) | 1 << i
        assert g.fingerprint is not None
        by_print[g.fingerprint] = by_print.get(g.fingerprint, 0) | 1 << i
    every = (1 << len(seen)) - 1
    finite = [(f, bits) for f, bits in by_print.items() if f.split("@")[0] not in NON_FINITE]
    names = [m for m in shape.machines if m != x]

    def healthy(hit: int) -> Optional[str]:
        rest = every & ~hit
        if not rest:  # no job ran without them: their healthy value was never seen
            return "?"
        return next((f for f, bits in finite if rest & ~bits == 0 and not hit & bits), None)

    out: list[tuple[frozenset[str], str]] = []
    for i, a in enumerate(names):
        for b in [None, *names[i + 1:]]:
            hit = member.get(a, 0) | (member.get(b, 0) if b is not None else 0)
            if (f := healthy(hit)) is not None:
                out.append((frozenset({a} if b is None else {a, b}), f))
    return out


def _confirmed(machines: set[str], rounds: Sequence[JudgedRound]) -> bool:
    """Each machine deviated alone among known-good ones, and its own job without it (the
    control job: one new known-good machine in, that one out, the rest its job's own
    machines) was clean."""
    def swapped(job: Group, control: Group, m: str) -> bool:
        return len(job) == len(control) and m not in control \
            and len(set(control) - set(job)) == 1

    def alone(m: str) -> bool:
        return any(rnd.kind == "confirm" and g.suspects == (m,) and g.deviant
                   and any(not h.suspects and h.status == "clean" and swapped(g.nodes, h.nodes, m)
                           for h in rnd.groups)
                   for rnd in rounds for g in rnd.groups)
    return all(alone(m) for m in machines)


def reference_of(rounds: Sequence[JudgedRound]) -> Optional[tuple[str, ...]]:
    """The healthy fingerprints agreed on by the earliest round that had a full majority."""
    for rnd in rounds:
        if rnd.expected is not None:
            return rnd.expected
    return None
