"""The smallest eviction that explains a set of outlier ranks, in whole parallel groups.

ByteRobust over-evicts on purpose (a whole group, not only the rank that looks
wrong), but never beyond the smallest group that explains the evidence. The
eviction proposed for outlier ranks is the cover of those ranks by whole
group instances of the allowed kinds (kinds may be mixed) with the fewest
machines, then the fewest instances: one instance holding every outlier when
that is smallest, a union of smaller ones otherwise. Two hung GPUs on two
machines of a 16,384-machine job cost those 2 machines, not their 1,024-machine
DP group.

Only an instance holding an outlier can be in a smallest cover, so the
candidates are each outlier's instance of each kind. Single-kind covers (every
instance of one kind that an outlier touches: the one containing instance when
there is one) are built first and abandoned as soon as they outgrow the best so
far; for up to ``EXACT_OUTLIERS`` outliers a depth-first search over the mixed
covers, pruned by "every outlier's machine must go", then proves the optimum
within ``SEARCH_BUDGET`` steps (past it, the best cover found stands: still a
valid cover, never larger than the best single-kind one). The work is linear in
the ranks of the instances touched.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from brctl.analysis.topology import Topology

EXACT_OUTLIERS = 64  # up to this many outliers the mixed-kind search runs
SEARCH_BUDGET = 20_000  # search steps before the best cover found so far stands


@dataclass(frozen=True)
class SuspectGroup:
    """Instances of one parallel-group kind proposed for eviction, and why."""

    kind: str
    indices: tuple[int, ...]
    members: tuple[str, ...]  # the machines of those instances, in machine order
    why: str
    evidence: tuple[str, ...] = ()  # per blamed rank: what the flight recorder and its stack say

    def to_json(self) -> dict[str, object]:
        """``{kind, indices, members, why, evidence}`` (a row of ``suspect_groups``)."""
        return {"kind": self.kind, "indices": list(self.indices), "members": list(self.members),
                "why": self.why, "evidence": list(self.evidence)}


Instance = tuple[int, int]  # (position of the kind in ``kinds``, group id)


class _Cover:
    """Machine and outlier bitmasks of the candidate instances (computed once each)."""

    def __init__(self, topo: Topology, kinds: Sequence[str], targets: Sequence[int]) -> None:
        self.topo, self.kinds, self.targets = topo, kinds, targets
        self.where = topo.machine_index
        self._machines: dict[Instance, int] = {}
        self.holds: dict[Instance, int] = {}  # instance → bitmask of the outliers it holds
        self.of: list[list[Instance]] = [[] for _ in targets]  # outlier → its instances
        for k, kind in enumerate(kinds):
            for pos, gid in enumerate(topo.group_ids(targets, kind)):
                inst = (k, gid)
                self.holds[inst] = self.holds.get(inst, 0) | (1 << pos)
                self.of[pos].append(inst)

    def machines(self, inst: Instance) -> int:
        """Bitmask of the machines of one instance."""
        mask = self._machines.get(inst)
        if mask is None:
            mask = 0
            where = self.where
            for r in self.topo.group_ranks(self.kinds[inst[0]], inst[1]):
                mask |= 1 << where[r]
            self._machines[inst] = mask
        return mask

    def single_kind(self, k: int, limit: int) -> tuple[int, list[Instance]] | None:
        """Every instance of kind ``k`` touched by an outlier, or None past ``limit`` machines.

        Counted with a set, not bitmasks: with thousands of outliers these unions
        reach most of the job and a set stays linear.
        """
        gids = sorted({inst[1] for inst, _ in self._touched(k)})
        seen: set[int] = set()
        where, kind = self.where, self.kinds[k]
        for gid in gids:
            seen.update(where[r] for r in self.topo.group_ranks(kind, gid))
            if len(seen) > limit:
                return None
        return len(seen), [(k, g) for g in gids]

    def _touched(self, k: int) -> Iterable[tuple[Instance, int]]:
        return ((inst, m) for inst, m in self.holds.items() if inst[0] == k)


def _key(machines: int, chosen: Sequence[Instance]) -> tuple[int, int, tuple[Instance, ...]]:
    return machines, len(chosen), tuple(sorted(chosen))


def minimal_cover(outliers: Iterable[int], topo: Topology, kinds: Sequence[str]
                  ) -> tuple[SuspectGroup, ...]:
    """The smallest eviction (machines, then instances) covering ``outliers`` with whole groups.

    Args:
        outliers: outlier ranks.
        topo: the job's topology.
        kinds: the group kinds that may be evicted, smallest first (ties prefer earlier kinds).

    Returns:
        One SuspectGroup per kind used (in ``kinds`` order); empty without outliers.
    """
    targets = sorted(set(outliers))
    if not targets:
        return ()
    cover = _Cover(topo, kinds, targets)
    floor = len({cover.where[r] for r in targets})  # every outlier's machine must go
    best: tuple[tuple[int, int, tuple[Instance, ...]], list[Instance]] | None = None
    for k in range(len(kinds)):
        found = cover.single_kind(k, best[0][0] if best else topo.world + len(topo.machines))
        if found is not None and (best is None or _key(*found) < best[0]):
            best = (_key(*found), found[1])
    assert best is not None  # the first kind is never abandoned
    if len(targets) <= EXACT_OUTLIERS and (best[0][0] > floor or best[0][1] > 1):
        best = _search(cover, best)
    return _groups(best[1], cover, len(targets))


def _search(cover: _Cover, best: tuple[tuple[int, int, tuple[Instance, ...]], list[Instance]]
            ) -> tuple[tuple[int, int, tuple[Instance, ...]], list[Instance]]:
    """Depth-first over mixed covers, branching on the first outlier not yet covered."""
    n = len(cover.targets)
    everyone = (1 << n) - 1
    own = [1 << cover.where[r] for r in cover.targets]
    steps = 0

    def visit(machines: int, covered: int, chosen: list[Instance]) -> None:
        nonlocal best, steps
        steps += 1
        if covered == everyone:
            key = _key(machines.bit_count(), chosen)
            if key < best[0]:
                best = (key, list(chosen))
            return
        if steps > SEARCH_BUDGET:
            return
        rest = machines
        for pos in range(n):
            if not covered >> pos & 1:
                rest |= own[pos]
        if (rest.bit_count(), len(chosen) + 1) > best[0][:2]:
            return  # even the outliers' own machines cannot beat the best
        pos = next(p for p in range(n) if not covered >> p & 1)
        options = sorted(cover.of[pos], key=lambda i: ((machines | cover.machines(i)).bit_count(),
                                                      -cover.holds[i].bit_count(), i))
        for inst in options:
            chosen.append(inst)
            visit(machines | cover.machines(inst), covered | cover.holds[inst], chosen)
            chosen.pop()

    visit(0, 0, [])
    return best


def _groups(chosen: Sequence[Instance], cover: _Cover, total: int) -> tuple[SuspectGroup, ...]:
    """The chosen instances as one SuspectGroup per kind, each saying which outliers it holds."""
    topo, out = cover.topo, []
    for k in sorted({k for k, _ in chosen}):
        gids = tuple(sorted(g for kk, g in chosen if kk == k))
        kind = cover.kinds[k]
        members = topo.machines_of(r for g in gids for r in topo.group_ranks(kind, g))
        wanted = set(gids)
        held = [r for r in cover.targets if topo.group_id(r, kind) in wanted]
        noun = "group" if len(gids) == 1 else "groups"
        if len(held) == total and len(gids) == 1:
            why = f"the smallest group holding all {total} outlier ranks"
        else:
            why = f"{kind} {noun} holding {len(held)} of {total} outlier ranks"
        why += f" ({_ranks(held)}), {len(members)} machine{'s' if len(members) != 1 else ''}"
        out.append(SuspectGroup(kind, gids, tuple(members), why))
    return tuple(out)


def _ranks(ranks: Sequence[int]) -> str:
    shown = ",".join(map(str, ranks[:8]))
    return f"ranks {shown}" + (f",… ({len(ranks)})" if len(ranks) > 8 else "")
