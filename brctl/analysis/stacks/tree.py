"""Stack clustering: ranks' main-thread stacks → prefix tree, classes, outliers, group to evict.

Pure functions on typed data (after LLNL STAT, the Stack Trace Analysis Tool):

- ``signature`` normalises one stack to (function, file) pairs, outermost first,
  folded at known wait points (everything inside ``torch.distributed``,
  ``threading``, ``queue`` … collapses into the innermost frame of that library
  run), so ranks waiting in the same collective look alike whatever its internals.
- ``classify`` forms STAT's equivalence classes (ranks with the same path through
  the prefix tree = the same signature) and ``build_tree`` merges the signatures
  into the prefix tree whose nodes carry the ranks through them.
- ``_round_outliers`` compares ranks only with the peers that should look alike
  (the same pipeline stage): the minority classes of each stage, plus undumpable
  (read but not answering in time) and missing ranks. A rank brctl could not
  read at all (``unread``: ptrace refused, no py-spy, environ refused) is no
  outlier: no evidence is not evidence against it, and only makes the run
  incomplete. ``moving_outliers`` uses several rounds: a rank whose stack
  moves while its stage's does not, or stands still while the stage moves.
- ``eviction_groups`` covers the outliers with whole parallel-group instances,
  fewest machines first (``evictset``): one containing group or a union of
  smaller ones, whichever is smaller.
- ``analyse`` runs all of it over one or more rounds and, for fail-slow jobs,
  votes per group instance across rounds (ByteRobust: the group with the most
  outliers over the rounds is the degrader).

Everything is linear in the number of ranks: ranks are grouped by signature
first, and only distinct signatures enter the tree.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from math import comb
from typing import TYPE_CHECKING, NamedTuple

from brctl.analysis.stacks.evictset import SuspectGroup, minimal_cover
from brctl.analysis.topology import KINDS, Topology

if TYPE_CHECKING:
    from brctl.analysis.collective_analysis import CollectiveAnalysis


class Frame(NamedTuple):
    """One Python frame as py-spy reports it (``file`` is py-spy's short filename)."""

    name: str
    file: str
    line: int


Stack = tuple[Frame, ...]  # outermost frame first
Signature = tuple[tuple[str, str], ...]  # (function, file), outermost first, folded

# Library code a training rank waits in. A stack that enters one of these is cut
# at the innermost frame of that library run: the frames below a collective's
# wait differ between torch versions and gloo/NCCL but mean the same thing.
WAIT_DIRS = ("torch/distributed/", "torch/cuda/", "multiprocessing/", "concurrent/futures/",
             "asyncio/", "torch/utils/data/")
WAIT_FILES = ("threading.py", "queue.py", "selectors.py", "socket.py", "subprocess.py",
              "ssl.py")

UNDUMPABLE: Signature = (("<undumpable>", ""),)  # the class of ranks py-spy could not read
MISSING: Signature = (("<missing>", ""),)  # the class of ranks with no process on their machine
UNREAD: Signature = (("<unread>", ""),)  # the class of ranks brctl could not read at all
REAL = 3  # signature ids below this are UNDUMPABLE, MISSING, UNREAD

# py-spy failures that mean brctl could not look (``stacks_probe.explain_failure``, the
# collector's "no py-spy"): the rank is unread, not unresponsive
UNREAD_ERRORS = ("may not ptrace", "py-spy is not available")


def is_unread(error: str | None) -> bool:
    """Whether a rank's error says brctl could not read it (rather than it not answering)."""
    return error is not None and any(m in error for m in UNREAD_ERRORS)


def _waits_in(file: str) -> str | None:
    """The wait library ``file`` belongs to (its marker), or None."""
    path = "/" + file
    for d in WAIT_DIRS:
        if "/" + d in path:
            return d
    for f in WAIT_FILES:
        if path.endswith("/" + f):
            return f
    return None


def signature(stack: Stack) -> Signature:
    """Normalise a stack (outermost first) to its signature.

    Line numbers are dropped (function + file, as STAT's function granularity),
    and the stack is folded at the first wait library it enters: the frames of
    that library are collapsed into its innermost contiguous frame.

    Args:
        stack: the main thread's frames, outermost first.

    Returns:
        The signature, outermost first.
    """
    out: list[tuple[str, str]] = []
    n = len(stack)
    for i in range(n):
        frame = stack[i]
        lib = _waits_in(frame.file)
        if lib is None:
            out.append((frame.name, frame.file))
            continue
        j = i
        while j + 1 < n and _waits_in(stack[j + 1].file) == lib:
            j += 1
        out.append((stack[j].name, stack[j].file))
        break
    return tuple(out)


def frame_label(item: tuple[str, str]) -> str:
    """``function (file)`` as py-spy prints it."""
    name, file = item
    return f"{name} ({file})" if file else name


def fold_ranks(ranks: Iterable[int]) -> str:
    """STAT-style rank ranges: ``[0, 1, 2, 5]`` → ``"0-2,5"``."""
    out: list[str] = []
    items = sorted(set(ranks))
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        out.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return ",".join(out)


class RankSample(NamedTuple):
    """One rank's main-thread stack in one round.

    ``stack`` is None when py-spy could not read the process (``error`` says why),
    or when ``missing``: the machine answered but no process has this rank.
    ``unread``: brctl had no way to read it (the collector's channel state, or an
    error that ``is_unread``).
    A NamedTuple, as ``Frame``: a round of 131,072 ranks builds one per rank, and
    a tuple is made three times faster than a frozen dataclass.
    """

    rank: int
    node: str
    pid: int
    stack: Stack | None
    error: str | None = None
    missing: bool = False
    unread: bool = False


@dataclass(frozen=True)
class Round:
    """One collection over the job: the samples, and machines that gave no answer."""

    samples: tuple[RankSample, ...]
    silent_nodes: frozenset[str] = frozenset()



class _Signatures:
    """Interns signatures as small ints: later steps hash ints, not 60-frame tuples."""

    def __init__(self) -> None:
        self.sigs: list[Signature] = [UNDUMPABLE, MISSING, UNREAD]
        self._ids: dict[Signature, int] = {UNDUMPABLE: 0, MISSING: 1, UNREAD: 2}
        self._by_stack: dict[Stack, int] = {}
        self._last: dict[int, tuple[Stack, int]] = {}  # rank → its stack and id last round

    def ids(self, rnd: Round) -> dict[int, int]:
        """rank → signature id for one round (each distinct stack normalised once).

        Hashing a 60-frame stack is most of the cost, so a rank whose stack is the
        very object it had in the previous round (the collector keeps it when the
        stack did not change) reuses that round's id without hashing.
        """
        out: dict[int, int] = {}
        by_stack, last = self._by_stack, self._last
        for s in rnd.samples:
            stack = s.stack
            if stack is None:
                out[s.rank] = 1 if s.missing else 2 if s.unread or is_unread(s.error) else 0
                continue
            before = last.get(s.rank)
            if before is not None and before[0] is stack:
                out[s.rank] = before[1]
                continue
            sid = by_stack.get(stack)
            if sid is None:
                sig = signature(stack)
                sid = self._ids.setdefault(sig, len(self.sigs))
                if sid == len(self.sigs):
                    self.sigs.append(sig)
                by_stack[stack] = sid
            out[s.rank] = sid
            last[s.rank] = (stack, sid)
        return out


def stages(topo: Topology) -> list[int]:
    """Every rank's pipeline stage, computed in one pass (``topo.coord`` per rank is slow)."""
    sizes = {"tp": topo.tp, "cp": topo.cp, "ep": 1, "dp": topo.dp, "pp": topo.pp}
    stride = 1
    for axis in topo.order.split("-"):
        if axis == "pp":
            break
        stride *= sizes[axis]
    pp = topo.pp
    return [(r // stride) % pp for r in range(topo.world)]


@dataclass(frozen=True)
class StackClass:
    """An equivalence class: the ranks that share one signature."""

    ranks: tuple[int, ...]
    signature: Signature
    stages: tuple[int, ...]
    outlier: bool

    def to_json(self) -> dict[str, object]:
        """``{ranks, count, signature, stages, outlier}`` (ranks folded STAT-style)."""
        return {"ranks": fold_ranks(self.ranks), "count": len(self.ranks),
                "signature": [frame_label(f) for f in self.signature],
                "stages": list(self.stages), "outlier": self.outlier}


@dataclass(frozen=True)
class TreeNode:
    """A node of the merged prefix tree and the ranks whose stacks pass through it.

    The tree is path-compressed (a radix tree): ``frames`` is the run of frames
    that every rank of this node shares up to the next branch point or to where
    some of its ranks' stacks end, so a 60-frame chain costs one node.
    """

    frames: tuple[tuple[str, str], ...]
    ranks: tuple[int, ...]
    children: tuple[TreeNode, ...] = ()


@dataclass(frozen=True)
class Outlier:
    """A rank that does not look like its peers, and why."""

    rank: int
    node: str
    pid: int | None
    reason: str  # minority | undumpable | missing | stuck | moving
    rounds: int  # in how many rounds it was an outlier
    detail: str = ""

    def to_json(self) -> dict[str, object]:
        """The JSON row of ``outliers``."""
        return {"node": self.node, "rank": self.rank, "pid": self.pid, "reason": self.reason,
                "rounds": self.rounds, "detail": self.detail}


@dataclass(frozen=True)
class StackAnalysis:
    """What ``analyse`` concludes over all rounds."""

    classes: tuple[StackClass, ...]
    tree: TreeNode
    outliers: tuple[Outlier, ...]
    suspects: tuple[SuspectGroup, ...]
    evict: tuple[str, ...]
    rounds: int
    group_votes: Mapping[tuple[str, int], int] = field(default_factory=dict)
    silent_nodes: tuple[str, ...] = ()
    unread: tuple[int, ...] = ()  # ranks brctl could not read in the last round
    collectives: CollectiveAnalysis | None = None  # the recorder evidence, fused (fusion.py)


def classify(sigs: Mapping[int, Signature]) -> dict[Signature, list[int]]:
    """Equivalence classes: signature → its ranks (ascending)."""
    out: dict[Signature, list[int]] = defaultdict(list)
    for rank in sorted(sigs):
        out[sigs[rank]].append(rank)
    return dict(out)


def build_tree(classes: Mapping[Signature, Sequence[int]]) -> TreeNode:
    """Merge the classes' signatures into one prefix tree labelled with rank sets.

    Each distinct signature enters once with all its ranks, and chains without a
    branch collapse into one node, so the cost is the number of ranks times the
    branching depth plus the total length of the distinct signatures.
    """
    entries = [(sig, list(ranks)) for sig, ranks in classes.items()]
    everyone = tuple(sorted(r for _, ranks in entries for r in ranks))
    return TreeNode((("<all ranks>", ""),), everyone, _children(entries, 0))


def _children(entries: list[tuple[Signature, list[int]]], depth: int) -> tuple[TreeNode, ...]:
    buckets: dict[tuple[str, str], list[tuple[Signature, list[int]]]] = {}
    for sig, ranks in entries:
        if len(sig) > depth:
            buckets.setdefault(sig[depth], []).append((sig, ranks))
    nodes = []
    for group in buckets.values():
        end = depth + 1
        first = group[0][0]
        while all(len(sig) > end and sig[end] == first[end] for sig, _ in group):
            end += 1
        members = tuple(sorted(r for _, rs in group for r in rs))
        nodes.append(TreeNode(first[depth:end], members, _children(group, end)))
    return tuple(sorted(nodes, key=lambda n: (-len(n.ranks), n.ranks[:1])))


def _dominant(counts: Counter[int], table: _Signatures, popularity: Counter[tuple[str, str]]
              ) -> int | None:
    """The cohort's normal class id: the largest, holding at least half the cohort.

    A tie between the largest classes is broken by which one's innermost frame is
    commonest across the whole job (healthy ranks of other stages wait there too);
    an undecidable tie, or no class with half the cohort, means no verdict.
    """
    total = sum(c for sid, c in counts.items() if sid != 2)  # the unread: not in the vote
    ranked = [(c, sid) for sid, c in counts.items() if sid >= REAL]
    if not ranked:
        return None
    best = max(c for c, _ in ranked)
    if 2 * best < total:
        return None  # no consensus: ranks are busy at different points, not stuck
    tied = [sid for c, sid in ranked if c == best]
    if len(tied) == 1:
        return tied[0]
    scores = sorted((popularity[table.sigs[sid][-1]] if table.sigs[sid] else 0, sid)
                    for sid in tied)
    if scores[-1][0] == scores[-2][0]:
        return None
    return scores[-1][1]


def _round_outliers(ids: Mapping[int, int], stage: Sequence[int], table: _Signatures
                    ) -> dict[int, str]:
    """Outlier ranks of one round → reason (minority, undumpable, missing).

    Ranks are compared only within their pipeline stage: different stages run
    different layers and legitimately wait in different places.
    """
    by_stage: dict[int, Counter[int]] = defaultdict(Counter)
    for rank, sid in ids.items():
        by_stage[stage[rank]][sid] += 1
    popularity: Counter[tuple[str, str]] = Counter()
    for counts in by_stage.values():
        for sid, n in counts.items():
            if sid >= REAL and table.sigs[sid]:
                popularity[table.sigs[sid][-1]] += n
    normal = {st: _dominant(counts, table, popularity) for st, counts in by_stage.items()}
    out: dict[int, str] = {}
    for rank, sid in ids.items():
        if sid == 0:
            out[rank] = "undumpable"
        elif sid == 1:
            out[rank] = "missing"
        elif sid >= REAL:
            dom = normal[stage[rank]]
            if dom is not None and sid != dom:
                out[rank] = "minority"
    return out


def moving_outliers(rounds: Sequence[Mapping[int, Stack | None]], stage: Sequence[int]
                    ) -> dict[int, str]:
    """Ranks whose stack moves (or not) against their stage's majority over the rounds.

    A rank "moves" when its full stack, with line numbers, differs between any two
    consecutive rounds. In a stage where most ranks move, a still rank is
    ``stuck``; where most stand still (waiting on someone), a moving rank is
    ``moving`` (it is the one still working). Needs two rounds or more.
    """
    if len(rounds) < 2:
        return {}
    moved: dict[int, bool] = {}
    for rank in rounds[0]:
        seq = [r.get(rank) for r in rounds]
        if any(s is None for s in seq):
            continue
        moved[rank] = any(a != b for a, b in zip(seq, seq[1:]))
    by_stage: dict[int, list[int]] = defaultdict(list)
    for rank in moved:
        by_stage[stage[rank]].append(rank)
    out: dict[int, str] = {}
    for ranks in by_stage.values():
        n_moving = sum(moved[r] for r in ranks)
        if 2 * n_moving > len(ranks):
            out.update({r: "stuck" for r in ranks if not moved[r]})
        elif 2 * n_moving < len(ranks):
            out.update({r: "moving" for r in ranks if moved[r]})
    return out


def _kinds(topo: Topology) -> list[str]:
    """Kinds worth blaming: size-1 groups are the rank itself (kept for TP only)."""
    return [k for k in KINDS if k == "tp" or topo.size(k) > 1]


def eviction_groups(outliers: Iterable[int], topo: Topology) -> tuple[SuspectGroup, ...]:
    """The smallest eviction covering the outliers with whole group instances.

    Fewest machines, then fewest instances (``evictset.minimal_cover``): the one
    group holding every outlier when that is smallest, else a union of smaller ones.

    Args:
        outliers: outlier ranks.
        topo: the job's topology.

    Returns:
        One SuspectGroup per kind used; empty without outliers.
    """
    return minimal_cover(outliers, topo, _kinds(topo))


def _vote(per_round: Sequence[set[int]], topo: Topology
          ) -> tuple[tuple[SuspectGroup, ...], Counter[tuple[str, int]]]:
    """The suspects over several rounds and the outlier counts per group instance.

    When every round names the same eviction (the smallest cover of its
    outliers), the cause is steady (a hang) and it stands. Otherwise (fail-slow,
    where each round also catches noise) outlier counts accumulate per group
    instance over the rounds, and the instance with the densest count (outliers
    per member; ties: more outliers, fewer machines) is the degrader: a slow rank
    and the peers waiting on it return round after round, while noise lands on
    different ranks each time. Group sizes are arithmetic; machines are counted
    only for the instances tied at the top. Instances whose every rank is an
    outlier in most rounds, more than noise explains (``_persistent_ranks``: say
    16 hung PP groups), get the smallest cover of them all instead, as one round
    of the same job does; the densest instance alone evicted one of them.
    """
    kinds = _kinds(topo)
    everything = [r for o in per_round for r in o]
    votes: Counter[tuple[str, int]] = Counter({(kind, gid): n for kind in kinds
                     for gid, n in Counter(topo.group_ids(everything, kind)).items()})
    if not votes:
        return (), votes
    first = eviction_groups(per_round[0], topo)
    evicted = {m for g in first for m in g.members}

    def same(o: set[int]) -> bool:
        if not evicted.issuperset(topo.machines_of(o)):
            return False  # any cover of o evicts its outliers' machines: not this one
        other = eviction_groups(o, topo)
        return [(g.kind, g.indices) for g in other] == [(g.kind, g.indices) for g in first]

    steady = all(o == per_round[0] or same(o) for o in per_round[1:])
    if steady:
        return first, votes  # the same outliers' eviction every round: a steady hang
    persistent = _persistent_ranks(per_round, topo, kinds)
    if persistent:  # several hung groups: the smallest cover of them all, as one round gets
        return minimal_cover(persistent, topo, kinds), votes

    def density(item: tuple[str, int]) -> tuple[float, int]:
        return -votes[item] / topo.size(item[0]), -votes[item]

    top = min(density(item) for item in votes)
    tied = [item for item in votes if density(item) == top]
    kind, gid = min(tied, key=lambda it: (len(topo.group_machines(*it)), topo.size(it[0]),
                                          kinds.index(it[0]), it[1]))
    members = tuple(topo.group_machines(kind, gid))
    rounds_with = sum(1 for o in per_round if gid in topo.group_ids(o, kind))
    why = (f"most outliers over {len(per_round)} rounds: {votes[(kind, gid)]} in "
           f"{topo.size(kind)} ranks, in {rounds_with} of the rounds")
    return (SuspectGroup(kind, (gid,), members, why),), votes


# Expected group instances that noise alone would make persistent, above which one is not
NOISE_INSTANCES = 0.01


def _persistent_ranks(per_round: Sequence[set[int]], topo: Topology, kinds: Sequence[str]
                      ) -> set[int]:
    """The ranks of group instances whose every rank is an outlier in most rounds.

    Noise that moves between rounds fills a whole instance by chance: with q the
    outlier fraction, an instance of s ranks is full in a round with odds q^s. An
    instance full in c of R rounds counts only when all the kind's instances
    together would reach c by chance fewer than ``NOISE_INSTANCES`` times (the
    binomial tail), so scattered noise never does, while each hung group, full in
    every round, does. q is counted outside the instance under test: in a small
    job a slow rank and its waiting peer were most of the outliers, and counted as
    noise they made their own group look like chance. Strongest instance first, a
    later one is asked again for its ranks not yet taken only: a DP pair holding a
    hung rank is not "full" by the hung rank's doing.
    """
    n_rounds = len(per_round)
    need = n_rounds // 2 + 1
    total = sum(len(o) for o in per_round)

    def odds(kind: str, p: float, c: int) -> float:  # expected instances full in >= c rounds
        return topo.n_groups(kind) * sum(comb(n_rounds, i) * p ** i * (1 - p) ** (n_rounds - i)
                                         for i in range(c, n_rounds + 1))

    found: list[tuple[float, int, str, int, float, int]] = []
    for kind in kinds:
        size = topo.size(kind)
        full: Counter[int] = Counter()
        inside: Counter[int] = Counter()
        for o in per_round:
            counts = Counter(topo.group_ids(o, kind))
            inside.update(counts)
            full.update(g for g, n in counts.items() if n == size)
        others = n_rounds * (topo.world - size)
        for gid, c in full.items():
            if c < need:
                continue
            q = (total - inside[gid]) / others if others else total / (n_rounds * topo.world)
            score = odds(kind, q ** size, c)
            if score < NOISE_INSTANCES:
                found.append((score, -size, kind, gid, q, c))
    out: set[int] = set()
    for _, _, kind, gid, q, c in sorted(found):
        ranks = set(topo.group_ranks(kind, gid))
        left = len(ranks - out)
        if left and (left == len(ranks) or odds(kind, q ** left, c) < NOISE_INSTANCES):
            out |= ranks
    return out


def _ranks_of(group: SuspectGroup, topo: Topology) -> Iterable[int]:
    return (r for gid in group.indices for r in topo.group_ranks(group.kind, gid))


def analyse(rounds: Sequence[Round], topo: Topology) -> StackAnalysis:
    """Classes, outliers, the suspect group and the machines to evict over one or more rounds.

    The classes and tree describe the last round. With one round the outliers
    are that round's. With several, outlier counts are accumulated per group
    instance (fail-slow: the degrader, see ``_vote``); when no round shows an
    outlier, a rank whose motion disagrees with its stage is one.

    Args:
        rounds: the collections, oldest first (at least one).
        topo: the job's topology (rank → machine from the live processes).

    Returns:
        The analysis; ``evict`` is empty when nothing is wrong.
    """
    if not rounds:
        raise ValueError("analyse needs at least one round")
    table = _Signatures()
    stage = stages(topo)
    per_round: list[dict[int, str]] = []
    ids: dict[int, int] = {}
    info: dict[int, RankSample] = {}
    for rnd in rounds:
        ids = table.ids(rnd)
        for s in rnd.samples:
            info[s.rank] = s
        per_round.append(_round_outliers(ids, stage, table))
    moving: dict[int, str] = {}
    if len(rounds) > 1 and not any(per_round):
        # motion decides only when the snapshots alone show nothing
        moving = moving_outliers([{s.rank: s.stack for s in r.samples} for r in rounds], stage)
    if len(rounds) == 1:
        suspects = eviction_groups(per_round[0], topo)
        votes: Counter[tuple[str, int]] = Counter(
            {(g.kind, i): 1 for g in suspects for i in g.indices})
    else:
        suspects, votes = _vote([set(o) for o in per_round] if not moving else [set(moving)],
                               topo)

    counts: Counter[int] = Counter(r for o in per_round for r in o)
    reasons = {**{r: why for o in per_round for r, why in o.items()}, **moving}
    outliers = []
    for rank in sorted(reasons):
        s = info[rank]
        outliers.append(Outlier(rank, s.node, s.pid if s.pid > 0 else None, reasons[rank],
                                counts[rank] + (1 if rank in moving else 0), s.error or ""))
    final = per_round[-1]
    by_id: dict[int, list[int]] = defaultdict(list)
    for rank in sorted(ids):
        by_id[ids[rank]].append(rank)
    classes = [StackClass(tuple(ranks), table.sigs[sid], tuple(sorted({stage[r] for r in ranks})),
                          any(r in final for r in ranks)) for sid, ranks in by_id.items()]
    classes.sort(key=lambda c: (-len(c.ranks), c.ranks[0]))
    silent = sorted({n for r in rounds for n in r.silent_nodes})
    unread = tuple(sorted(r for r, sid in ids.items() if sid == 2))
    return StackAnalysis(
        classes=tuple(classes),
        tree=build_tree({c.signature: c.ranks for c in classes}),
        outliers=tuple(outliers),
        suspects=suspects,
        evict=tuple(topo.machines_of(r for g in suspects for r in _ranks_of(g, topo))),
        rounds=len(rounds),
        group_votes=dict(votes),
        silent_nodes=tuple(silent),
        unread=unread,
    )
