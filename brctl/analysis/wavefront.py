"""The collective wavefront: which group is stuck, who never joined, who waits on whom.

Pure functions on the decoded recorder records (``collectives.RankRecord``), one
mapping rank → record per capture. Per process-group instance (matched across
ranks by name: ``pg_id`` is per process):

- **Members** come from the job's table or ``pg_config`` (a rank's record
  carries them), else from any other member's record (names are job-wide),
  else from the inventory's layout: the kind named by the group's description
  (``DATA_PARALLEL_GROUP`` → dp …), or the smallest kind whose instance holds
  every rank that reported the name.
- **The frontier** is the lowest sequence number any member has pending.
  Members that enqueued it joined; members whose last enqueued is below it are
  missing; members without a record gave no answer (a dead rank's absence is
  evidence: the survivors decide).
- **In flight is not stuck**: a healthy job nearly always has a collective
  pending (on gloo ``retired`` even lags a finished one). The frontier is stuck
  only if its earliest enqueue is older than ``stuck_after`` seconds, each age
  taken on the clock of the machine that recorded it (read in the same answer,
  so machines' clocks never meet), or if the same (group, sequence) is pending
  in two captures ``--interval`` apart.
- **Only a stuck collective names culprits.** Ops, sizes or dtypes that differ
  from the joined ranks' majority at the frontier name a mismatch culprit (a
  tie in a two-rank group is broken by what the group's other instances ran at
  that sequence number). Otherwise a missing rank that is itself pending in a
  stuck collective of another group is that group's victim (the wait-for graph
  across groups); a missing rank pending in no stuck recorded collective is the
  culprit (compute, the data loader, an unrecorded gloo p2p: its stack says
  which). Every rank joined and none completed is the communicator itself
  (GPU, NCCL or network): a ``communicator`` suspect, never an eviction alone.
  A wait-for cycle with no rank outside it names the cycle's ranks.

Linear in the ranks times their groups; the arrival analysis is ``stragglers.py``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from brctl.analysis.collectives import GroupRecord, RankRecord
from brctl.analysis.topology import KINDS, Topology

# Megatron-LM's group descriptions → brctl's kinds (``new_group(group_desc=...)``)
DESC_KINDS = {"TENSOR_MODEL_PARALLEL_GROUP": "tp", "DATA_PARALLEL_GROUP": "dp",
              "PIPELINE_MODEL_PARALLEL_GROUP": "pp", "CONTEXT_PARALLEL_GROUP": "cp",
              "EXPERT_MODEL_PARALLEL_GROUP": "ep", "EXPERT_DATA_PARALLEL_GROUP": "edp"}

Signature = tuple[str, tuple[tuple[int, ...], ...], tuple[str, ...]]  # op, sizes, dtypes
# two captures count as "pending twice" only this far apart on the rank's own clock
# (--interval 0 would otherwise make every in-flight collective stuck)
AGAIN_FLOOR_NS = 5 * 10**9


@dataclass(frozen=True)
class Instance:
    """One process-group instance: its name, members and place in the layout."""

    name: str
    desc: str
    members: tuple[int, ...]
    kind: str  # the topology kind whose instance it is, "world", or "" (not in the layout)
    index: int | None  # that instance's group id
    source: str  # where the members came from: table | layout | reporters
    # the member list is vouched for: the layout's, or a table that matches a layout
    # instance or that ranks on two machines served alike (one rank's table alone is a hint)
    vouched: bool = True


@dataclass(frozen=True)
class GroupVerdict:
    """The frontier of one instance with a collective pending."""

    group: Instance
    seq: int
    op: str
    verdict: str  # in_flight | stuck | mismatch | communicator
    age_s: float  # the oldest enqueue of the frontier, on its recording machine's clock
    joined: tuple[int, ...]
    missing: tuple[int, ...]  # answered, and never enqueued the frontier
    no_answer: tuple[int, ...]  # members with no recorder answer
    waits: tuple[tuple[int, str, int], ...] = ()  # (missing rank, group, seq it is pending in)
    mismatched: tuple[int, ...] = ()
    detail: str = ""

    def to_json(self) -> dict[str, object]:
        """A row of ``collective_groups``."""
        g = self.group
        return {"group": g.name, "desc": g.desc, "ranks": list(g.members), "kind": g.kind,
                "index": g.index, "members_from": g.source, "seq": self.seq, "op": self.op,
                "verdict": self.verdict, "age_s": round(self.age_s, 3),
                "joined": list(self.joined), "missing": list(self.missing),
                "no_answer": list(self.no_answer), "mismatched": list(self.mismatched),
                "waits": [{"rank": r, "group": n, "seq": s} for r, n, s in self.waits],
                "detail": self.detail}


@dataclass(frozen=True)
class Culprit:
    """A rank the collective evidence blames, and for what."""

    rank: int
    why: str  # never_entered | mismatch | no_answer | cycle
    verdict: GroupVerdict
    # a second machine's recorder confirms the hang (or the witnesses span two): one
    # machine's word alone (its own clock, its own pending claim) names but never evicts
    corroborated: bool = True

    @property
    def text(self) -> str:
        """``rank 5 never entered all_reduce #1042 of DATA_PARALLEL_GROUP (ranks 1,5,9,13)``."""
        v, g = self.verdict, self.verdict.group
        where = f"{v.op} #{v.seq} of {g.desc or 'group ' + g.name} (ranks {_short(g.members)})"
        return {"never_entered": f"rank {self.rank} never entered {where}",
                "mismatch": f"rank {self.rank} called {v.detail} in {where}",
                "no_answer": f"rank {self.rank} gave no recorder answer and is missing from "
                             f"{where}",
                "cycle": f"rank {self.rank} is in a wait-for cycle through {where}",
                }[self.why]


