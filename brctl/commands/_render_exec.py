"""Rendering of ``brctl exec``: clush -b style blocks, then a per-state summary."""

from __future__ import annotations

from brctl.core.nodeset import fold_by
from brctl.core.transport import NodeState
from brctl.operations.exec_ import ExecReport
from brctl.render import Output, escape


def render(out: Output, report: ExecReport) -> None:
    """Folded blocks of identical output, a state summary on stderr; or the JSON."""
    if out.json:
        out.emit_json("exec", {
            "argv": list(report.argv),
            "nodes": report.results.to_json(),
        })
        return
    for nodes, r, count in report.results.folded():
        status = r.state.value if r.state is not NodeState.FAILED else f"exit {r.exit_code}"
        colour = "green" if r.state is NodeState.OK else "red"
        out.console.print(f"[bold]---------------- {escape(nodes)} ({count}) [{colour}]{status}[/]")
        if r.stdout:
            out.console.print(escape(r.stdout.rstrip("\n")))
        if r.stderr.strip():
            out.console.print(f"[dim]{escape(r.stderr.rstrip())}[/]")
    states = fold_by({n: r.state.value for n, r in report.results.items()})
    summary = "; ".join(f"{state}: {nodes}" for nodes, state, _ in states)
    out.err.print(f"[dim]{escape(summary)}[/]")
