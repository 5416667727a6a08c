"""``brctl nodes``: the inventory's machines and, with a job, its parallel groups by machine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from brctl.analysis.inventory import Inventory
from brctl.analysis.jobtopo import job_topology
from brctl.analysis.topology import KINDS, Topology
from brctl.core.errors import ExitCode
from brctl.core.nodeset import fold
from brctl.remote.probes import ProbeResult, ProbeRunner


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
    """The inventory as brctl resolved it (and, with a probe, what each machine said)."""

    inventory: Inventory
    selected: tuple[str, ...]
    topology: Topology | None
    groups: dict[str, list[GroupRow]]
    probes: dict[str, ProbeResult] | None = None

    @property
    def exit_code(self) -> ExitCode:
        """3 when a probed machine did not answer, else 0."""
        if self.probes and any(not p.ok for p in self.probes.values()):
            return ExitCode.INCOMPLETE
        return ExitCode.OK

    def role(self, name: str) -> str:
        """job, standby or spare-listed ("other")."""
        inv = self.inventory
        if inv.job and name in inv.job.nodes:
            return "job"
        return "standby" if name in inv.standby else "other"


def describe(
    inv: Inventory,
    include: str | None = None,
    exclude: str | None = None,
    *,
    probe: ProbeRunner | None = None,
    timeout: float | None = None,
) -> NodesReport:
    """Resolve the selection and, when a job is defined, every group of every kind.

    With ``probe``, also run the ``sysinfo`` probe on every selected machine (it proves
    the machine answers, which Python it has, and who it is: ``$SSH_CONNECTION``).
    """
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
    probes = None
    if probe is not None:
        probes = probe.run([inv.nodes[n] for n in selected], "brctl.diagnostics.sysinfo", {},
                           timeout=timeout, concurrency=inv.ssh.fanout)
    return NodesReport(inv, selected, topo, groups, probes)
