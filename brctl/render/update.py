"""Rendering of ``brctl update``: folded per-machine outcomes, drift highlighted; or JSON."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Optional

from brctl.analysis.update import Event, Pending
from brctl.core.nodeset import fold_by
from brctl.operations.jobadapter import HookRun
from brctl.operations.update.preview import Preview
from brctl.operations.update.report import (
    NodeOutcome,
    PushReport,
    StatusReport,
    SwitchReport,
)
from brctl.render.output import Output, escape, node_text, table, visible

_GOOD = {"staged", "present", "switched", "already", "ok"}


def _outcomes(out: Output, nodes: Mapping[str, NodeOutcome]) -> None:
    keyed = {n: (o.state, o.message) for n, o in nodes.items()}
    for folded, (state, message), _count in fold_by(keyed):
        colour = "green" if state in _GOOD else "yellow" if state == "reverted" else "red"
        tail = f": {escape(message)}" if message else ""
        out.console.print(f"{escape(folded)}: [{colour}]{state}[/]{tail}")


def _hook(out: Output, hook: Optional[HookRun], wanted: bool) -> None:
    if hook is None:
        if wanted:
            out.warn("no job.restart_command in the inventory: restart the job yourself")
        return
    colour = "green" if hook.ok else "red"
    code = "timed out" if hook.exit_code is None else f"exit {hook.exit_code}"
    out.console.print(f"restart hook: [{colour}]{code}[/] ({escape(' '.join(hook.argv))})")
    if not hook.ok and hook.stderr.strip():  # its lines as it printed them
        out.console.print(node_text(hook.stderr.strip(), style="dim"))


def render_push(out: Output, report: PushReport) -> None:
    """Per-machine staging outcome, then what happens next."""
    if out.json:
        out.emit_json("update.push", report.to_json(), status=report.exit_code)
        return
    out.console.print(f"release [bold]{escape(report.version)}[/] sha256 "
                      f"{report.sha256[:12]} ({report.size} bytes, {escape(report.source)}); "
                      f"sent {report.bytes_sent} bytes")
    _outcomes(out, report.nodes)
    if report.switch is not None:
        _switch_body(out, report.switch, restart_wanted=True)
    else:
        out.console.print(escape(report.message))


def _switch_body(out: Output, report: SwitchReport, restart_wanted: bool) -> None:
    _outcomes(out, report.nodes)
    colour = {"ok": "green", "noop": "green", "rolled_back": "yellow"}.get(report.outcome, "red")
    out.console.print(f"{report.action} {escape(report.version or '-')}: "
                      f"[{colour}]{report.outcome}[/]: {escape(report.reason)}")
    _hook(out, report.restart, restart_wanted and report.outcome == "ok")


def render_switch(out: Output, report: SwitchReport) -> None:
    """Apply/rollback: per-machine outcome and the verdict with its reason."""
    if out.json:
        out.emit_json(f"update.{report.action}", report.to_json(), status=report.exit_code)
        return
    _switch_body(out, report, restart_wanted=False)


def _pending_line(out: Output, pending: Optional[Pending], due: bool) -> str:
    if pending is None:
        return "no pending release"
    kind = "urgent" if pending.urgent else "lazy"
    when = "due now" if due else f"due {out.stamp(pending.due_at)}"
    return f"pending {pending.version} ({kind}, {when})"


def render_status(out: Output, report: StatusReport) -> None:
    """Job version and pending release, then machines folded by (current, pending staged)."""
    if out.json:
        out.emit_json("update.status", report.to_json(), status=report.exit_code)
        return
    from rich.text import Text

    version = f"{report.version} (sha256 {report.sha256[:12]})" if report.version and \
        report.sha256 else "none recorded"
    out.console.print(f"job {escape(report.job)}: version {escape(version)}; "
                      f"{escape(_pending_line(out, report.pending, report.due))}")
    keyed = {}
    for name, s in report.nodes.items():
        staged = "-" if s.pending_staged is None else "staged" if s.pending_staged else "missing"
        keyed[name] = (s.state, s.current or "-", staged, s.drift, s.error)
    rows: list[tuple[str, str, object, str]] = []
    for folded, (state, current, staged, drifted, error), count in fold_by(keyed):
        # a node's version and error are Text, never markup (nor emoji: ":smiley:" stays text)
        cur: object = current
        if state != "ok":
            cur = Text.assemble((state, "red"), f": {visible(error, one_line=True)}")
        elif drifted:
            cur = Text(f"{visible(current, one_line=True)} DRIFT", style="red bold")
        rows.append((folded, str(count), cur, staged))
    out.console.print(table(("MACHINES", "N", "CURRENT", "PENDING"), rows))
    if report.drifted:
        from brctl.core.nodeset import fold

        out.console.print(f"[red]drift:[/] {escape(fold(report.drifted))} not on "
                          f"{escape(report.version or 'the majority version')}; "
                          "`brctl update apply` switches them back")


def render_history(out: Output, job: str, events: Sequence[Event]) -> None:
    """One row per event, oldest first."""
    if out.json:
        out.emit_json("update.history", {"job": job, "events": [e.to_json() for e in events]})
        return
    if not events:
        out.console.print(f"job {escape(job)}: no update recorded")
        return
    from brctl.core.nodeset import fold

    rows = [(out.stamp(e.at), e.who, e.action, e.version, e.sha256[:8],
             e.from_version or "-",
             fold(e.machines), e.outcome) for e in events]
    out.console.print(table(("WHEN", "WHO", "ACTION", "VERSION", "SHA256", "FROM", "MACHINES",
                             "OUTCOME"), rows, title=f"job {job}"))


def render_preview(out: Output, preview: Preview) -> None:
    """``--dry-run``: the steps in order, the restart argv quoted as a shell would read it."""
    if out.json:
        out.emit_json("update.preview", preview.to_json())
        return
    out.plain(f"dry run: update {preview.action} of job {preview.job} would:\n")
    for step in preview.steps:
        out.plain(f"  - {visible(step)}\n")
    if preview.restart:
        out.plain(f"  - run: {visible(shlex.join(preview.restart))}\n")
    out.plain("nothing was changed.\n")