def _short(ranks: Sequence[int]) -> str:
    shown = ",".join(map(str, ranks[:8]))
    return shown + (f",… ({len(ranks)})" if len(ranks) > 8 else "")


def _layout_instance(name: str, desc: str, reporters: Sequence[int], topo: Topology
                     ) -> tuple[tuple[int, ...], str, int | None]:
    """Members, kind and index from the layout: the described kind, else the smallest that fits."""
    if name == "0" or desc == "default_pg":  # the default group is the world
        return tuple(range(topo.world)), "world", 0
    wanted = DESC_KINDS.get(desc)
    kinds = [wanted] if wanted else [k for k in KINDS if topo.size(k) > 1]
    for kind in kinds:
        gid = topo.group_id(reporters[0], kind)
        if all(topo.group_id(r, kind) == gid for r in reporters):
            return tuple(topo.group_ranks(kind, gid)), kind, gid
    return tuple(sorted(reporters)), "", None


def _place(members: tuple[int, ...], desc: str, topo: Topology) -> tuple[str, int | None]:
    """The kind and index whose instance is exactly ``members`` (or "" where none is)."""
    if len(members) == topo.world:
        return "world", 0
    wanted = DESC_KINDS.get(desc)
    for kind in ([wanted] if wanted else []) + [k for k in KINDS if k != wanted]:
        if topo.size(kind) != len(members):
            continue
        gid = topo.group_id(members[0], kind)
        if tuple(topo.group_ranks(kind, gid)) == tuple(sorted(members)):
            return kind, gid
    return "", None


def instances(records: Mapping[int, RankRecord], topo: Topology) -> dict[str, Instance]:
    """Every group name any rank reported, with its members and place in the layout."""
    reporters: dict[str, list[int]] = {}
    told: dict[str, tuple[int, ...] | None] = {}  # None: reporters disagree
    tellers: dict[str, set[str]] = {}  # machines whose tables gave that list
    descs: dict[str, str] = {}
    for rank, rec in records.items():
        for name, g in rec.groups.items():
            reporters.setdefault(name, []).append(rank)
            if g.desc:
                descs.setdefault(name, g.desc)
            if g.ranks is not None and rank in g.ranks:  # a table about its own group only
                mine = tuple(sorted(g.ranks))
                if told.setdefault(name, mine) != mine:
                    told[name] = None
                tellers.setdefault(name, set()).add(topo.machine_of(rank))
    out: dict[str, Instance] = {}
    for name, reps in reporters.items():
        desc = descs.get(name, "")
        listed = told.get(name)
        if listed is not None:
            kind, index = _place(listed, desc, topo)
            out[name] = Instance(name, desc, listed, kind, index, "table",
                                 bool(kind) or len(tellers[name]) > 1)
        else:
            members, kind, index = _layout_instance(name, desc, sorted(reps), topo)
            out[name] = Instance(name, desc, members, kind, index,
                                 "layout" if kind else "reporters")
    return out


