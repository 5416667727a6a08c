"""Rendering of ``brctl health``: folded verdicts, findings by node set, or the JSON."""

from __future__ import annotations

import time

from brctl.core.nodeset import fold, fold_by
from brctl.operations.health import HealthReport
from brctl.render.output import Output, escape

_COLOUR = {"ok": "green", "warn": "yellow", "fail": "red", "unknown": "magenta", "skip": "dim"}


def render(out: Output, report: HealthReport) -> None:
    """Healthy machines on one folded line, then each finding with its node set."""
    if out.json:
        out.emit_json("health", report.to_json(), status=report.exit_code)
        return
    status = {n: h.status for n, h in report.nodes.items() if h.answered}
    for nodes, state, _ in fold_by(status):
        colour = _COLOUR.get(state, "red")
        out.console.print(f"{escape(nodes)}: [{colour}]{state}[/]")
    for nodes, (state, error), _ in fold_by({n: (h.status, h.error or "")
                                             for n, h in report.nodes.items() if not h.answered}):
        out.console.print(f"{escape(nodes)}: [red]{state}[/] {escape(error)}")
    findings: dict[tuple[str, str, str], list[str]] = {}
    skips: dict[tuple[str, str, str], list[str]] = {}
    for name, health in report.nodes.items():
        merged: dict[tuple[str, str], list[str]] = {}  # same status+reason: one line
        for check in health.checks:
            merged.setdefault((check.status, check.message), []).append(check.name)
        for (kind, message), checks in merged.items():
            key = (", ".join(checks), kind, message)
            if kind in ("warn", "fail", "unknown"):
                findings.setdefault(key, []).append(name)
            elif kind == "skip" and out.verbose:
                skips.setdefault(key, []).append(name)
    _folded(out, findings)
    _folded(out, skips)
    evict = report.evict_candidates()
    if evict:
        for nodes, reason, _ in fold_by(evict):
            out.console.print(f"[bold red]evict[/] {escape(nodes)}: {escape(reason)}")


def _folded(out: Output, rows: dict[tuple[str, str, str], list[str]]) -> None:
    order = {"fail": 0, "unknown": 1, "warn": 2, "skip": 3}
    for (checks, state, message), nodes in sorted(rows.items(),
                                                  key=lambda r: (order[r[0][1]], r[0][0])):
        colour = _COLOUR.get(state, "red")
        out.console.print(f"  {escape(fold(nodes))}: [{colour}]{state}[/] {checks}: "
                          f"{escape(message)}")


def render_changes(out: Output, before: HealthReport, after: HealthReport) -> None:
    """Only what changed since the previous sweep: node states and check statuses."""
    stamp = out.stamp(time.time())
    changes: dict[tuple[str, str], tuple[str, str]] = {}  # (node, check or "") -> (what, text)
    for name, health in after.nodes.items():
        old = before.nodes.get(name)
        if old is None or old.status != health.status:
            was = old.status if old is not None else "new"
            changes[(name, "")] = ("node", f"{was} -> {health.status} {health.error or ''}".rstrip())
        old_checks = {c.name: c for c in old.checks} if old is not None else {}
        for check in health.checks:
            prev = old_checks.get(check.name)
            if prev is not None and prev.status != check.status:
                changes[(name, check.name)] = (
                    check.name, f"{prev.status} -> {check.status}: {check.message}")
    if out.json:
        out.emit_json("health", {**after.to_json(), "changes": [
            {"node": node, "check": what, "change": text}
            for (node, _), (what, text) in changes.items()]}, status=after.exit_code)
        return
    by_value: dict[tuple[str, str], list[str]] = {}
    for (node, _), value in changes.items():
        by_value.setdefault(value, []).append(node)
    for (what, text), nodes in by_value.items():
        out.console.print(f"{stamp} {escape(fold(nodes))} {what}: {escape(text)}")
