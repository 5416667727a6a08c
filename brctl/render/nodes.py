"""Rendering of ``brctl nodes``."""

from __future__ import annotations

from brctl.core.nodeset import fold, fold_by
from brctl.operations.nodes import NodeSetReport, NodesReport, SysInfo
from brctl.render.output import Output, escape, table


def render(out: Output, report: NodesReport) -> None:
    """Table or JSON."""
    inv = report.inventory
    if out.json:  # without a probe the document has no status: nothing was asked of a machine
        out.emit_json("nodes", report.to_json(),
                      status=report.exit_code if report.probes is not None else None)
        return
    keyed = {
        s: (n.connection, n.gpus, ",".join(f"{k}={v}" for k, v in sorted(n.labels.items())),
            report.role(s))
        for s in report.selected
        for n in [inv.nodes[s]]
    }
    rows = []
    for nodes, key, _ in fold_by(keyed):
        members = [s for s in report.selected if keyed[s] == key]
        rows.append((nodes, fold(inv.nodes[s].address for s in members), *key))
    out.console.print(table(["nodes", "address", "connection", "gpus", "labels", "role"], rows,
                            title=f"{len(report.selected)} machines in {inv.source}"))
    if report.probes is not None:
        _render_probes(out, report.probes)
    topo = report.topology
    if inv.job is not None and inv.job.source != "inventory":
        out.console.print(f"\njob {escape(inv.job.name)}: machines from "
                          f"{escape(inv.job.source)}")
    if topo is None or inv.job is None:
        return
    out.console.print(
        f"\njob {escape(inv.job.name)}: {len(topo.machines)} machines, world {topo.world} = "
        f"tp {topo.tp} × cp {topo.cp} × dp {topo.dp} × pp {topo.pp}"
        + (f", ep {topo.ep} (expert dp {topo.edp})" if topo.ep > 1 else "")
        + f", order {topo.order}"
    )
    for kind in report.kinds:
        rows_k = report.groups.get(kind, [])
        if not rows_k:
            continue
        by_nodes: dict[str, list[int]] = {}
        for g in rows_k:
            by_nodes.setdefault(fold(g.nodes), []).append(g.index)
        out.console.print(table(
            [f"{kind} groups", "machines", "count"],
            [(fold([f"{i}" for i in idx]) if len(idx) > 1 else str(idx[0]), nodes, len(g_nodes))
             for nodes, idx in by_nodes.items()
             for g_nodes in [next(g.nodes for g in rows_k if g.index == idx[0])]],
        ))


def _render_probes(out: Output, probes: dict[str, SysInfo]) -> None:
    keyed = {}
    for name, p in probes.items():
        keyed[name] = (f"python {p.python}, {p.cpus} cpus" if p.ok else f"no answer: {p.error}")
    rows = [(nodes, key) for nodes, key, _ in fold_by(keyed)]
    out.console.print(table(["machines", "probe"], rows))


def render_sets(out: Output, report: NodeSetReport) -> None:
    """One line, as ClusterShell's nodeset prints it; or JSON."""
    if out.json:
        out.emit_json("nodes.set", report.to_json())
        return
    # Plain text, never rich markup: '[1-3]' and '@' are node-set syntax here.
    text = {"count": str(len(report.members)), "expand": " ".join(report.members)}.get(
        report.mode, report.folded)
    out.plain(text + "\n")