def _signature(g: GroupRecord) -> Signature | None:
    p = g.pending
    return None if p is None else (p.op, p.sizes, p.dtypes)


def _describe(sig: Signature) -> str:
    op, sizes, dtypes = sig
    return f"{op} {list(map(list, sizes))} {','.join(dtypes)}"


def _frontier(inst: Instance, records: Mapping[int, RankRecord], earlier: Mapping[int, RankRecord],
              stuck_after: float) -> GroupVerdict | None:
    """The instance's frontier and whether it is stuck (before culprits are decided)."""
    views: dict[int, GroupRecord] = {}
    no_answer = []
    for r in inst.members:
        rec = records.get(r)
        if rec is None:
            no_answer.append(r)
        elif (g := rec.groups.get(inst.name)) is not None and g.last_enqueued >= 0:
            views[r] = g
    pend = [g.pending.seq for g in views.values() if g.pending is not None]
    if not pend:
        return None
    seq = min(pend)
    joined = tuple(r for r, g in views.items() if g.last_enqueued >= seq)
    missing = tuple(r for r, g in views.items() if g.last_enqueued < seq)
    at = {r: g for r, g in views.items() if g.pending is not None and g.pending.seq == seq}
    # the YOUNGEST wait, each on its own clock: in a hang every waiting member has waited
    # about as long; one young enqueue means it is in flight (one old claim cannot decide)
    age = min((records[r].clock_ns - g.pending.enqueued_ns) / 1e9
              for r, g in at.items() if g.pending is not None)
    # the very entry pending in two captures, the rank's own clock moved on meanwhile
    again = any((e := earlier.get(r)) is not None and (eg := e.groups.get(inst.name)) is not None
                and eg.pending is not None and g.pending is not None
                and eg.pending.seq == seq and eg.pending.enqueued_ns == g.pending.enqueued_ns
                and records[r].clock_ns - e.clock_ns >= AGAIN_FLOOR_NS for r, g in at.items())
    stuck = age >= stuck_after or again
    op = Counter(g.pending.op for g in at.values() if g.pending is not None).most_common(1)[0][0]
    detail = "pending in two captures" if again and age < stuck_after else ""
    return GroupVerdict(inst, seq, op, "stuck" if stuck else "in_flight", max(age, 0.0),
                        tuple(sorted(joined)), tuple(sorted(missing)), tuple(no_answer),
                        detail=detail)


def _tie_break(v: GroupVerdict, tied: Sequence[Signature], records: Mapping[int, RankRecord],
               same_kind: Sequence[Instance]) -> Signature | None:
    """The tied call the group's other instances made at this sequence number, if one wins:
    their pending op, sizes and dtypes where they wait there too, else their op."""
    exact: Counter[Signature] = Counter()
    ops: Counter[str] = Counter()
    for inst in same_kind:
        if inst.name == v.group.name:
            continue
        for r in inst.members:
            rec = records.get(r)
            g = rec.groups.get(inst.name) if rec is not None else None
            if g is None:
                continue
            sig = _signature(g)
            if sig is not None and g.pending is not None and g.pending.seq == v.seq:
                exact[sig] += 1
            op = g.op_at(v.seq)
            if op is not None:
                ops[op] += 1
    for votes in ([(exact[sig], sig) for sig in tied], [(ops[sig[0]], sig) for sig in tied]):
        votes.sort(key=lambda x: -x[0])
        if votes and votes[0][0] > 0 and (len(votes) == 1 or votes[1][0] < votes[0][0]):
            return votes[0][1]
    return None


