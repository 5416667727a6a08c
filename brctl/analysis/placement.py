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
  optimum under random failures, reference/algorithms.md §3.1), 3-rings for the
  remainder (Gemini's "mixed"), in another failure domain when labels give one,
  deterministic. Machines with no valid peer get the best fallback (the fewest
  shared group kinds) marked ``meets_rule = False``.
- ``verify_plan``: evicts every group instance of every kind (and every single
  machine) and lists the shards that would lose both copies.
- ``loss_probability``: the exact probability that k simultaneous uniformly random
  machine failures destroy some shard's both copies, by inclusion–exclusion over
  the backup graph's small subgraphs (k ≤ 4).

Pure functions on typed data: no I/O, no clock.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from fractions import Fraction
from itertools import combinations
from math import comb

from brctl.analysis.topology import Topology
from brctl.core.errors import ExitCode

# Deterministic probing: the same job always gets the same plan.
_SEED = 0x62726374
# Random probes per machine before an exhaustive scan; with PP ≥ 2 at least about
# half the machines are valid peers, so 32 misses in a row almost never happen.
_PROBES = 32
MAX_K = 4  # loss probabilities are computed for k = 1..MAX_K simultaneous failures


# -- the conflict index -------------------------------------------------------------


def kind_geometry(topo: Topology) -> list[tuple[str, int, int]]:
    """``(kind, stride, size)`` of every group kind with more than one rank per group.

    The rank stride and size of each axis in Megatron's generators: the dense one
    (tp, cp, dp, pp in the order string) and the expert one (tp, ep, edp, pp). The
    Megatron group id of rank r along an axis is then
    ``r % stride + (r // (stride·size))·stride`` (the rank with that axis removed).
    """
    dense_axes = topo.order.split("-")
    sizes = {"tp": topo.tp, "cp": topo.cp, "ep": 1, "dp": topo.dp, "pp": topo.pp}
    strides: dict[str, int] = {}
    acc = 1
    for axis in dense_axes:
        strides[axis] = acc
        acc *= sizes[axis]
    expert_sizes = {"tp": topo.tp, "cp": 1, "ep": topo.ep, "dp": topo.edp, "pp": topo.pp}
    acc = 1
    for axis in dense_axes:
        name = "edp" if axis == "dp" else axis
        if name in ("ep", "edp"):
            strides[name] = acc
        acc *= expert_sizes[axis]
    out = []
    for kind in ("tp", "cp", "ep", "dp", "edp", "pp"):
        size = topo.size(kind)
        if size > 1:
            out.append((kind, strides[kind], size))
    return out


@dataclass(frozen=True)
class ConflictIndex:
    """Which groups each machine is in, and which machines each group spans.

    A key is ``kind_index + n_kinds·group_id``; ``kinds[key % n_kinds]`` names its kind.
    """

    machines: tuple[str, ...]
    kinds: tuple[str, ...]  # the indexed kinds (groups that cross machines)
    sig: tuple[frozenset[int], ...]  # per machine index: the keys of its groups
    members: Mapping[int, tuple[int, ...]]  # key → machine indices in machine order
    first_rank: tuple[int, ...]  # per machine: its lowest rank (-1 when it has none)
    rank_count: tuple[int, ...]  # per machine: how many ranks it runs
    # Kinds not indexed: groups that never leave one machine (covered by evicting that
    # machine), and expert-DP when it is the same partition as DP (CP = EP = 1).
    local_kinds: tuple[str, ...] = ()
    aliases: Mapping[str, str] = dataclass_field(default_factory=dict)

    @classmethod
    def build(cls, topo: Topology) -> ConflictIndex:
        """Index ``topo`` in time linear in its rank count."""
        pos = {m: i for i, m in enumerate(topo.machines)}
        mach = [pos[m] for m in topo.rank_machines]
        m_count = len(topo.machines)
        first, count = [-1] * m_count, [0] * m_count
        for r, mi in enumerate(mach):
            if first[mi] < 0:
                first[mi] = r
            count[mi] += 1
        # With the launcher's default layout (machine i runs ranks i·g … i·g+g−1), a kind
        # whose group blocks divide g never leaves a machine: no need to index it.
        g = count[0] if count else 0
        contiguous = g > 0 and all(c == g for c in count) and all(
            first[i] == i * g for i in range(m_count))
        kept, local, aliases = [], [], {}
        for kind, stride, size in kind_geometry(topo):
            if contiguous and g % (stride * size) == 0:
                local.append(kind)
            elif kind == "edp" and topo.cp == 1 and topo.ep == 1:
                aliases["edp"] = "dp"  # same strides and sizes: the very same groups
            else:
                kept.append((kind, stride, size))
        n = max(1, len(kept))
        sig: list[set[int]] = [set() for _ in range(m_count)]
        members: dict[int, list[int]] = {}
        world = len(mach)
        for kidx, (_kind, stride, size) in enumerate(kept):
            block = stride * size
            keys = [kidx + n * (r % stride + (r // block) * stride) for r in range(world)]
            for key, mi in set(zip(keys, mach)):
                members.setdefault(key, []).append(mi)
                sig[mi].add(key)
        return cls(topo.machines, tuple(k for k, _s, _z in kept),
                   tuple(frozenset(x) for x in sig),
                   {k: tuple(sorted(v)) for k, v in members.items()},
                   tuple(first), tuple(count), tuple(local), aliases)

    def kind_of(self, key: int) -> str:
        """The group kind of ``key``."""
        return self.kinds[key % max(1, len(self.kinds))]

    def group_id(self, key: int) -> int:
        """Megatron's group id of ``key`` within its kind."""
        return key // max(1, len(self.kinds))

    def compatible(self, a: int, b: int) -> bool:
        """Machines ``a`` and ``b`` share no parallel group."""
        return a != b and self.sig[a].isdisjoint(self.sig[b])

    def shared_kinds(self, a: int, b: int) -> list[str]:
        """The kinds of the groups ``a`` and ``b`` share, smallest kind first."""
        shared = {self.kind_of(k) for k in self.sig[a] & self.sig[b]}
        return [k for k in self.kinds if k in shared]

    def spanning_kind(self, a: int) -> str | None:
        """A kind one of whose groups on ``a`` spans every machine (then ``a`` has no valid peer)."""
        total = len(self.machines)
        for key in sorted(self.sig[a]):
            if len(self.members[key]) == total:
                return self.kind_of(key)
        return None


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

    @property
    def exit_code(self) -> ExitCode:
        """1 when some placement breaks the rule, else 0."""
        return ExitCode.OK if self.ok else ExitCode.FINDINGS

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
    symmetrically, e.g. (dp, pp) ↔ (dp⊕1, pp⊕1) in reference/algorithms.md §3.5.
    """
    r0, per = index.first_rank[a], index.rank_count[a]
    if r0 < 0:
        return
    sizes = {"tp": topo.tp, "cp": topo.cp, "dp": topo.dp, "pp": topo.pp}
    axes, acc = [], 1
    for axis in topo.order.split("-"):
        size = sizes.get(axis, 1)
        if size > 1:
            block = 1
            while block * acc < per:
                block *= 2
            coord = (r0 // acc) % size
            flipped = coord ^ block
            if flipped < size:
                axes.append((flipped - coord) * acc)
        acc *= size
    for n in (2, 3):
        for combo in combinations(axes, n):
            r = r0 + sum(combo)
            if 0 <= r < len(machine_of):
                yield machine_of[r]


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

    def spanning(self, a: int) -> str | None:
        """``ConflictIndex.spanning_kind``, cached."""
        if a not in self._spanning:
            self._spanning[a] = self.index.spanning_kind(a)
        return self._spanning[a]

    def apart(self, a: int, b: int) -> bool:
        """In different failure domains (or no domains known)."""
        return self.dom[a] is None or self.dom[a] != self.dom[b]

    def find_partner(self, a: int) -> int | None:
        """An unmatched compatible machine, preferring another failure domain."""
        idx, pool = self.index, self.pool
        if self.spanning(a) is not None:
            return None  # one of a's groups spans every machine: nobody is compatible
        same: int | None = None
        for b in _flip_candidates(self.topo, idx, a, self.machine_of):
            if b in pool and idx.compatible(a, b):
                if self.apart(a, b):
                    return b
                same = b if same is None else same
        if pool.items:
            for _ in range(_PROBES):
                b = pool.sample()
                if idx.compatible(a, b):
                    if self.apart(a, b):
                        return b
                    same = b if same is None else same
        if same is not None:
            return same
        for b in list(pool.items):
            if idx.compatible(a, b):
                if self.apart(a, b):
                    return b
                same = b if same is None else same
        return same

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

    def augment(self, left: list[int]) -> list[int]:
        """Re-pair along augmenting paths a–b=c–d: unmatched a takes b, b's partner c takes d.

        Greedy matching can strand two machines that conflict with each other (e.g.
        an odd DP); one swap with an existing pair usually frees both.
        """
        idx, todo = self.index, list(left)
        changed = True
        while changed and len(todo) > 1:
            changed = False
            for a in todo:
                for b in range(self.m):
                    if self.how[b] != "pair" or not idx.compatible(a, b):
                        continue
                    c = self.backup[b]
                    d = next((d for d in todo if d != a and idx.compatible(c, d)), None)
                    if d is None:
                        continue
                    self.backup[a], self.backup[b], self.backup[c], self.backup[d] = b, a, d, c
                    self.how[a] = self.how[d] = "pair"
                    todo = [x for x in todo if x not in (a, d)]
                    changed = True
                    break
                if changed:
                    break
        return todo

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
        same = sum(p.same_domain for p in out)
        if same and any(d is not None for d in self.dom):
            notes.append(f"{same} backup(s) share their machine's failure domain: "
                         "no compatible peer in another domain was free")
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
    left = planner.close_rings(left) + hopeless
    notes = planner.share_or_fallback(left)
    return planner.result(notes)


# -- verification -----------------------------------------------------------------------


@dataclass(frozen=True)
class Violation:
    """Evicting ``nodes`` (one group, or one machine) loses both copies of ``lost``' shards."""

    kind: str  # a group kind, "node" for a single machine, "missing" for no backup
    group: int | None
    nodes: tuple[str, ...]
    lost: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        """The ``violations`` entry of ``brctl ckpt verify --json``."""
        return {"kind": self.kind, "group": self.group, "nodes": list(self.nodes),
                "lost": list(self.lost)}


@dataclass(frozen=True)
class Verification:
    """The result of evicting every group: violations and loss probabilities."""

    evictions: int  # group instances (and single machines) evicted
    violations: tuple[Violation, ...]
    loss_probability: Mapping[int, float | None]  # k → P(some shard lost); None when k > machines
    machines: int  # the failure universe: job machines plus outside backup holders

    @property
    def ok(self) -> bool:
        """No eviction of one group (or one machine) loses a shard."""
        return not self.violations

    @property
    def exit_code(self) -> ExitCode:
        """1 when some single eviction loses a shard, else 0."""
        return ExitCode.OK if self.ok else ExitCode.FINDINGS


def verify_plan(topo: Topology, backups: Mapping[str, str],
                index: ConflictIndex | None = None) -> Verification:
    """Evict every group instance of every kind and every single machine; check each shard.

    Args:
        topo: the job's topology.
        backups: job machine → machine holding its copy (may be outside the job,
            e.g. a standby: it belongs to no group).
        index: a prebuilt ``ConflictIndex`` of ``topo`` (saves rebuilding it).

    Returns:
        The violations and the exact loss probabilities for k = 1..4.
    """
    idx = index or ConflictIndex.build(topo)
    names = topo.machines
    violations: list[Violation] = []
    missing = tuple(m for m in names if m not in backups)
    if missing:
        violations.append(Violation("missing", None, (), missing))
    for m in names:
        if backups.get(m) == m:
            violations.append(Violation("node", None, (m,), (m,)))
    evictions = len(names) + sum(topo.n_groups(k) for k in (*idx.local_kinds, *idx.aliases))
    for key in sorted(idx.members, key=lambda k: (idx.kinds.index(idx.kind_of(k)), k)):
        group = [names[i] for i in idx.members[key]]
        evictions += 1
        if len(group) < 2:
            continue  # a group inside one machine: covered by the single-machine check
        evicted = set(group)
        lost = tuple(m for m in group if backups.get(m) in evicted and backups.get(m) != m)
        if lost:
            violations.append(Violation(idx.kind_of(key), idx.group_id(key), tuple(group), lost))
    known = set(names)
    universe = list(names) + sorted({b for b in backups.values() if b not in known})
    probs = loss_probability(universe, backups)
    return Verification(evictions, tuple(violations),
                        {k: (float(p) if p is not None else None) for k, p in probs.items()},
                        len(universe))


# -- exact loss probability ---------------------------------------------------------------


def loss_probability(machines: Sequence[str], backups: Mapping[str, str],
                     max_k: int = MAX_K) -> dict[int, Fraction | None]:
    """P(some shard loses both copies | k machines fail, uniformly at random), k = 1..max_k.

    A shard of machine A is lost when A and its backup B(A) both fail; a machine
    without a backup (or backed up on itself) loses when it fails. Counting the
    k-sets that contain no such pair is counting independent sets of size k in the
    backup graph G (edges {A, B(A)}). By inclusion–exclusion over edge sets S,
    ``#k-sets hitting an edge = Σ_S (−1)^{|S|+1} C(N − v(S), k − v(S))`` where v(S)
    is the number of machines S touches, and only v(S) ≤ k ≤ 4 contributes: single
    edges, 2-paths and triangles (v = 3), and two disjoint edges, 3-paths, 3-stars,
    4-cycles, paws, diamonds and K4s (v = 4). Each pattern is counted from degrees
    and common neighbours, so a pairing plan costs O(N).

    Args:
        machines: the failure universe (every machine that may fail).
        backups: machine → its backup machine.
        max_k: largest k (at most 4).

    Returns:
        ``{k: probability}`` as exact fractions; None where k exceeds the machine count.
    """
    if max_k > MAX_K:
        raise ValueError(f"loss_probability: k ≤ {MAX_K} supported")
    names = list(dict.fromkeys(machines))
    lonely = {m for m in names if backups.get(m, m) == m}
    rest = [m for m in names if m not in lonely]
    adj: dict[str, set[str]] = {m: set() for m in rest}
    for a, b in backups.items():
        if a in adj and b in adj and a != b:
            adj[a].add(b)
            adj[b].add(a)
    n_all, n = len(names), len(rest)
    hit = _hitting_counts(adj, n)
    out: dict[int, Fraction | None] = {}
    for k in range(1, max_k + 1):
        if k > n_all:
            out[k] = None
            continue
        safe = comb(n, k) - hit[k]  # k-sets avoiding lonely machines and every edge
        out[k] = 1 - Fraction(safe, comb(n_all, k))
    return out


def _hitting_counts(adj: Mapping[str, set[str]], n: int) -> dict[int, int]:
    """For k = 1..4, the number of k-subsets of the ``n`` vertices that contain an edge."""
    deg = {v: len(nb) for v, nb in adj.items()}
    edges = [(u, w) for u, nb in adj.items() for w in nb if u < w]
    n_edges = len(edges)
    p2 = sum(comb(d, 2) for d in deg.values())  # 2-paths (edge pairs sharing a vertex)
    # Triangles through each edge and vertex (common neighbours).
    tri_edge = {(u, w): len(adj[u] & adj[w]) for u, w in edges}
    triangles = sum(tri_edge.values()) // 3
    tri_vertex = {v: 0 for v in adj}
    for (u, w), t in tri_edge.items():
        tri_vertex[u] += t
        tri_vertex[w] += t
    stars3 = sum(comb(d, 3) for d in deg.values())
    paths3 = sum((deg[u] - 1) * (deg[w] - 1) for u, w in edges) - 3 * triangles
    paws = sum((tri_vertex[v] // 2) * (deg[v] - 2) for v in adj)
    diamonds = sum(comb(t, 2) for t in tri_edge.values())
    cycles4 = _four_cycles(adj)
    k4 = _four_cliques(adj, edges)
    pairs_disjoint = comb(n_edges, 2) - p2
    hit = {1: 0, 2: n_edges}
    hit[3] = n_edges * (n - 2) - p2 + triangles
    hit[4] = (n_edges * comb(max(n - 2, 0), 2) - (p2 - triangles) * (n - 3) - pairs_disjoint
              + stars3 + paths3 - cycles4 - paws + diamonds - k4)
    return hit


def _four_cycles(adj: Mapping[str, set[str]]) -> int:
    """4-cycles (as subgraphs): Σ over vertex pairs of C(common neighbours, 2), halved."""
    common: dict[tuple[str, str], int] = {}
    for nb in adj.values():
        if len(nb) < 2:
            continue
        for u, w in combinations(sorted(nb), 2):
            common[(u, w)] = common.get((u, w), 0) + 1
    return sum(comb(c, 2) for c in common.values()) // 2


def _four_cliques(adj: Mapping[str, set[str]], edges: list[tuple[str, str]]) -> int:
    """K4 subgraphs: for each edge, pairs of adjacent common neighbours; each K4 seen 6 times."""
    total = 0
    for u, w in edges:
        common = sorted(adj[u] & adj[w])
        total += sum(1 for x, y in combinations(common, 2) if y in adj[x])
    return total // 6
