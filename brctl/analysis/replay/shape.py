"""Replay's shapes: the machines' roles and the smaller job built from them.

Pure functions on typed data for ``brctl replay`` (planning and deciding are in
``brctl/analysis/replay/groups.py``): ``shape_of`` finds the machines' *roles*, the
model-parallel positions (tp, cp, pp) each machine hosts. Machines with the same role
differ only in their data-parallel index, so any ``k`` machines of every role form a
complete smaller job with DP' = k × (replicas per machine) that keeps TP and PP and
keeps each machine on its own pipeline stage.
"""

from __future__ import annotations

from dataclasses import dataclass

from brctl.analysis.topology import Topology, TopologyError
from brctl.core.errors import UsageError

Position = tuple[int, int, int]  # (tp, cp, pp) coordinates of one rank
MIN_VOTERS = 3  # a majority needs at least three comparable groups; two cannot say who is wrong


@dataclass(frozen=True)
class ReplayShape:
    """How the job's machines fall into roles, and the replay job built from them.

    Attributes:
        classes: machines of each role, in machine (DP) order; all the same length.
        roles: the positions each class hosts.
        k: machines of each role in one replay job.
        dp: the replay job's data-parallel size DP'.
        slot_classes: the role class of each slot (node rank) of the replay job.
        rank_coords: (tp, cp, dp, pp) of every rank of the replay job, rank order.
        gpus, tp, cp, pp, order: the job's per-machine GPUs and parallel sizes.
    """

    classes: tuple[tuple[str, ...], ...]
    roles: tuple[frozenset[Position], ...]
    k: int
    dp: int
    slot_classes: tuple[int, ...]
    rank_coords: tuple[tuple[int, int, int, int], ...]
    gpus: int
    tp: int
    cp: int
    pp: int
    order: str

    @property
    def rows(self) -> int:
        """Machines per role (R)."""
        return len(self.classes[0])

    @property
    def slots(self) -> int:
        """Machines per replay job (k × number of roles)."""
        return len(self.slot_classes)

    @property
    def n_groups(self) -> int:
        """Disjoint replay jobs in a full round (g = R / k)."""
        return self.rows // self.k

    @property
    def machines(self) -> tuple[str, ...]:
        """Every machine the plan covers."""
        return tuple(m for cls in self.classes for m in cls)

    def class_of(self) -> dict[str, int]:
        """Machine → role class index."""
        return {m: c for c, cls in enumerate(self.classes) for m in cls}


def _role(topo: Topology, machine: str) -> frozenset[Position]:
    return frozenset((topo.coord(r, "tp"), topo.coord(r, "cp"), topo.coord(r, "pp"))
                     for r in topo.ranks_on(machine))


def _classes(topo: Topology) -> tuple[list[frozenset[Position]], list[list[str]]]:
    roles: list[frozenset[Position]] = []
    members: list[list[str]] = []
    for machine in topo.machines:
        role = _role(topo, machine)
        if role in roles:
            members[roles.index(role)].append(machine)
            continue
        clash = [r for r in roles if r & role]
        if clash:
            raise TopologyError(
                f"replay: machine {machine} hosts positions (tp, cp, pp) that other machines "
                "hold only partly, so machines cannot be swapped between replay groups",
                hint="replay needs every machine to host a whole set of model-parallel positions",
            )
        roles.append(role)
        members.append([machine])
    sizes = {len(m) for m in members}
    if len(sizes) != 1:
        raise TopologyError("replay: the roles (pipeline stages) have different machine counts: "
                            + ", ".join(str(len(m)) for m in members))
    return roles, members


def _k_preference(rows: int, n_roles: int) -> list[int]:
    """Machines per role in one replay job, best first: the smallest jobs that still
    give a voting majority and a 2-round grid, then the rest by size (most groups)."""
    ks = [k for k in range(1, rows + 1) if rows % k == 0]
    grid = [k for k in ks if rows // k >= max(MIN_VOTERS, k * n_roles)]
    return grid[:1] + [k for k in ks if k not in grid[:1]]


def shape_of(topo: Topology, dp: int | None = None) -> ReplayShape:
    """Roles and the replay job for ``topo`` with DP' = ``dp`` (default: smallest that votes).

    Args:
        topo: the job's topology.
        dp: the replay's data-parallel size DP', or None for the default.

    Raises:
        TopologyError: machines whose positions overlap, unequal roles, mixed GPU counts.
        UsageError: a ``dp`` that does not split every role's machines evenly.
    """
    gpus = {len(topo.ranks_on(m)) for m in topo.machines}
    if len(gpus) != 1:
        raise TopologyError("replay: every job machine must run the same number of ranks")
    n_gpus = gpus.pop()
    roles, members = _classes(topo)
    rows = len(members[0])
    per_machine = n_gpus // len(roles[0])
    if dp is None:
        for k in _k_preference(rows, len(roles)):
            try:
                return _replay_shape(topo, roles, members, n_gpus, k)
            except TopologyError:
                continue  # e.g. PP does not divide a job of k rows: try the next size
        raise TopologyError(
            "replay: no smaller job of whole rows keeps TP, CP and PP for this job "
            f"({rows} machines per pipeline role, {n_gpus} GPUs each)",
            hint="pick --dp explicitly, or replay a job whose machines split into rows")
    valid = [k * per_machine for k in range(1, rows + 1) if rows % k == 0]
    if dp not in valid:
        raise UsageError(
            f"--dp {dp}: the replay DP' must be one of {', '.join(map(str, valid))} "
            f"for this job ({rows} machines per pipeline role, {per_machine} "
            "data-parallel replicas per machine)")
    k = dp // per_machine
    try:
        shape = _replay_shape(topo, roles, members, n_gpus, k)
    except TopologyError as exc:
        raise UsageError(f"--dp {dp}: the replay job cannot be built: {exc.message}") from None
    if shape.dp != dp:  # never run another DP' than the one asked for
        raise UsageError(f"--dp {dp}: {k} machine(s) per role make a replay job with "
                         f"DP'={shape.dp}, not {dp}")
    return shape


def _replay_shape(topo: Topology, roles: list[frozenset[Position]], members: list[list[str]],
                  n_gpus: int, k: int) -> ReplayShape:
    """The replay job of ``k`` machines per role (raises TopologyError when it does not fit)."""
    slots = [f"s{i}" for i in range(k * len(roles))]
    try:
        replay_topo = Topology.build(slots, n_gpus, tp=topo.tp, pp=topo.pp, cp=topo.cp,
                                     order=topo.order)
    except TopologyError as exc:
        raise TopologyError(f"replay: a job of {len(slots)} machine(s) ({k} per role): "
                            f"{exc.message}") from None
    slot_classes = []
    for slot in slots:
        role = _role(replay_topo, slot)
        if role not in roles:
            raise TopologyError(f"replay: a DP'={replay_topo.dp} job cannot keep each machine "
                                "on its pipeline stage (its machines host other positions)")
        slot_classes.append(roles.index(role))
    coords = tuple((replay_topo.coord(r, "tp"), replay_topo.coord(r, "cp"),
                    replay_topo.coord(r, "dp"), replay_topo.coord(r, "pp"))
                   for r in range(replay_topo.world))
    return ReplayShape(
        classes=tuple(tuple(m) for m in members), roles=tuple(roles), k=k,
        dp=replay_topo.dp, slot_classes=tuple(slot_classes), rank_coords=coords,
        gpus=n_gpus, tp=topo.tp, cp=topo.cp, pp=topo.pp, order=topo.order,
    )