def _mismatch(v: GroupVerdict, records: Mapping[int, RankRecord],
              by_desc: Mapping[str, Sequence[Instance]]) -> tuple[tuple[int, ...], str, str]:
    """Ranks whose frontier op, sizes or dtypes differ from the majority, what they called,
    and the group's op there."""
    sigs: dict[int, Signature] = {}
    for r in v.joined:
        g = records[r].groups[v.group.name]
        sig = _signature(g)
        if sig is not None and g.pending is not None and g.pending.seq == v.seq:
            sigs[r] = sig
    counts = Counter(sigs.values())
    if len(counts) < 2:
        return (), "", v.op
    best = max(counts.values())
    tied = [s for s, c in counts.items() if c == best]
    normal = tied[0] if len(tied) == 1 else _tie_break(v, tied, records,
                                                        by_desc.get(v.group.desc, ()))
    if normal is None:  # undecidable: every disagreeing rank is named
        odd = tuple(sorted(sigs))
        return odd, " / ".join(sorted({_describe(s) for s in sigs.values()})), v.op
    odd = tuple(sorted(r for r, s in sigs.items() if s != normal))
    calls = sorted({_describe(sigs[r]) for r in odd})
    return odd, f"{' / '.join(calls)} where the group calls {_describe(normal)}", normal[0]


def _enqueued_at(g: GroupRecord, seq: int) -> int | None:
    if g.pending is not None and g.pending.seq == seq:
        return g.pending.enqueued_ns
    return next((enq for s, enq, _ in g.recent if s == seq), None)


def _order(records: Mapping[int, RankRecord], skip: int, a: tuple[str, int], b: tuple[str, int],
           topo: Topology) -> int | None:
    """-1 when the other ranks ran collective ``a`` (desc, seq) before ``b``, 1 after, None:
    undecided. Each rank votes on its own clock; a side needs a clear majority from ranks
    on two machines or more, so no one rank (or machine) picks which side is evicted."""
    votes: dict[int, set[int]] = {-1: set(), 1: set()}
    for r, rec in records.items():
        if r == skip:
            continue
        ta = next((t for g in rec.groups.values() if g.desc == a[0]
                   and (t := _enqueued_at(g, a[1])) is not None), None)
        tb = next((t for g in rec.groups.values() if g.desc == b[0]
                   and (t := _enqueued_at(g, b[1])) is not None), None)
        if ta is not None and tb is not None and ta != tb:
            votes[-1 if ta < tb else 1].add(r)
    for side, other in ((-1, 1), (1, -1)):
        if len(votes[side]) > len(votes[other]) and \
                len({topo.machine_of(r) for r in votes[side]}) > 1:
            return side
    return None


def _break_cycle(out: Sequence[GroupVerdict], records: Mapping[int, RankRecord],
                 culprits: dict[int, Culprit], topo: Topology) -> None:
    """Every missing rank waits elsewhere: a wait-for cycle. On gloo a skip hangs just so
    (the skipper goes on to a collective its blocked peer cannot reach), so program order
    breaks it: a rank missing from A while pending in B skipped A when the other ranks ran
    A before B; else it is a victim. Undecidable: the cycle's ranks are named."""
    descs = {v.group.name: v.group.desc for v in out}
    for v in out:
        if v.verdict != "stuck" or not v.group.desc:
            continue
        for r, name, seq in v.waits:
            if descs.get(name) and _order(records, r, (v.group.desc, v.seq),
                                          (descs[name], seq), topo) == -1:
                culprits.setdefault(r, Culprit(r, "never_entered", v))
    if not culprits:
        for v in out:
            for r in v.missing if v.verdict == "stuck" else ():
                culprits.setdefault(r, Culprit(r, "cycle", v))


def _corroborated(v: GroupVerdict, stuck_machines: set[str], topo: Topology) -> bool:
    """The hang at ``v`` rests on more than one machine's word: its witnesses span two
    machines, or a machine besides theirs has a rank pending in a stuck collective."""
    witnesses = {topo.machine_of(r) for r in v.joined}
    return len(witnesses) > 1 or bool(stuck_machines - witnesses)


def _own_word(m: int, v: GroupVerdict, records: Mapping[int, RankRecord],
              earlier: Mapping[int, RankRecord], stuck_after: float) -> bool:
    """The missing rank's own record agrees it stopped: its newest enqueue in the group is
    old on its own clock, or unchanged over two captures. A healthy rank between two
    collectives enqueued a moment ago, which contradicts a peer claiming a long wait."""
    g = records[m].groups.get(v.group.name)
    if g is None or not g.recent:
        return True  # nothing of its own to contradict the peers
    newest = g.recent[-1][1]
    if (records[m].clock_ns - newest) / 1e9 >= stuck_after:
        return True
    e = earlier.get(m)
    eg = e.groups.get(v.group.name) if e is not None else None
    return (eg is not None and e is not None and eg.last_enqueued == g.last_enqueued
            and records[m].clock_ns - e.clock_ns >= AGAIN_FLOOR_NS)


