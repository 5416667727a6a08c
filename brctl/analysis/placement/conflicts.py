"""Which parallel groups each machine is in: the conflict index behind placement.

Two machines *conflict* when they share a group (TP, CP, EP, DP, expert-DP, PP)
that crosses machines. The index is linear in the number of ranks: the O(M²)
conflict graph is never built (for 12.5k machines it would hold tens of
millions of edges). Split from ``placement``, which plans and verifies with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field

from brctl.analysis.topology import Topology


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
        ranks_of: list[list[int]] = [[] for _ in range(m_count)]
        for r, mi in enumerate(mach):
            ranks_of[mi].append(r)
        sig: list[set[int]] = [set() for _ in range(m_count)]
        members: dict[int, list[int]] = {}
        for kidx, (_kind, stride, size) in enumerate(kept):
            block = stride * size
            # machine by machine, so every group's member list comes out in machine order
            # (sorting all (key, machine) pairs was a third of a 5-kind index)
            for mi, ranks in enumerate(ranks_of):
                keys = {kidx + n * (r % stride + (r // block) * stride) for r in ranks}
                sig[mi].update(keys)
                for key in keys:
                    if key in members:
                        members[key].append(mi)
                    else:
                        members[key] = [mi]
        return cls(topo.machines, tuple(k for k, _s, _z in kept),
                   tuple(frozenset(x) for x in sig),
                   {k: tuple(v) for k, v in members.items()},
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
