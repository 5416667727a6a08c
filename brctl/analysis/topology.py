"""Ranks ↔ machines ↔ parallel groups, following Megatron-LM's rank generator.

With the order string ``tp-cp-ep-dp-pp`` the first axis has stride 1, so
``rank = tp + TP·(cp + CP·(dp + DP·pp))`` for the dense layers (EP = 1 there); the
order ``tp-cp-ep-pp-dp`` swaps dp and pp. A group of kind K is the set of ranks that
agree on every other coordinate. Expert layers use a second generator over the
same ranks (tp = TP, ep = EP, dp = expert-DP = CP·DP/EP, pp = PP, cp = 1), giving
the ``ep`` and ``edp`` kinds (Megatron-LM's RankGenerator). Group ids are numbered
as Megatron enumerates them (unmasked coordinates, first axis fastest).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

from brctl.core.errors import InputError

KINDS = ("tp", "cp", "ep", "dp", "edp", "pp")  # every parallel-group kind, smallest first
DENSE_KINDS = ("tp", "cp", "dp", "pp")


class TopologyError(InputError):
    """The parallel sizes do not fit the machines (names the sizes and what divides what)."""


@dataclass(frozen=True)
class _Generator:
    axes: tuple[str, ...]  # axis names in order (stride 1 first)
    sizes: tuple[int, ...]

    @cached_property
    def strides(self) -> tuple[int, ...]:
        out, acc = [], 1
        for s in self.sizes:
            out.append(acc)
            acc *= s
        return tuple(out)

    def coord(self, rank: int, axis: str) -> int:
        i = self.axes.index(axis)
        return (rank // self.strides[i]) % self.sizes[i]

    # With stride s and size n of the axis, the other coordinates are the rank's
    # digits below s and above s·n: the group id is the rank with the axis's digit
    # taken out, in O(1) (the analyses call it for every outlier of every round).

    def group_id(self, rank: int, axis: str) -> int:
        i = self.axes.index(axis)
        s = self.strides[i]
        return rank % s + rank // (s * self.sizes[i]) * s

    def group_ranks(self, axis: str, gid: int) -> list[int]:
        i = self.axes.index(axis)
        s, n = self.strides[i], self.sizes[i]
        base = gid % s + gid // s * s * n
        return [base + k * s for k in range(n)]

    def n_groups(self, axis: str) -> int:
        total = 1
        for size in self.sizes:
            total *= size
        return total // self.sizes[self.axes.index(axis)]


SUPPORTED_ORDERS = ("tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp")
AXES = ("tp", "cp", "ep", "dp", "pp")


def canonical_order(order: str, sizes: dict[str, int]) -> str:
    """The supported order string that ranks the same as ``order`` for these sizes.

    Megatron accepts any order of the five axes and appends the ones left out
    (which must have size 1); axes of size 1 do not move a rank, so ``tp-pp-dp``
    with CP = EP = 1 is ``tp-cp-ep-pp-dp``. Megatron also refuses a layout where PP
    is not last, PP > 1, and the expert layers' data-parallel size (CP·DP/EP)
    differs from the dense one's (DP): their pipeline groups would differ
    (checked here when EP > 1).

    Raises:
        TopologyError: unknown or repeated axes, a size-1-only omission violated, an
            order brctl does not model, or the layout Megatron refuses.
    """
    names = order.split("-")
    if any(n not in AXES for n in names) or len(set(names)) != len(names):
        raise TopologyError(f"job.order: {order!r} is not an order of tp, cp, ep, dp, pp",
                            hint="e.g. tp-cp-ep-dp-pp (Megatron's default) or tp-cp-ep-pp-dp")
    left_out = [a for a in AXES if a not in names and sizes[a] > 1]
    if left_out:
        raise TopologyError(f"job.order: {order!r} leaves out {', '.join(left_out)}, "
                            "whose size is more than 1",
                            hint="Megatron appends only axes of size 1 to a short order")
    full = names + [a for a in AXES if a not in names]
    used = [a for a in full if sizes[a] > 1]
    found = next((o for o in SUPPORTED_ORDERS
                  if [a for a in o.split("-") if sizes[a] > 1] == used), None)
    if found is None:
        raise TopologyError(f"job.order: {order!r} is not supported for these sizes",
                            hint="use tp-cp-ep-dp-pp (Megatron's default) or tp-cp-ep-pp-dp "
                                 "(orders that differ only in axes of size 1 are the same)")
    edp = sizes["cp"] * sizes["dp"] // sizes["ep"]
    # Megatron builds the expert generator even with EP = 1 (then CP > 1 trips this
    # too); brctl checks it where expert layers exist, EP > 1. Megatron tests the
    # order as typed: tp-ep-dp-pp-cp (CP = 1) ranks as tp-cp-ep-dp-pp but is refused.
    if names[-1] != "pp" and sizes["pp"] > 1 and sizes["ep"] > 1 and edp != sizes["dp"]:
        raise TopologyError(
            f"job.order: {order!r} with pp={sizes['pp']} needs the expert data-parallel size "
            f"cp×dp/ep = {edp} to equal dp = {sizes['dp']} (Megatron refuses it otherwise)",
            hint="use tp-cp-ep-dp-pp (pipeline last), or ep = cp")
    return found


@dataclass(frozen=True)
class Topology:
    """A job's parallel layout over its machines.

    Build it with ``Topology.build``; ``rank_machines`` (rank → machine) comes from
    the live processes' RANK when known, else from the inventory's machine order.
    """

    machines: tuple[str, ...]
    rank_machines: tuple[str, ...]
    tp: int
    cp: int
    ep: int
    dp: int
    pp: int
    order: str

    @classmethod
    def build(
        cls,
        machines: Sequence[str],
        gpus: int | Sequence[int],
        *,
        tp: int = 1,
        pp: int = 1,
        cp: int = 1,
        ep: int = 1,
        order: str = "tp-cp-ep-dp-pp",
        rank_machines: Sequence[str] | None = None,
    ) -> Topology:
        """Derive DP and check that every size divides.

        Raises:
            TopologyError: sizes that do not divide, an unknown order string.
        """
        if not machines:
            raise TopologyError("job.nodes: the job has no machines")
        per = [gpus] * len(machines) if isinstance(gpus, int) else list(gpus)
        if len(per) != len(machines):
            raise TopologyError("gpus: one count per machine expected")
        world = sum(per)
        if rank_machines is None:
            rank_machines = [m for m, n in zip(machines, per) for _ in range(n)]
        elif len(rank_machines) != world:
            raise TopologyError(f"live ranks: {len(rank_machines)} ranks found, {world} expected")
        model = tp * cp * pp
        if world % model:
            raise TopologyError(
                f"job: {world} GPUs cannot be split into tp={tp} × cp={cp} × pp={pp} "
                f"(= {model}) blocks",
                hint="tp·cp·pp must divide the job's GPU count (machines × gpus)",
            )
        dp = world // model
        if (cp * dp) % ep:
            raise TopologyError(
                f"job.ep: ep={ep} must divide cp×dp = {cp}×{dp} = {cp * dp}",
                hint="expert parallelism is carved out of the data-parallel ranks",
            )
        order = canonical_order(order, {"tp": tp, "cp": cp, "ep": ep, "dp": dp, "pp": pp})
        return cls(tuple(machines), tuple(rank_machines), tp, cp, ep, dp, pp, order)

    # -- generators ---------------------------------------------------------------
    @cached_property
    def _dense(self) -> _Generator:
        sizes = {"tp": self.tp, "cp": self.cp, "ep": 1, "dp": self.dp, "pp": self.pp}
        axes = tuple(self.order.split("-"))
        return _Generator(axes, tuple(sizes[a] for a in axes))

    @cached_property
    def _expert(self) -> _Generator:
        edp = self.cp * self.dp // self.ep
        sizes = {"tp": self.tp, "cp": 1, "ep": self.ep, "dp": edp, "pp": self.pp}
        axes = tuple(self.order.split("-"))
        return _Generator(tuple("edp" if a == "dp" else a for a in axes),
                          tuple(sizes[a] for a in axes))

    def _gen(self, kind: str) -> _Generator:
        if kind in DENSE_KINDS:
            return self._dense
        if kind in ("ep", "edp"):
            return self._expert
        raise ValueError(f"unknown group kind {kind!r}; expected one of {KINDS}")

    # -- queries -------------------------------------------------------------------
    @property
    def world(self) -> int:
        """TP·CP·DP·PP."""
        return len(self.rank_machines)

    @property
    def edp(self) -> int:
        """Expert data-parallel size."""
        return self.cp * self.dp // self.ep

    def size(self, kind: str) -> int:
        """Ranks in one group of ``kind``."""
        return {"tp": self.tp, "cp": self.cp, "ep": self.ep, "dp": self.dp,
                "edp": self.edp, "pp": self.pp}[kind]

    def coord(self, rank: int, kind: str) -> int:
        """The rank's coordinate along ``kind`` (e.g. its pipeline stage for ``pp``)."""
        return self._gen(kind).coord(rank, kind)

    def group_id(self, rank: int, kind: str) -> int:
        """Which group of ``kind`` the rank belongs to."""
        return self._gen(kind).group_id(rank, kind)

    def group_ids(self, ranks: Iterable[int], kind: str) -> list[int]:
        """``group_id`` of each rank, in one pass (votes over thousands of outliers)."""
        gen = self._gen(kind)
        i = gen.axes.index(kind)
        s = gen.strides[i]
        block = s * gen.sizes[i]
        return [r % s + r // block * s for r in ranks]

    def group_ranks(self, kind: str, gid: int) -> list[int]:
        """The ranks of group ``gid`` of ``kind``, in group-rank order."""
        return self._gen(kind).group_ranks(kind, gid)

    def n_groups(self, kind: str) -> int:
        """How many groups of ``kind`` there are."""
        return self._gen(kind).n_groups(kind)

    def groups(self, kind: str) -> list[list[int]]:
        """Every group of ``kind`` (index = group id)."""
        return [self.group_ranks(kind, g) for g in range(self.n_groups(kind))]

    def machine_of(self, rank: int) -> str:
        """The machine that runs ``rank``."""
        return self.rank_machines[rank]

    def group_machines(self, kind: str, gid: int) -> list[str]:
        """The machines of one group, in machine order, without repeats."""
        return self.machines_of(self.group_ranks(kind, gid))

    def machines_of(self, ranks: Iterable[int]) -> list[str]:
        """Machines running ``ranks``, in machine order (linear in ``ranks``, not in machines)."""
        where, names = self.machine_index, self._indexed_machines
        return [names[i] for i in sorted({where[r] for r in ranks})]

    @cached_property
    def _indexed_machines(self) -> tuple[str, ...]:
        """``machines``, then any machine a live rank reported that the job does not list."""
        listed = set(self.machines)
        extra = dict.fromkeys(m for m in self.rank_machines if m not in listed)
        return self.machines + tuple(extra)

    @cached_property
    def machine_index(self) -> tuple[int, ...]:
        """rank → its machine's position (in ``machines``, unlisted ones after them)."""
        pos = {m: i for i, m in enumerate(self._indexed_machines)}
        return tuple(pos[m] for m in self.rank_machines)

    @cached_property
    def _machine_ranks(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {m: [] for m in self.machines}
        for rank, machine in enumerate(self.rank_machines):
            out.setdefault(machine, []).append(rank)
        return out

    def ranks_on(self, machine: str) -> list[int]:
        """The ranks that run on ``machine``."""
        return self._machine_ranks.get(machine, [])


def stage_of_machine(topo: Topology, machine: str) -> int | None:
    """The pipeline stage of a machine when all its ranks share one (else None)."""
    stages = {topo.coord(r, "pp") for r in topo.ranks_on(machine)}
    return stages.pop() if len(stages) == 1 else None