def _blame(verdicts: Sequence[GroupVerdict], records: Mapping[int, RankRecord],
           topo: Topology, earlier: Mapping[int, RankRecord], stuck_after: float
           ) -> tuple[list[GroupVerdict], dict[int, Culprit], frozenset[int]]:
    """The wait-for graph across groups: verdicts with who waits where, culprits, victims."""
    stuck = [v for v in verdicts if v.verdict != "in_flight"]
    pending_in: dict[int, tuple[str, int]] = {}
    for v in stuck:
        for r in v.joined:
            g = records[r].groups[v.group.name]
            if g.pending is not None and g.pending.seq == v.seq:
                pending_in.setdefault(r, (v.group.name, v.seq))
    stuck_machines = {topo.machine_of(r) for r in pending_in}
    culprits: dict[int, Culprit] = {}
    out: list[GroupVerdict] = []
    for v in verdicts:
        if v.verdict == "mismatch":
            for r in v.mismatched:
                culprits[r] = Culprit(r, "mismatch", v)
        if v.verdict in ("stuck", "mismatch"):
            waits = tuple((r, *pending_in[r]) for r in v.missing if r in pending_in)
            sure = _corroborated(v, stuck_machines, topo)
            for r in v.missing:
                if r not in pending_in:  # its own record is the corroboration that counts
                    culprits.setdefault(r, Culprit(r, "never_entered", v, _own_word(
                        r, v, records, earlier, stuck_after)))
            for r in v.no_answer:  # absent from a member list only one rank vouched for: a hint
                culprits.setdefault(r, Culprit(r, "no_answer", v, sure and v.group.vouched))
            v = GroupVerdict(**{**v.__dict__, "waits": waits})
        out.append(v)
    if not culprits and any(v.missing for v in out if v.verdict == "stuck"):
        _break_cycle(out, records, culprits, topo)
    waiting = frozenset(pending_in).difference(culprits)
    return out, culprits, waiting


@dataclass(frozen=True)
class Wavefront:
    """Every instance's frontier verdict, and the ranks the collective evidence blames."""

    groups: tuple[GroupVerdict, ...]
    culprits: tuple[Culprit, ...]
    waiting: frozenset[int]  # ranks pending in a stuck collective (victims unless culprits)


def wavefront(captures: Sequence[Mapping[int, RankRecord]], topo: Topology,
              stuck_after: float = 60.0) -> tuple[Wavefront, dict[str, Instance]]:
    """Verdicts and culprits from the captures (oldest first; the last decides).

    Args:
        captures: rank → record, one mapping per capture.
        topo: the job's topology (members from the layout where no table says).
        stuck_after: seconds a frontier may be pending before it is stuck.
    """
    records = captures[-1] if captures else {}
    earlier = captures[-2] if len(captures) > 1 else {}
    insts = instances(records, topo)
    by_desc: dict[str, list[Instance]] = {}
    for inst in insts.values():
        by_desc.setdefault(inst.desc, []).append(inst)
    verdicts: list[GroupVerdict] = []
    for inst in insts.values():
        v = _frontier(inst, records, earlier, stuck_after)
        if v is None:
            continue
        if v.verdict == "stuck":
            odd, what, op = _mismatch(v, records, by_desc)
            if odd:
                v = GroupVerdict(**{**v.__dict__, "verdict": "mismatch", "mismatched": odd,
                                    "detail": what, "op": op})
            elif not v.missing and not v.no_answer:
                v = GroupVerdict(**{**v.__dict__, "verdict": "communicator",
                                    "detail": "every member joined and none completed"})
        verdicts.append(v)
    out, culprits, waiting = _blame(verdicts, records, topo, earlier, stuck_after)
    order = {"in_flight": 3, "communicator": 2, "stuck": 1, "mismatch": 0}
    out.sort(key=lambda v: (order[v.verdict], -v.age_s, v.group.name))
    return (Wavefront(tuple(out), tuple(culprits[r] for r in sorted(culprits)), waiting), insts)
