"""``brctl ckpt``: plan and verify backup placement; back up and restore shard files.

Placement lives here; the copies (``backup``, ``restore``, ``CopyReport``) are in
``brctl.operations.ckpt.copy`` and re-exported, so callers import one module.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from brctl.analysis.inventory import Inventory
from brctl.analysis.jobtopo import job_topology
from brctl.analysis.placement.plan import ConflictIndex, Plan, Verification, plan_backups, verify_plan
from brctl.core.errors import ExitCode, InputError
from brctl.core.schema import SchemaError, from_mapping
from brctl.operations.ckpt.copy import Copy, CopyReport, backup
from brctl.operations.ckpt.restores import restore

__all__ = ["Copy", "CopyReport", "PlanReport", "backup", "domains_of", "plan", "plan_report",
           "read_plan_file", "restore", "verify"]


# -- plan and verify -------------------------------------------------------------------


def domains_of(inv: Inventory) -> dict[str, str]:
    """Job machine → failure domain, from the node label named by ``ckpt.domain_label``."""
    key = inv.ckpt.domain_label
    return {n: inv.nodes[n].labels[key] for n in (inv.job.nodes if inv.job else ())
            if key in inv.nodes[n].labels}


def plan(inv: Inventory) -> Plan:
    """The backup plan of the inventory's job."""
    return plan_backups(job_topology(inv), domains_of(inv))


@dataclass(frozen=True)
class PlanReport:
    """``brctl ckpt plan``: the job's backup plan, as a document for ``--json`` and YAML."""

    job: str
    plan: Plan

    @property
    def exit_code(self) -> ExitCode:
        """1 when some placement breaks the rule, else 0."""
        return ExitCode.OK if self.plan.ok else ExitCode.FINDINGS

    def to_json(self) -> dict[str, Any]:
        """The plan as the document ``--json`` and ``--format yaml`` print."""
        return {"job": self.job, "ok": self.plan.ok,
                "placements": [x.to_json() for x in self.plan.placements],
                "notes": list(self.plan.notes)}

    def to_yaml(self) -> str:
        """The document as YAML for training code (stable key order)."""
        import yaml

        doc = {"schema": "brctl.ckpt.plan/1", **self.to_json()}
        return str(yaml.safe_dump(json.loads(json.dumps(doc)), sort_keys=False))


def plan_report(inv: Inventory) -> PlanReport:
    """``plan`` for ``brctl ckpt plan``: with the job's name, for the documents."""
    return PlanReport(inv.job.name if inv.job else "", plan(inv))


def verify(inv: Inventory, backups: Mapping[str, str] | None = None) -> Verification:
    """Verify ``backups`` (default: the plan brctl would make) against the job's groups."""
    topo = job_topology(inv)
    index = ConflictIndex.build(topo)  # built once, shared by the plan and the proof
    if backups is None:
        backups = plan_backups(topo, domains_of(inv), index).backups()
    return verify_plan(topo, backups, index)


@dataclass(frozen=True)
class _PlanEntry:
    node: str
    backup_node: str
    meets_rule: Optional[bool] = None
    how: Optional[str] = None
    shared_kinds: list[str] = field(default_factory=list)
    same_domain: Optional[bool] = None


def read_plan_file(path: str, inv: Inventory) -> dict[str, str]:
    """A placement file (YAML or JSON, ``placements: [{node, backup_node}]``), validated.

    Raises:
        InputError: unreadable or malformed file, unknown keys, machines that are not
            in the job (``node``) or the inventory (``backup_node``), a machine twice.
    """
    from brctl.load.inventory import line_of, parse_yaml, utf8_text

    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise InputError(f"plan {path}: cannot read: {exc.strerror}", file=path) from None
    text = utf8_text(raw, path)
    data = parse_yaml(text, path)  # JSON is YAML too; duplicate keys refused
    try:
        return _placements(data, path, inv)
    except SchemaError as exc:
        line = line_of(text, exc.path)
        raise (exc.at_line(line) if line is not None else exc) from None


def _placements(data: Any, path: str, inv: Inventory) -> dict[str, str]:
    if isinstance(data, list):
        data = {"placements": data}
    if not isinstance(data, dict) or not isinstance(data.get("placements"), list):
        raise SchemaError(path, "placements", "expected a list of {node, backup_node}",
                          hint="the output of brctl ckpt plan --format yaml has this shape")
    job = set(inv.job.nodes) if inv.job else set()
    out: dict[str, str] = {}
    for i, raw in enumerate(data["placements"]):
        entry = from_mapping(_PlanEntry, raw, path, f"placements[{i}]")
        if entry.node not in job:
            raise SchemaError(path, f"placements[{i}].node", f"{entry.node!r} is not a job machine")
        if entry.backup_node not in inv.nodes:
            raise SchemaError(path, f"placements[{i}].backup_node",
                              f"{entry.backup_node!r} is not in the inventory")
        if entry.node in out:
            raise SchemaError(path, f"placements[{i}].node", f"{entry.node!r} is placed twice")
        out[entry.node] = entry.backup_node
    return out


