"""Checkpoint backup placement, the proof: evict every group and count the shards lost.

``verify_plan`` evicts every group instance of every kind (and every single machine)
and lists the shards that would lose both copies; with ``lossprob`` it gives the exact
probability that k random machine failures lose some shard. The planning itself is in
``brctl/analysis/placement/plan.py``. Pure functions on typed data: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from brctl.analysis.placement.conflicts import ConflictIndex
from brctl.analysis.placement.lossprob import loss_probability
from brctl.analysis.topology import Topology
from brctl.core.errors import ExitCode


@dataclass(frozen=True)
class Violation:
    """Evicting ``nodes`` (one group, or one machine) loses both copies of ``lost``' shards."""

    kind: str  # a group kind, "node" for a single machine, "missing" for no backup
    group: int | None
    nodes: tuple[str, ...]
    lost: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        """The ``violations`` entry of ``brctl ckpt verify --json``."""
        return {"kind": self.kind, "group": self.group, "members": list(self.nodes),
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

    def to_json(self) -> dict[str, Any]:
        """The payload of ``brctl.ckpt.verify/1``."""
        return {"ok": self.ok, "evictions": self.evictions, "machines": self.machines,
                "violations": [v.to_json() for v in self.violations],
                "loss_probability": {str(k): p for k, p in self.loss_probability.items()}}


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
    probs = loss_probability(universe, backups, owners=names)
    return Verification(evictions, tuple(violations),
                        {k: (float(p) if p is not None else None) for k, p in probs.items()},
                        len(universe))
