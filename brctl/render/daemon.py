"""Rendering of ``brctl daemon``, ``evict``/``unevict``, ``standby`` and ``ettr``."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from brctl.core.nodeset import fold, fold_in_order
from brctl.operations.daemon.report import DaemonReport, StatusReport
from brctl.operations.evict import EvictReport, RearmReport
from brctl.operations.standby.ops import PoolReport, SizeReport
from brctl.render.output import Output, escape
from brctl.render.report import warn_skipped

_QUIET = {"standby_check", "daemon_start", "daemon_stop"}


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def event_line(out: Output, doc: dict[str, Any]) -> None:
    """One line per recorded event on stderr while the daemon runs."""
    nodes = fold(doc.get("nodes") or [])
    text = event_text(doc)
    colour = {"refused": "red", "halted": "red", "decision": "bold"}.get(doc["kind"], "")
    line = f"{out.stamp(doc['at'])} {doc['kind']:<16} {nodes:<12} {text}"
    out.err.print(f"[{colour}]{escape(line)}[/]" if colour else escape(line))


def render_run(out: Output, report: DaemonReport) -> None:
    """Summary of a daemon run."""
    if out.json:
        out.emit_json("daemon.run", report.to_json(), status=report.exit_code)
        return
    out.console.print(f"job {escape(report.job)}: {report.iterations} polls, "
                      f"{len(report.handled)} incidents, {len(report.refusals)} refusals; "
                      f"machines now {escape(fold_in_order(report.members))}; "
                      f"ETTR {_pct(report.ettr)} (stopped by {report.stopped_by or 'error'})")
    for why in report.refusals:
        out.console.print(f"[red]refused:[/] {escape(why)}")


@dataclass(frozen=True)
class StatusView:
    """Which records ``daemon status`` shows: ``--since``, ``--node``, ``--kind``."""

    since: float = 0.0
    node: str | None = None
    kind: str | None = None

    def wants(self, at: float | None, nodes: Sequence[str], kind: str) -> bool:
        """Whether a record at ``at`` about ``nodes`` of ``kind`` is shown."""
        return ((at or 0.0) >= self.since and (self.node is None or self.node in nodes)
                and (self.kind is None or self.kind == kind))


def status_json(report: StatusReport, view: StatusView | None = None) -> dict[str, Any]:
    """``brctl.daemon.status/1``: the report (narrowed by ``view``), each event's machine
    list named ``members``."""
    view = view or StatusView()
    doc = report.to_json()
    doc["events"] = [{("members" if k == "nodes" else k): v for k, v in e.items()}
                     for e in doc["events"] if view.wants(e["at"], e["nodes"], e["kind"])]
    doc["actions"] = [a for a in doc["actions"]
                      if view.wants(a["created"], [a["node"]] if a["node"] else [], a["kind"])]
    return doc


def render_status(out: Output, report: StatusReport, view: StatusView | None = None, *,
                  header: bool = True) -> None:
    """The lease, last poll, then every recorded event and action as one record each.

    A decision shows what was decided and why; a step that did nothing says so
    (``skipped: no backup``); node lists are folded. ``view`` narrows the records
    (``--since/--node/--kind``).
    """
    view = view or StatusView()
    warn_skipped(out, report.skipped)
    if out.json:
        out.emit_json("daemon.status", status_json(report, view), status=report.exit_code)
        return
    if header:
        _status_header(out, report)
    for q in report.quarantined:
        if view.wants(q["at"], [q["node"]], "quarantine"):
            out.record(f"{out.stamp(q['at'])}  quarantined    {q['node']} (by {q['source']})",
                       q["reason"])
    for e in report.events:
        if e["kind"] not in _QUIET and view.wants(e["at"], e["nodes"], e["kind"]):
            style = {"refused": "red", "halted": "red", "decision": "bold"}.get(e["kind"], "")
            out.record(f"{out.stamp(e['at'])}  {e['kind']:<14} {fold(e['nodes'])}",
                       event_text(e), style=style)
    for a in report.actions:
        if view.wants(a["created"], [a["node"]] if a["node"] else [], a["kind"]):
            state, text = action_text(a)
            who = f" {a['node']}" if a["node"] else ""
            out.record(f"{out.stamp(a['created'])}  {a['kind']:<14}{who} {state}", text,
                       style="red" if a["state"] in ("failed", "unknown") else "")


def _status_header(out: Output, report: StatusReport) -> None:
    lease = report.lease
    who = f"running ({lease['owner']})" if report.alive and lease else "not running"
    s = report.summary
    out.record(f"job {report.job}: daemon {who}; last poll {out.stamp(report.last_poll)}; "
               f"step {s['step'] if s.get('step') is not None else '-'}; ETTR {_pct(s.get('ettr'))}")
    if s.get("halted"):
        out.record("halted", str(s["halted"]), style="red")
    if s.get("members"):
        out.record(f"machines: {fold(s['members'])}")


def event_text(e: dict[str, Any]) -> str:
    """What an event says: a decision and its reason, else the recorded reason."""
    detail = e.get("detail") or {}
    if e["kind"] == "decision":
        plan = detail.get("plan") or {}
        evict = f" {fold(plan['evict'])}" if plan.get("evict") else ""
        dry = " (dry run)" if detail.get("dry_run") else ""
        return f"{plan.get('decision')}{evict}: {plan.get('reason')}{dry}"
    if e["kind"] == "daemon_start":
        return f"members {fold(detail.get('members') or [])}"
    return str(detail.get("reason") or detail.get("detail") or "")


def action_text(a: dict[str, Any]) -> tuple[str, str]:
    """(state shown, outcome) of an action; a step that found nothing to do is ``skipped``."""
    reason = str(a.get("reason") or "")
    if a["kind"] == "plan":
        plan = (a.get("payload") or {}).get("plan") or {}
        if plan.get("decision"):
            evict = f" {fold(plan['evict'])}" if plan.get("evict") else ""
            return a["state"], f"{plan['decision']}{evict}: {plan.get('reason') or reason}"
    if a["state"] == "done" and reason.startswith("no backup"):
        return "skipped: no backup", reason
    return a["state"], reason


def render_rearm(out: Output, report: RearmReport) -> None:
    """Whether the halt was lifted, and which."""
    if out.json:
        out.emit_json("daemon.rearm", report.to_json())
    elif report.was is None:
        out.console.print(f"{escape(report.job)}: the daemon is not halted; nothing changed")
    else:
        out.console.print(f"{escape(report.job)}: re-armed by {escape(report.operator)} "
                          f"({escape(report.reason)}); it was halted: {escape(report.was)}")
    for error in report.notify_errors:
        out.warn(f"not notified: {error}")


def render_evict(out: Output, report: EvictReport) -> None:
    """What evict/unevict did (or, with --dry-run, would do) to each machine."""
    if out.json:
        out.emit_json(report.action, report.to_json(), version=2, status=report.exit_code)
        return
    verb = {"evict": "quarantined", "unevict": "released"}[report.action]
    prefix = "would be " if report.dry_run else ""
    hook = f"{report.action}_command"
    for m in report.machines:
        if not m.changed:
            out.console.print(f"{escape(m.node)}: already {'not ' if report.action == 'unevict' else ''}"
                              "quarantined; nothing changed")
            continue
        out.console.print(f"{escape(m.node)}: {prefix}{verb} ({escape(m.reason)})")
        if report.dry_run and m.command is not None:
            out.console.print(f"  would run {hook}: {escape(shlex.join(m.command))}")
        if m.hook is not None:
            state = "ok" if m.hook.ok else f"exit {m.hook.exit_code}"
            out.console.print(f"  {hook}: {state} {escape(m.hook.output.strip()[-300:])}")
        if m.remains:
            out.console.print(f"  {escape(m.remains)}")
    if report.forced:
        out.console.print(f"{'would go' if report.dry_run else 'went'} past a cap (--force, by "
                          f"{escape(report.operator)}): {escape(report.forced)}")
    if report.dry_run and report.changed:
        out.console.print("dry run: nothing recorded, no command run, no one notified")
    for error in report.notify_errors:
        out.warn(f"not notified: {error}")


def render_size(out: Output, report: SizeReport, have: int | None) -> None:
    """The pool size and how it was reached."""
    if out.json:
        out.emit_json("standby.size", {**report.to_json(), "configured": have})
        return
    out.console.print(
        f"standby pool: {report.size} machines (P{report.quantile * 100:g} of "
        f"Binomial({report.machines}, p={report.window_probability:.3g}) failures in "
        f"{report.window_hours:g}h; daily rate {report.daily_failure_rate:.3g} from "
        f"{report.source}; expected {report.expected:.2f})"
        + (f"; configured: {have}" if have is not None else ""))


def render_pool(out: Output, report: PoolReport, schema: str, code: int | None = None) -> None:
    """The pool table (``standby.list``, or ``standby.check`` that judges with ``code``)."""
    if out.json:
        out.emit_json(schema, report.to_json(), status=code)
        return
    for m in report.machines:
        out.record(f"{m.node}  {m.status}  checked {out.stamp(m.checked_at)}", m.detail)
    out.console.print(f"{len(report.ready)} ready: {escape(fold(report.ready) or 'none')}")
    if report.would_check is not None:
        out.console.print(f"dry run: would check {escape(fold(report.would_check) or 'nothing')} "
                          f"with {', '.join(report.stages)}; nothing contacted or marked")
