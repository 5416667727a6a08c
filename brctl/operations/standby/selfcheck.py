"""Self-check of standby machines: the health sweep, then the diagnose ladder's
machine-local stages (EUD where dcgmi exists, the intra-machine all-to-all) on the
machines whose health passed; ``analysis.daemon.policy.standby_outcome`` judges each.

Shared by ``brctl standby check`` and the daemon's ``LiveHooks.check``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from brctl.analysis.daemon.policy import StandbyOutcome, standby_outcome
from brctl.analysis.inventory import Inventory
from brctl.analysis.playbook import StageName
from brctl.core.transport import Node, NodeState, Transport
from brctl.operations import Track, untracked
from brctl.remote.probes import ProbeRunner
from brctl.state import Store


@dataclass(frozen=True)
class PoolCheck:
    """One pool machine's self-check."""

    outcome: StandbyOutcome
    detail: str
    answered: bool  # the health sweep got an answer (False: no verdict, the run is incomplete)
    refused: bool = False  # brctl would not run the probe there (a safety rule): exit 4


def check_pool(inv: Inventory, transport: Transport, nodes: Sequence[Node], *, store: Store,
               runner: ProbeRunner, timeout_scale: float,
               track: Track = untracked) -> dict[str, PoolCheck]:
    """Self-check ``nodes``: node → its outcome, the detail, and whether it answered
    (``track``: progress, the health sweep then each stage)."""
    from brctl.operations.diagnose import Options, self_check
    from brctl.operations.health import sweep

    report = sweep(inv, transport, nodes, store, runner=runner,
                   timeout=inv.health.timeout * timeout_scale,
                   on_done=track("health", [n.name for n in nodes]))
    health: dict[str, tuple[bool, str]] = {}
    for name, verdict in report.nodes.items():
        bad = [f"{c.name}: {c.message}" for c in verdict.checks if c.status == "fail"]
        ok = verdict.answered and not bad
        health[name] = (ok, "health ok" if ok else "; ".join(bad) or (verdict.error or verdict.status))
    healthy = [n for n in nodes if health.get(n.name, (False, ""))[0]]
    stages: dict[str, list[tuple[str, str, Sequence[str]]]] = {n.name: [] for n in nodes}
    wanted = cast(list[StageName], list(inv.daemon.standby_stages))
    if healthy and wanted:
        opts = Options(timeout_scale=timeout_scale, concurrency=inv.ssh.fanout, track=track)
        for stage in self_check(inv, transport, healthy, opts, stages=wanted, runner=runner):
            for v in stage.verdicts:
                stages[v.node].append((stage.name, v.status, v.evidence))
    out = {}
    for n in nodes:
        outcome, detail = standby_outcome(*health.get(n.name, (False, "no health verdict")),
                                          stages[n.name])
        answered = n.name in report.nodes and report.nodes[n.name].answered
        refused = n.name in report.nodes and report.nodes[n.name].status == NodeState.REFUSED.value
        out[n.name] = PoolCheck(outcome, detail, answered, refused)
    return out
