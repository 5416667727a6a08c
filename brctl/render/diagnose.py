"""Rendering of ``brctl diagnose``: a rich tree (symptom → stages → machines → evidence)."""

from __future__ import annotations

from brctl.core.nodeset import fold_by
from brctl.operations.diagnose import DiagnoseReport
from brctl.render.output import Output, escape

_STYLE = {"pass": "green", "fail": "bold red", "warn": "yellow", "skip": "dim", "error": "magenta"}
_DECISION = {"evict": "bold red", "rollback": "bold yellow", "replay": "bold magenta",
             "reattempt": "bold green"}


def render(out: Output, report: DiagnoseReport) -> None:
    """The tree for humans, or the ``brctl.diagnose/1`` JSON document."""
    if out.json:
        out.emit_json("diagnose", report.to_json(), status=report.exit_code)
        return
    from rich.tree import Tree

    book = report.found.playbook
    tree = Tree(f"[bold]{escape(report.job)}[/]: {escape(book.symptom)} "
                f"[dim](playbook {escape(book.name)})[/]")
    if report.found.hits:
        ev = tree.add("evidence")
        for hit in report.found.hits[:12]:
            ev.add(f"{escape(hit.node)}: {escape(hit.text)}")
    for stage in report.stages:
        node = tree.add(f"[bold]{stage.name}[/] [dim]{len(stage.nodes_tested)} tested, "
                        f"{stage.seconds:.1f}s[/]")
        for names, (status, evidence), _count in fold_by(
                {v.node: (v.status, v.evidence[:3]) for v in stage.verdicts}):
            branch = node.add(f"[{_STYLE[status]}]{status}[/] {escape(names)}")
            for line in evidence:
                branch.add(escape(line))
    for name, why in report.incomplete.items():
        tree.add(f"[magenta]no verdict[/] {escape(name)}: {escape(why)}")
    out.console.print(tree)
    style = _DECISION.get(report.decision, "bold")
    faulty = f" {', '.join(report.faulty)}" if report.faulty else ""
    out.console.print(f"decision: [{style}]{report.decision}[/]{escape(faulty)}")
    out.console.print(f"reason: {escape(report.reason)}")
    for where, notes in report.evidence_notes.items():
        for note in notes:
            out.info(f"{where}: {note}")
