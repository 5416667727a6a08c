"""``brctl nodes``: the inventory's machines and, with a job, its parallel groups by machine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from brctl.analysis.inventory import Inventory
from brctl.analysis.jobtopo import job_topology
from brctl.analysis.nodeset import fold
from brctl.analysis.topology import KINDS, Topology


@dataclass(frozen=True)
class GroupRow:
    """One parallel group: its kind, index, ranks and machines."""

    kind: str
    index: int
    ranks: tuple[int, ...]
    nodes: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """JSON form (nodes as a list, plus the folded set)."""
        return {"index": self.index, "ranks": list(self.ranks), "nodes": list(self.nodes),
                "nodeset": fold(self.nodes)}


@dataclass(frozen=True)
class NodesReport:
    """The inventory as brctl resolved it."""

    inventory: Inventory
    selected: tuple[str, ...]
    topology: Topology | None
    groups: dict[str, list[GroupRow]]

    def role(self, name: str) -> str:
        """job, standby or spare-listed ("other")."""
        inv = self.inventory
        if inv.job and name in inv.job.nodes:
            return "job"
        return "standby" if name in inv.standby else "other"


def describe(inv: Inventory, include: str | None = None, exclude: str | None = None) -> NodesReport:
    """Resolve the selection and, when a job is defined, every group of every kind."""
    selected = tuple(n.name for n in inv.select(include, exclude))
    topo = job_topology(inv) if inv.job else None
    groups: dict[str, list[GroupRow]] = {}
    if topo is not None:
        for kind in KINDS:
            if kind in ("ep", "edp") and topo.ep == 1:
                continue
            groups[kind] = [
                GroupRow(kind, g, tuple(ranks), tuple(topo.machines_of(ranks)))
                for g, ranks in enumerate(topo.groups(kind))
            ]
    return NodesReport(inv, selected, topo, groups)
