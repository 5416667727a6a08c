"""Checkpoint backup placement: a peer outside every parallel group, and proof of it.

Responsibilities:

- ``ConflictIndex``: for every machine, the parallel groups (of every kind whose
  groups have more than one rank) it has a rank in, as one set of integer keys;
  and for every group, its machines. Two machines *conflict* when their key sets
  intersect. The index is linear in the number of ranks: the O(M²) conflict graph
  is never built (for 12.5k machines it would hold tens of millions of edges).
- ``plan_backups``: a backup peer per machine that shares no TP/CP/EP/DP/EDP/PP
  group with it (ByteRobust's rule: evicting any one group never removes both
  copies), as pairings where possible (Gemini's group placement with m = 2, the
  optimum under random failures), 3-rings for the
  remainder (Gemini's "mixed"), in another failure domain when labels give one
  (same-domain pairs re-paired along alternating paths, a matching, not greedy),
  outside the dp-cp gradient group when a peer allows, deterministic, near-linear
  for every shape (odd PP pairs stages cyclically; stranded machines are
  re-paired along bounded augmenting paths). Machines with no valid peer get the
  best fallback (the fewest shared group kinds) marked ``meets_rule = False``.
- ``verify_plan`` (``placement_verify``): evicts every group instance of every kind
  (and every single machine) and lists the shards that would lose both copies.
- ``loss_probability`` (``lossprob``): the exact probability that k simultaneous
  uniformly random machine failures destroy some shard's both copies; holders
  outside the job (standbys) own no shard.

Pure functions on typed data: no I/O, no clock.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain, combinations

from brctl.analysis.placement.conflicts import ConflictIndex
from brctl.analysis.placement.lossprob import MAX_K, loss_probability
from brctl.analysis.placement.verify import Verification, Violation, verify_plan
from brctl.analysis.topology import Topology

__all__ = [
    "MAX_K",
    "ConflictIndex",
    "Placement",
    "Plan",
    "Verification",
    "Violation",
    "loss_probability",
    "plan_backups",
    "verify_plan",
]

# Deterministic probing: the same job always gets the same plan.
_SEED = 0x62726374
# Random probes per machine before an exhaustive scan; with PP ≥ 2 at least about
# half the machines are valid peers, so 32 misses in a row almost never happen.
_PROBES = 32
# Compatibility checks one augmenting-path search may spend (stranded machines are few).
_AUGMENT_CHECKS = 200_000


# -- the plan -------------------------------------------------------------------------


@dataclass(frozen=True)
class Placement:
    """Where one machine's checkpoint shards get their second copy.

    ``how`` is ``pair`` (each backs up the other), ``ring`` (a 3-ring for the odd
    machine out), ``shared`` (the peer already holds another machine's shards: the
    shape forced it) or ``fallback`` (no peer outside every group exists).
    """

    node: str
    backup_node: str
    meets_rule: bool
    how: str
    shared_kinds: tuple[str, ...] = ()  # group kinds node and backup share (fallback only)
    same_domain: bool = False  # node and backup are in the same failure domain

    def to_json(self) -> dict[str, object]:
        """The ``placements`` entry of ``brctl ckpt plan --json``."""
        return {"node": self.node, "backup_node": self.backup_node,
                "meets_rule": self.meets_rule, "how": self.how,
                "shared_kinds": list(self.shared_kinds), "same_domain": self.same_domain}


@dataclass(frozen=True)
class Plan:
    """A backup peer for every job machine; ``ok`` when all meet the rule."""

    placements: tuple[Placement, ...]
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """Every placement shares no parallel group with its machine."""
        return all(p.meets_rule for p in self.placements)

    def backups(self) -> dict[str, str]:
        """``{node: backup_node}``."""
        return {p.node: p.backup_node for p in self.placements}


class _Pool:
    """Unmatched machines: O(1) removal and seeded random picks (deterministic)."""

    def __init__(self, size: int, rng: random.Random) -> None:
        self.items = list(range(size))
        self.pos = list(range(size))
        self.rng = rng

    def __contains__(self, i: int) -> bool:
        return self.pos[i] >= 0

    def remove(self, i: int) -> None:
        p = self.pos[i]
        last = self.items.pop()
        if last != i:
            self.items[p] = last
            self.pos[last] = p
        self.pos[i] = -1

    def sample(self) -> int:
        return self.items[self.rng.randrange(len(self.items))]


def _flip_candidates(topo: Topology, index: ConflictIndex, a: int,
                     machine_of: Sequence[int]) -> Iterator[int]:
    """Structured peers: flip two or three dense coordinates of the machine's first rank.

    Flipping coordinate c to ``c XOR b`` (b the smallest power of two that leaves the
    machine) is an involution, so on regular layouts these candidates pair machines
    symmetrically, e.g. (dp, pp) ↔ (dp⊕1, pp⊕1) on a 16-machine TP=8, PP=2, DP=8 job.
    With an odd number of stages XOR leaves the last stage without a partner (and
    the greedy search then quadratic), so the stages pair cyclically instead: the
    upper half of stage s's DP blocks with the lower half of stage s+1's
    (0→1→2→0), again an involution.
    """
    r0, per = index.first_rank[a], index.rank_count[a]
    if r0 < 0:
        return
    sizes = {"tp": topo.tp, "cp": topo.cp, "dp": topo.dp, "pp": topo.pp}
    axes, acc = [], 1
    where: dict[str, tuple[int, int, int]] = {}  # axis → (coordinate, stride, block)
    for axis in topo.order.split("-"):
        size = sizes.get(axis, 1)
        if size > 1:
            block = 1
            while block * acc < per:
                block *= 2
            coord = (r0 // acc) % size
            where[axis] = (coord, acc, block)
            flipped = coord ^ block
            if flipped < size:
                axes.append((flipped - coord) * acc)
        acc *= size
    if topo.pp % 2 and "pp" in where and "dp" in where:
        r = r0 + _cyclic_shift(where["dp"], topo.dp, where["pp"], topo.pp)
        if r != r0 and 0 <= r < len(machine_of):
            yield -1 - machine_of[r]  # negative: the cyclic partner, taken in any domain
    for n in (2, 3):
        for combo in combinations(axes, n):
            r = r0 + sum(combo)
            if 0 <= r < len(machine_of):
                yield machine_of[r]


def _cyclic_shift(dp: tuple[int, int, int], dp_size: int, pp: tuple[int, int, int],
                  pp_size: int) -> int:
    """The rank offset to the cyclic partner: (q, s) ↔ (q ± h, s ∓ 1), h half the DP blocks."""
    (q, dp_stride, w), (st, pp_stride, _) = dp, pp
    h = (dp_size // (2 * w)) * w
    if h == 0 or q >= 2 * h:
        return 0  # one DP block per stage, or the odd block out: left to the search
    if q < h:
        return h * dp_stride + ((st - 1) % pp_size - st) * pp_stride
    return -h * dp_stride + ((st + 1) % pp_size - st) * pp_stride


def _gradient_groups(topo: Topology, machine_of: Sequence[int]) -> list[frozenset[int]]:
    """Per machine, its dp-cp groups (the gradient all-reduce: ranks differing only in dp, cp).

    Not one of the rule's kinds (evicting a CP or DP group never takes a whole
    dp-cp group), but a backup outside it is preferred when one is free.
    """
    sizes = {"tp": topo.tp, "cp": topo.cp, "ep": 1, "dp": topo.dp, "pp": topo.pp}
    strides, acc = {}, 1
    for axis in topo.order.split("-"):
        strides[axis] = acc
        acc *= sizes[axis]
    tp_s, pp_s = strides["tp"], strides["pp"]
    out: list[set[int]] = [set() for _ in range(len(topo.machines))]
    for r, mi in enumerate(machine_of):
        out[mi].add((r // tp_s) % topo.tp + topo.tp * ((r // pp_s) % topo.pp))
    return [frozenset(x) for x in out]


def _domain_of(machines: Sequence[str], domains: Mapping[str, str] | None) -> list[str | None]:
    return [domains.get(m) if domains else None for m in machines]


class _Planner:
    """The pairing search (one instance per ``plan_backups`` call)."""

    def __init__(self, topo: Topology, domains: Mapping[str, str] | None,
                 index: ConflictIndex | None) -> None:
        self.topo = topo
        self.index = index or ConflictIndex.build(topo)
        self.m = len(topo.machines)
        self.dom = _domain_of(topo.machines, domains)
        self.rng = random.Random(_SEED)
        self.pool = _Pool(self.m, self.rng)
        self.backup = [-1] * self.m
        self.how = [""] * self.m
        self._spanning: dict[int, str | None] = {}
        pos = {name: i for i, name in enumerate(topo.machines)}
        self.machine_of = [pos[name] for name in topo.rank_machines]
        self.gradient = _gradient_groups(topo, self.machine_of) if topo.cp > 1 else None
        if self.gradient and frozenset.intersection(*self.gradient):
            # one dp-cp group spans every machine (PP = 1): nobody avoids it, and
            # seeking a peer that does cost 32 vain probes per machine
            self.gradient = None

    def spanning(self, a: int) -> str | None:
        """``ConflictIndex.spanning_kind``, cached."""
        if a not in self._spanning:
            self._spanning[a] = self.index.spanning_kind(a)
        return self._spanning[a]

    def apart(self, a: int, b: int) -> bool:
        """In different failure domains (or no domains known)."""
        return self.dom[a] is None or self.dom[a] != self.dom[b]

    def find_partner(self, a: int) -> int | None:
        """An unmatched compatible machine: another failure domain, then no shared dp-cp group."""
        idx, pool = self.index, self.pool
        if self.spanning(a) is not None:
            return None  # one of a's groups spans every machine: nobody is compatible
        best: int | None = None
        best_score = (True, True)

        def better(b: int) -> bool:
            """Keep ``b`` if it beats the best so far; True when nothing can beat it."""
            nonlocal best, best_score
            if b not in pool or not idx.compatible(a, b):
                return False
            score = (not self.apart(a, b), self.gradient_shared(a, b))
            if best is None or score < best_score:
                best, best_score = b, score
            return score == (False, False)

        for b in _flip_candidates(self.topo, idx, a, self.machine_of):
            if b < 0:
                # The cyclic partner even in a's own domain: an XOR peer in another
                # domain breaks the cycle and strands the last stage (racks by machine
                # parity left 800 of 2,400 to augment); separate_domains fixes racks.
                if better(-1 - b) or best is not None:
                    return best
            elif better(b):
                return best
        for _ in range(_PROBES if pool.items else 0):
            if better(pool.sample()):
                return best
        if best is not None:
            return best
        for b in list(pool.items):
            if better(b):
                break
        return best

    def gradient_shared(self, a: int, b: int) -> bool:
        """``a`` and ``b`` share a dp-cp (gradient all-reduce) group: allowed, avoided."""
        return self.gradient is not None and not self.gradient[a].isdisjoint(self.gradient[b])

    def pair_up(self) -> None:
        """Greedy matching in machine order."""
        for a in range(self.m):
            if a not in self.pool:
                continue
            self.pool.remove(a)
            b = self.find_partner(a)
            if b is None:
                self.pool.items.append(a)  # stays unmatched; re-insert at the end
                self.pool.pos[a] = len(self.pool.items) - 1
                continue
            self.pool.remove(b)
            self.backup[a], self.backup[b] = b, a
            self.how[a] = self.how[b] = "pair"

    def augment(self, left: list[int],
                edge: Callable[[int, int], bool] | None = None) -> list[int]:
        """Grow the matching along augmenting paths from each unmatched machine.

        Greedy matching can strand machines that conflict with each other (an odd
        DP, stages ending mid-machine); a path a–b=c–d…–z that alternates
        compatible and paired machines, from one stranded machine to another,
        re-pairs it so both are matched. Depth-first with visited marks (Kuhn's
        search), each search bounded by ``_AUGMENT_CHECKS`` compatibility checks:
        stranded machines are few, so this stays linear in the machines.
        """
        todo = list(left)
        for a in list(todo):
            if a not in todo or len(todo) < 2:
                continue
            free = set(todo) - {a}
            path = self._augmenting_path(a, free, edge or self.index.compatible)
            if path is None:
                continue
            for i in range(0, len(path), 2):  # (a, b), (c, d), …: the new pairs
                u, v = path[i], path[i + 1]
                self.backup[u], self.backup[v] = v, u
                self.how[u] = self.how[v] = "pair"
            todo = [x for x in todo if x not in (a, path[-1])]
        return todo

    def _augmenting_path(self, a: int, free: set[int], edge: Callable[[int, int], bool]
                         ) -> list[int] | None:
        """Machines a, b, c, …, z: a~b, b=c paired, c~d, …, z free; or None within the budget."""
        checks = 0
        # The short path a–b=c–d first, usually there is one: b among a's structured
        # and random peers, then every machine, all within the budget (unbounded it
        # cost machines × free per search: quadratic with many stranded machines).
        near = [abs(v) - (v < 0) for v in _flip_candidates(self.topo, self.index, a,
                                                          self.machine_of)]
        near += [self.rng.randrange(self.m) for _ in range(_PROBES)]
        for v in chain(near, range(self.m)):
            checks += 1
            if checks > _AUGMENT_CHECKS:
                return None
            if self.how[v] == "pair" and edge(a, v):
                w = self.backup[v]
                for d in free:
                    checks += 1
                    if edge(w, d):
                        return [a, v, w, d]
                    if checks > _AUGMENT_CHECKS:
                        return None
        seen = {a}
        stack: list[tuple[int, int]] = [(a, 0)]  # (machine, next candidate to try)
        path = [a]
        while stack:
            u, start = stack[-1]
            for v in range(start, self.m):
                checks += 1
                if checks > _AUGMENT_CHECKS:
                    return None
                if v in seen or not edge(u, v):
                    continue
                if v in free:
                    return [*path, v]
                if self.how[v] != "pair":
                    continue
                w = self.backup[v]
                seen.update((v, w))
                stack[-1] = (u, v + 1)
                stack.append((w, 0))
                path.extend((v, w))
                break
            else:
                stack.pop()
                del path[-2:]
        return None

    def separate_domains(self) -> None:
        """Re-pair same-domain pairs across domains along alternating cycles.

        Greedy matching can pair a machine inside its own rack while its
        cross-rack peers went to machines that had other choices. For a pair
        (a, b) in one domain, a path a–v₁=w₁–v₂=w₂…–b alternating new and
        existing pairs, each new pair compatible and in two domains, re-pairs
        everyone on it across domains (Kuhn's search, bounded as in ``augment``):
        one same-domain pair fewer each time, never a machine stranded.
        """
        if all(d is None for d in self.dom):
            return

        def across(u: int, v: int) -> bool:
            return self.apart(u, v) and self.index.compatible(u, v)

        self._swap_pairs(across)
        for a in range(self.m):
            b = self.backup[a]
            if self.how[a] != "pair" or a > b or self.apart(a, b):
                continue
            self.how[a] = self.how[b] = ""
            # Kuhn's search is not exact on general graphs: search from both ends
            path = self._augmenting_path(a, {b}, across) or self._augmenting_path(b, {a}, across)
            for i in range(0, len(path or ()), 2):
                u, v = path[i], path[i + 1]  # type: ignore[index]
                self.backup[u], self.backup[v] = v, u
            self.how[a] = self.how[b] = "pair"

    def _swap_pairs(self, across: Callable[[int, int], bool]) -> None:
        """Two same-domain pairs of two domains swap partners (a–c, b–d): O(1) each.

        The cyclic stage pairing can put every pair in one rack (racks by machine
        parity); one path search per pair then scanned all machines (quadratic).
        """
        pairs = [(a, self.backup[a]) for a in range(self.m) if self.how[a] == "pair"
                 and a < self.backup[a] and not self.apart(a, self.backup[a])]
        pool = _Pool(len(pairs), self.rng)
        for i, (a, b) in enumerate(pairs):
            if i not in pool:
                continue
            pool.remove(i)
            for _ in range(min(_PROBES, len(pool.items))):
                j = pool.sample()
                c, d = pairs[j]
                if across(a, d) and across(b, c):
                    c, d = d, c
                elif not (across(a, c) and across(b, d)):
                    continue
                pool.remove(j)
                self.backup[a], self.backup[c], self.backup[b], self.backup[d] = c, a, d, b
                break

    def close_rings(self, left: list[int]) -> list[int]:
        """Turn an unmatched machine and a pair into a 3-ring a→b→c→a where all fit."""
        idx, used = self.index, set[int]()
        still = []
        for a in left:
            found = None
            for b in range(self.m):
                c = self.backup[b]
                if (self.how[b] == "pair" and b not in used and c not in used
                        and idx.compatible(a, b) and idx.compatible(a, c)):
                    found = (b, c)
                    break
            if found is None:
                still.append(a)
                continue
            b, c = found
            used.update((b, c))
            self.backup[a], self.backup[b], self.backup[c] = b, c, a
            self.how[a] = self.how[b] = self.how[c] = "ring"
        return still

    def load(self) -> list[int]:
        """How many other machines' shards each machine holds."""
        held = [0] * self.m
        for b in self.backup:
            if b >= 0:
                held[b] += 1
        return held

    def share_or_fallback(self, left: list[int]) -> list[str]:
        """Last resort: a compatible peer that already holds a copy, else the least-shared one."""
        idx, notes = self.index, []
        held = self.load()
        no_peer = [a for a in left if self.spanning(a) is not None
                   or not any(idx.compatible(a, b) for b in range(self.m))]
        skip = set(no_peer)
        for a in left:
            if a in skip:
                continue
            b = min((b for b in range(self.m) if idx.compatible(a, b)),
                    key=lambda b: (held[b], not self.apart(a, b), b))
            self.backup[a], self.how[a] = b, "shared"
            held[b] += 1
        notes.extend(self.fallback(no_peer))
        return notes

    def fallback(self, no_peer: list[int]) -> list[str]:
        """Pair machines that have no valid peer with the least-conflicting machines left."""
        if not no_peer:
            return []
        spanning = {self.spanning(a) for a in no_peer} - {None}
        notes = [
            f"{len(no_peer)} machine(s) have no peer outside all their parallel groups"
            + (f" (a {'/'.join(sorted(k for k in spanning if k))} group spans every machine)"
               if spanning else "")
            + ": their backups survive the loss of one machine but not the eviction of the "
            "shared group; keep persistent checkpoints for those"
        ]
        pool = list(no_peer)
        last_pair: tuple[int, int] | None = None
        while pool:
            a = pool.pop(0)
            if not pool:
                if last_pair is not None:  # odd one out: a 3-ring keeps every load at one
                    b, c = last_pair
                    self.backup[a], self.backup[b], self.backup[c] = b, c, a
                else:
                    self.backup[a] = self._best_any(a)
                self.how[a] = "fallback"
                break
            cands = pool if len(pool) <= _PROBES else (
                pool[:_PROBES // 2] + self.rng.sample(pool[_PROBES // 2:], _PROBES // 2))
            b = self._least_shared(a, cands)
            pool.remove(b)
            self.backup[a], self.backup[b] = b, a
            self.how[a] = self.how[b] = "fallback"
            last_pair = (a, b)
        return notes

    def _least_shared(self, a: int, cands: list[int]) -> int:
        """The candidate sharing the fewest group kinds with ``a`` (another domain on ties)."""
        idx = self.index
        floor = len({idx.kind_of(k) for k in idx.sig[a] if len(idx.members[k]) == self.m})
        best, best_score = cands[0], (len(idx.kinds) + 1, True)
        for b in cands:
            score = (len(idx.shared_kinds(a, b)), not self.apart(a, b))
            if score < best_score:
                best, best_score = b, score
                if score == (floor, False):
                    break  # cannot do better: the spanning kinds are shared with everyone
        return best

    def _best_any(self, a: int) -> int:
        idx, held = self.index, self.load()
        others = [b for b in range(self.m) if b != a]
        cands = others if len(others) <= 4 * _PROBES else others[:4 * _PROBES]
        return min(cands, key=lambda b: (len(idx.shared_kinds(a, b)), held[b],
                                         not self.apart(a, b), b))

    def result(self, notes: list[str]) -> Plan:
        """Freeze the assignment into a ``Plan``."""
        names, idx = self.topo.machines, self.index
        out = []
        for a in range(self.m):
            b = self.backup[a]
            ok = idx.compatible(a, b)
            out.append(Placement(names[a], names[b], ok, self.how[a],
                                 () if ok else tuple(idx.shared_kinds(a, b)),
                                 self.dom[a] is not None and self.dom[a] == self.dom[b]))
        same = [a for a, p in enumerate(out) if p.same_domain]
        if same and any(d is not None for d in self.dom):
            alone = sum(1 for a in same if not any(
                idx.compatible(a, b) and self.apart(a, b) for b in range(self.m)))
            why = [f"{alone} have no compatible machine in another domain"] if alone else []
            if len(same) > alone:
                why.append(f"{len(same) - alone} have compatible machines in other domains, "
                           "but re-pairing along alternating paths found none free without "
                           "putting another backup in its machine's domain")
            notes.append(f"{len(same)} backup(s) share their machine's failure domain: "
                         + "; ".join(why))
        return Plan(tuple(out), tuple(notes))


def plan_backups(topo: Topology, domains: Mapping[str, str] | None = None,
                 index: ConflictIndex | None = None) -> Plan:
    """A backup peer for every machine of ``topo`` (see the module docstring).

    Args:
        topo: the job's topology.
        domains: machine → failure domain (rack, switch); machines missing from it
            have no known domain.
        index: a prebuilt ``ConflictIndex`` of ``topo`` (shared with ``verify_plan``).

    Returns:
        The plan, in machine order; single-machine jobs get no placement.
    """
    planner = _Planner(topo, domains, index)
    if planner.m < 2:
        return Plan((), ("a single-machine job has no peer to back up to",))
    planner.pair_up()
    left = [a for a in range(planner.m) if planner.backup[a] < 0]
    hopeless = [a for a in left if planner.spanning(a) is not None]
    skip = set(hopeless)
    left = planner.augment([a for a in left if a not in skip])
    planner.separate_domains()
    left = planner.close_rings(left) + hopeless
    notes = planner.share_or_fallback(left)
    return planner.result(notes)
