"""Rendering of ``brctl exec``: clush -b style blocks (or clush -L lines), or the JSON.

Remote stdout goes to stdout and remote stderr to stderr, as ssh, clush and pdsh
keep them: ``brctl exec CMD 2>/dev/null | sort`` sees only what the nodes printed
on stdout. The per-state summary goes to stderr only when something was not ok
(or with -v): a healthy run leaves stderr empty.
"""

from __future__ import annotations

import re

from brctl.core.nodeset import fold_by
from brctl.core.transport import NodeState
from brctl.operations.exec_ import ExecReport
from brctl.render.output import Output, node_text


def render(out: Output, report: ExecReport, *, lines: bool = False) -> None:
    """Folded blocks of identical output (or ``node: line`` in machine order), a summary;
    or the JSON."""
    if out.json:
        out.emit_json("exec", report.to_json(), status=report.exit_code)
        return
    if lines:
        _lines(out, report)
    else:
        _blocks(out, report)
    states = fold_by({n: r.state.value for n, r in report.results.items()})
    if out.verbose or any(r.state is not NodeState.OK for r in report.results.values()):
        summary = "; ".join(f"{state}: {nodes}" for nodes, state, _ in states)
        out.err.print(node_text(summary, style="dim"))


HEADER = "---------------- "  # a block's first line: HEADER, its nodes, their count and state
_HEADER_LIKE = re.compile(r"^-(?=-{15} )", re.MULTILINE)


# Node text is printed as rich ``Text``, never inside markup: rich.markup.escape
# doubles a trailing backslash, which shows when nothing follows it (``dir C:\``).
def _blocks(out: Output, report: ExecReport) -> None:
    keyed = {n: (r.state, r.exit_code, r.stdout) for n, r in report.results.items()}
    for nodes, (state, code, stdout), count in fold_by(keyed):
        status = state.value if state is not NodeState.FAILED else f"exit {code}"
        colour = "green" if state is NodeState.OK else "red"
        out.console.print(node_text(f"{HEADER}{nodes} ({count}) ", style="bold")
                          .append(status, style=f"bold {colour}"))
        if stdout:  # a node's line that reads as a header (another node's "ok") is shown escaped
            out.node_out(_HEADER_LIKE.sub(r"\\x2d", stdout.rstrip("\n")))
    for nodes, stderr, _ in fold_by({n: r.stderr for n, r in report.results.items()
                                     if r.stderr.strip()}):
        for line in stderr.rstrip("\n").split("\n"):
            out.node_err(f"{nodes}: {line}")


def _lines(out: Output, report: ExecReport) -> None:
    for name, result in report.results.items():  # inventory (machine) order
        for line in _split(result.stdout):
            out.node_out(f"{name}: {line}")
        for line in _split(result.stderr):
            out.node_err(f"{name}: {line}")
        if not result.state.ran:
            out.err.print(node_text(f"{name}: ").append(result.state.value, style="red"))


def _split(text: str) -> list[str]:
    """``text``'s lines, cut at newlines only: ``str.splitlines`` also cuts at ``\\r``, form
    feed, U+0085, U+2028..., which then vanish instead of being shown escaped (``\\x0d``)
    as in the blocks."""
    lines = text.split("\n")
    return lines[:-1] if lines[-1] == "" else lines
