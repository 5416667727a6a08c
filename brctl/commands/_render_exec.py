"""Rendering of ``brctl exec``: clush -b style blocks, then a per-state summary."""

from __future__ import annotations

from brctl.core.transport import NodeState
from brctl.operations.exec_ import ExecReport
from brctl.render import Output, escape, fold_by


def render(out: Output, report: ExecReport) -> None:
    """Folded blocks of identical output, a state summary on stderr; or the JSON."""
    if out.json:
        out.emit_json("exec", {
            "argv": list(report.argv),
            "nodes": {name: r.to_json() for name, r in report.results.items()},
        })
        return
    keyed = {n: (r.state, r.exit_code, r.stdout, r.stderr) for n, r in report.results.items()}
    for nodes, (state, code, stdout, stderr), count in fold_by(keyed):
        status = state.value if state is not NodeState.FAILED else f"exit {code}"
        colour = "green" if state is NodeState.OK else "red"
        out.console.print(f"[bold]---------------- {escape(nodes)} ({count}) [{colour}]{status}[/]")
        if stdout:
            out.console.print(escape(stdout.rstrip("\n")))
        if stderr.strip():
            out.console.print(f"[dim]{escape(stderr.rstrip())}[/]")
    states = fold_by({n: r.state.value for n, r in report.results.items()})
    summary = "; ".join(f"{state}: {nodes}" for nodes, state, _ in states)
    out.err.print(f"[dim]{escape(summary)}[/]")
