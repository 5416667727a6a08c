"""Rendering of ``brctl daemon``, ``evict``/``unevict``, ``standby`` and ``ettr``."""

from __future__ import annotations

import time
from typing import Any

from brctl.operations.daemon import DaemonReport, StatusReport
from brctl.operations.fleet import EttrReport, EvictReport, PoolReport, SizeReport
from brctl.render import Output, escape, table

_QUIET = {"standby_check", "daemon_start", "daemon_stop"}


def _when(at: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at)) if at else "-"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def event_line(out: Output, doc: dict[str, Any]) -> None:
    """One line per recorded event on stderr while the daemon runs."""
    detail = doc.get("detail") or {}
    nodes = ",".join(doc.get("nodes") or [])
    text = detail.get("reason") or detail.get("detail") or ""
    if doc["kind"] == "decision":
        plan = detail.get("plan") or {}
        text = f"{plan.get('decision')}" + (f" {','.join(plan.get('evict') or [])}"
                                            if plan.get("evict") else "") + f": {plan.get('reason')}"
        if detail.get("dry_run"):
            text += " (dry run)"
    if doc["kind"] == "daemon_start":
        text = f"members {','.join(detail.get('members') or [])}"
    colour = {"refused": "red", "halted": "red", "decision": "bold"}.get(doc["kind"], "")
    line = f"{_when(doc['at'])} {doc['kind']:<16} {nodes:<12} {text}"
    out.err.print(f"[{colour}]{escape(line)}[/]" if colour else escape(line))


def render_run(out: Output, report: DaemonReport) -> None:
    """Summary of a daemon run."""
    if out.json:
        out.emit_json("daemon.run", report.to_json(), status=report.exit_code)
        return
    out.console.print(f"job {escape(report.job)}: {report.iterations} polls, "
                      f"{len(report.handled)} incidents, {len(report.refusals)} refusals; "
                      f"machines now {escape(','.join(report.members))}; "
                      f"ETTR {_pct(report.ettr)} (stopped by {report.stopped_by or 'error'})")
    for why in report.refusals:
        out.console.print(f"[red]refused:[/] {escape(why)}")


def status_json(report: StatusReport) -> dict[str, Any]:
    """``brctl.daemon.status/1``: the report, each event's machine list named ``members``."""
    doc = report.to_json()
    doc["events"] = [{("members" if k == "nodes" else k): v for k, v in e.items()}
                     for e in doc["events"]]
    return doc


def render_status(out: Output, report: StatusReport) -> None:
    """The lease, last poll and recent records."""
    if out.json:
        out.emit_json("daemon.status", status_json(report))
        return
    lease = report.lease
    who = f"running ({lease['owner']})" if report.alive and lease else "not running"
    s = report.summary
    out.console.print(f"job {escape(report.job)}: daemon {escape(who)}; last poll "
                      f"{_when(report.last_poll)}; step {s.get('step')}; ETTR {_pct(s.get('ettr'))}")
    if s.get("halted"):
        out.console.print(f"[red]halted:[/] {escape(str(s['halted']))}")
    if s.get("members"):
        out.console.print(f"machines: {escape(','.join(s['members']))}")
    if report.quarantined:
        out.console.print(table(["quarantined", "reason", "by", "since"],
                                [(q["node"], q["reason"], q["source"], _when(q["at"]))
                                 for q in report.quarantined]))
    out.console.print(table(["time", "event", "nodes", "detail"],
                            [(_when(e["at"]), e["kind"], ",".join(e["nodes"]),
                              str(e["detail"].get("reason") or e["detail"].get("detail") or ""))
                             for e in report.events if e["kind"] not in _QUIET]))
    out.console.print(table(["time", "action", "node", "state", "why / outcome"],
                            [(_when(a["created"]), a["kind"], a["node"] or "", a["state"],
                              a["reason"].rsplit(": ", 1)[-1][:70] if a["kind"] != "plan"
                              else a["reason"][:70])
                             for a in report.actions]))


def render_evict(out: Output, report: EvictReport) -> None:
    """What evict/unevict did."""
    if out.json:
        out.emit_json(report.action, report.to_json())
        return
    verb = {"evict": "quarantined", "unevict": "released"}[report.action]
    if not report.changed:
        out.console.print(f"{escape(report.node)}: already {'not ' if report.action == 'unevict' else ''}"
                          "quarantined; nothing changed")
        return
    prefix = "would be " if report.dry_run else ""
    out.console.print(f"{escape(report.node)}: {prefix}{verb} ({escape(report.reason)})")
    if report.hook is not None:
        state = "ok" if report.hook.ok else f"exit {report.hook.exit_code}"
        out.console.print(f"evict_command: {state} {escape(report.hook.output.strip()[-300:])}")


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
    out.console.print(table(["machine", "status", "checked", "detail"],
                            [(m.node, m.status, _when(m.checked_at), m.detail[:200])
                             for m in report.machines]))
    out.console.print(f"{len(report.ready)} ready: {escape(','.join(report.ready) or 'none')}")


def render_ettr(out: Output, job: str, report: EttrReport) -> None:
    """Cumulative and windowed ETTR with a sparkline."""
    if out.json:
        out.emit_json("ettr", {"job": job, **report.to_json()})
        return
    if report.cumulative is None:
        out.console.print(f"job {escape(job)}: nothing recorded yet (run brctl daemon run)")
        return
    out.console.print(f"job {escape(job)}: ETTR {_pct(report.cumulative)} cumulative "
                      f"({report.productive_seconds:.0f}s productive of "
                      f"{report.observed_seconds:.0f}s observed); last {report.window:g}s: "
                      f"{_pct(report.window_ettr)}")
    out.console.print(f"window ETTR  |{report.sparkline}|")
