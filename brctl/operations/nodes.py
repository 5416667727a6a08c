"""``brctl nodes``: the inventory's machines and, with a job, its parallel groups by machine."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from brctl.analysis.inventory import Inventory
from brctl.analysis.jobtopo import job_topology
from brctl.analysis.topology import KINDS, Topology
from brctl.core import nodeset
from brctl.core.errors import ExitCode, UsageError, exit_code_of
from brctl.core.nodeset import fold
from brctl.core.transport import NodeState, RunResult
from brctl.remote.probes import ProbeResult, ProbeRunner

_SYSINFO_TEXT = ("hostname", "python", "ssh_connection", "brctl_version")


@dataclass(frozen=True)
class GroupRow:
    """One parallel group: its kind, index, ranks and machines."""

    kind: str
    index: int
    ranks: tuple[int, ...]
    nodes: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """JSON form (nodes as a list, plus the folded set)."""
        return {"index": self.index, "ranks": list(self.ranks), "members": list(self.nodes),
                "nodeset": fold(self.nodes)}


@dataclass(frozen=True)
class SysInfo:
    """One machine's ``sysinfo`` answer, read once at the boundary (None: not said)."""

    state: str  # the transport's node state
    error: str | None  # why there is no answer
    hostname: str | None = None
    python: str | None = None
    cpus: int | None = None
    ssh_connection: str | None = None
    brctl_version: str | None = None

    @property
    def ok(self) -> bool:
        """The machine answered."""
        return self.error is None

    @classmethod
    def from_probe(cls, result: ProbeResult) -> SysInfo:
        """Fields of the wrong type in the node's document are left out (None)."""
        doc = result.document or {}
        text = {k: v for k in _SYSINFO_TEXT if isinstance(v := doc.get(k), str)}
        cpus = doc.get("cpus")
        return cls(result.run.state.value, None if result.ok else (result.error or "no answer"),
                   cpus=cpus if isinstance(cpus, int) and not isinstance(cpus, bool) else None,
                   **text)

    def to_json(self) -> dict[str, object]:
        """The per-machine object of ``nodes --probe --json``."""
        return {"state": self.state, "ok": self.ok, "error": self.error,
                "hostname": self.hostname, "python": self.python, "cpus": self.cpus,
                "ssh_connection": self.ssh_connection, "brctl_version": self.brctl_version}


@dataclass(frozen=True)
class NodesReport:
    """The inventory as brctl resolved it (and, with a probe, what each machine said)."""

    inventory: Inventory
    selected: tuple[str, ...]
    topology: Topology | None
    groups: dict[str, list[GroupRow]]
    probes: dict[str, SysInfo] | None = None
    kinds: tuple[str, ...] = ()  # the group kinds to show, as asked (--groups)

    @property
    def exit_code(self) -> ExitCode:
        """4 when a probed machine was refused (a safety rule), 3 when one did not answer, else 0."""
        probes = self.probes.values() if self.probes else ()
        return exit_code_of(refused=any(p.state == NodeState.REFUSED.value for p in probes),
                            incomplete=any(not p.ok for p in probes))

    def to_json(self) -> dict[str, Any]:
        """The payload of ``brctl.nodes/1``: the selected machines, the job, its groups."""
        inv, topo = self.inventory, self.topology
        return {
            "inventory": inv.source,
            "nodes": {
                n.name: {"address": n.address, "port": n.port, "user": n.user,
                         "connection": n.connection, "gpus": n.gpus, "labels": dict(n.labels),
                         "role": self.role(n.name),
                         **({"probe": self.probes[n.name].to_json()}
                            if self.probes is not None and n.name in self.probes else {})}
                for n in (inv.nodes[s] for s in self.selected)
            },
            "job": None if inv.job is None else {
                "name": inv.job.name, "source": inv.job.source, "state": inv.job.state,
                **({"members": []} if topo is None else {
                    "members": list(topo.machines), "world": topo.world,
                    "tp": topo.tp, "cp": topo.cp, "ep": topo.ep, "dp": topo.dp, "pp": topo.pp,
                    "order": topo.order})},
            "groups": {k: [g.to_json() for g in rows] for k, rows in self.groups.items()},
        }

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
    kinds: str = "pp,dp",
    *,
    probe: ProbeRunner | None = None,
    timeout: float | None = None,
    on_done: Callable[[RunResult], None] | None = None,
) -> NodesReport:
    """Resolve the selection and, when a job is defined, every group of every kind.

    With ``probe``, also run the ``sysinfo`` probe on every selected machine (it proves
    the machine answers, which Python it has, and who it is: ``$SSH_CONNECTION``).
    ``kinds``: the group kinds to show (``tp,cp,ep,dp,edp,pp`` or ``all``), checked
    before any machine is contacted.

    Raises:
        UsageError: an unknown group kind (with a job).
    """
    selected = tuple(n.name for n in inv.select(include, exclude))
    topo = job_topology(inv) if inv.job and inv.job.nodes else None  # a waiting Slurm job: none
    groups: dict[str, list[GroupRow]] = {}
    if topo is not None:
        for kind in KINDS:
            if kind in ("ep", "edp") and topo.ep == 1:
                continue
            groups[kind] = [
                GroupRow(kind, g, tuple(ranks), tuple(topo.machines_of(ranks)))
                for g, ranks in enumerate(topo.groups(kind))
            ]
    wanted = list(groups) if kinds == "all" else [k.strip() for k in kinds.split(",") if k.strip()]
    unknown = [k for k in wanted if k not in groups and k not in ("ep", "edp")]
    if unknown and topo is not None:
        raise UsageError(f"--groups: unknown kind {unknown[0]!r}", hint="kinds: tp,cp,ep,dp,edp,pp or all")
    probes = None
    if probe is not None:
        answers = probe.run([inv.nodes[n] for n in selected], "brctl.diagnostics.sysinfo", {},
                            timeout=timeout, concurrency=inv.ssh.fanout, on_done=on_done)
        probes = {name: SysInfo.from_probe(result) for name, result in answers.items()}
    return NodesReport(inv, selected, topo, groups, probes, tuple(wanted))


SetMode = Literal["fold", "expand", "count"]


@dataclass(frozen=True)
class NodeSetReport:
    """``brctl nodes --fold|--expand|--count``: the union of the given node sets."""

    mode: SetMode
    members: tuple[str, ...]  # in written order

    @property
    def folded(self) -> str:
        """The members folded (empty text for an empty set)."""
        return fold(self.members) if self.members else ""

    exit_code = ExitCode.OK

    def to_json(self) -> dict[str, Any]:
        """JSON form: the folded set, its members and their count."""
        return {"mode": self.mode, "nodeset": self.folded, "members": list(self.members),
                "count": len(self.members)}


def node_sets(patterns: Sequence[str], mode: SetMode, inventory: Callable[[], Inventory]) -> NodeSetReport:
    """Union of ``patterns`` as ClusterShell's ``nodeset`` computes it.

    ``inventory`` is called only when a pattern names an ``@group``, so pure folding
    and expansion need no inventory.

    Raises:
        InputError: a malformed pattern, an unknown group or no inventory for a group.
    """
    members: dict[str, None] = {}
    for pattern in patterns:
        members.update(dict.fromkeys(nodeset.expand(pattern, lambda name: inventory().group(name))))
    return NodeSetReport(mode, tuple(members))
