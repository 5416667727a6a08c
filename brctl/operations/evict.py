"""``brctl evict`` / ``unevict``: a hand-made quarantine of a node set, under the daemon's caps.

The caps are checked for the whole set and the quarantine recorded in one
transaction (two evictions racing at the cap cannot both pass). ``--force`` goes
past a cap, never silently: the cap it overrode, the operator and the reason are in
the audit trail and the notification. The scheduler is told per machine through
``job.evict_command`` / ``unevict_command``. A dry run reads the state and renders
the hooks' argv; it writes nothing (no refusal record either) and notifies no one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional

from brctl.analysis.daemon.policy import Plan, refusal
from brctl.analysis.inventory import Inventory
from brctl.core.errors import ExitCode, InputError, RefusedError, UsageError
from brctl.core.nodeset import fold
from brctl.operations.jobadapter import HookRun, JobAdapter
from brctl.operations.ledger.audit import Audit
from brctl.operations.ledger.state import DONE, FAILED, DaemonState


@dataclass(frozen=True)
class HandChange:
    """One machine of a hand evict/unevict."""

    node: str
    changed: bool  # False: already in that state
    reason: str
    command: Optional[tuple[str, ...]] = None  # the scheduler hook's argv (run, or would run)
    hook: Optional[HookRun] = None  # what it did (None: no hook, or a dry run)
    remains: Optional[str] = None  # a job machine: who finishes the eviction

    def to_json(self) -> dict[str, Any]:
        """``{changed, reason, command, hook, remains}``."""
        return {"changed": self.changed, "reason": self.reason,
                "command": list(self.command) if self.command is not None else None,
                "hook": self.hook.to_json() if self.hook else None, "remains": self.remains}


@dataclass(frozen=True)
class EvictReport:
    """What ``brctl evict``/``unevict`` did (or would do) to each machine of the set."""

    action: str  # evict | unevict
    machines: tuple[HandChange, ...]
    dry_run: bool
    operator: str
    forced: Optional[str] = None  # the cap --force went past
    notify_errors: tuple[str, ...] = ()

    @property
    def changed(self) -> list[str]:
        """Machines whose state changed (or would change)."""
        return [m.node for m in self.machines if m.changed]

    @property
    def exit_code(self) -> ExitCode:
        """1 when a scheduler hook failed, else 0."""
        failed = any(m.hook is not None and not m.hook.ok for m in self.machines)
        return ExitCode.FINDINGS if failed else ExitCode.OK

    def to_json(self) -> dict[str, Any]:
        """``{action, dry_run, operator, forced, members, nodes, notify_errors}``."""
        return {"action": self.action, "dry_run": self.dry_run, "operator": self.operator,
                "forced": self.forced, "members": self.changed,
                "nodes": {m.node: m.to_json() for m in self.machines},
                "notify_errors": list(self.notify_errors)}


def machines_of(inv: Inventory, pattern: str, verb: str) -> list[str]:
    """The machines of node set ``pattern`` (``@groups`` resolved), each once.

    Raises:
        InputError: a name or group that is not in the inventory.
        UsageError: the set is empty.
    """
    names = list(dict.fromkeys(inv.expand(pattern)))
    unknown = [n for n in names if n not in inv.nodes]
    if unknown:
        raise InputError(f"{verb} {pattern!r}: not in the inventory {inv.source}: {fold(unknown)}",
                         hint="brctl nodes lists the inventory's machines and groups")
    if not names:
        raise UsageError(f"{verb} {pattern!r}: selects no machine")
    return names


def evict(inv: Inventory, pattern: str, reason: str, *, dry_run: bool, force: bool,
          timeout: float, audit: Audit, now: Optional[float] = None) -> EvictReport:
    """Quarantine the machines of node set ``pattern`` by hand and tell the scheduler
    (``job.evict_command``).

    A machine of the job stays in its machine list until the daemon, at its next
    poll, swaps a checked standby in and restarts the job (the quarantine is
    recorded as ``source: hand`` with the operator); with no daemon holding the
    job's lease, the report says what remains to do.

    Raises:
        InputError: a name or group in ``pattern`` that is not in the inventory.
        UsageError: an empty ``reason`` or node set.
        RefusedError: an eviction cap forbids it and ``force`` is not given (a real
            run records and announces the refusal; a dry run writes nothing).
    """
    at = time.time() if now is None else now
    state = audit.state  # the job's records; the audit trail is written there too
    nodes = machines_of(inv, pattern, "evict")
    if not reason.strip():
        raise UsageError("evict: --reason must say why (it goes to the scheduler and the log)")
    quarantined = state.quarantined(at)
    new = [n for n in nodes if n not in quarantined]
    job_size = len(inv.job.nodes) if inv.job is not None else len(inv.nodes)
    members = state.members(inv.job.nodes) if inv.job is not None else []
    adapter = JobAdapter(inv, timeout) if inv.job is not None else None
    overridden: list[str] = []

    def caps(eviction_times: list[float]) -> Optional[str]:
        why = refusal(Plan("evict", tuple(new), reason, restart=False), now=at,
                      eviction_times=eviction_times, job_size=job_size,
                      restarts_without_progress=0, cfg=inv.daemon)
        if why is not None and force:
            overridden.append(why)
            return None
        return why

    def command(node: str) -> Optional[tuple[str, ...]]:
        return adapter.evict_preview(members, node, reason) if adapter else None

    unchanged = {n: HandChange(n, False, quarantined[n].reason) for n in nodes if n in quarantined}
    if not new:
        return EvictReport("evict", tuple(unchanged[n] for n in nodes), dry_run, audit.operator)
    key = f"{state.job}/hand-evict/{fold(new)}/{at:.6f}"
    if dry_run:
        why = caps([e.at for e in state.eviction_history(at)])
    else:
        why = state.admit(key, {"by": "hand", "operator": audit.operator, "force": force}, reason,
                          at, evict=new, source="hand", operator=audit.operator, caps=caps,
                          kind="evict")
    if why is not None:
        if not dry_run:
            audit.record("refused", new, {"reason": why, "wanted": reason}, outcome="refused",
                         reason=why, at=at)
        raise RefusedError(f"evict {fold(new)}: {why}",
                           hint="--force --reason TEXT goes past the cap (recorded with who and "
                                "why, and announced); --dry-run shows what would happen")
    forced = overridden[0] if overridden else None
    done: dict[str, HandChange] = {}
    for node in new:
        remains = _what_remains(inv, state, node, members, at)
        hook = None if dry_run or adapter is None else adapter.evict(members, node, reason)
        done[node] = HandChange(node, True, reason, command(node), hook, remains)
    errors: list[str] = []
    if not dry_run:
        ok = all(c.hook is None or c.hook.ok for c in done.values())
        state.finish(key, DONE if ok else FAILED, time.time())
        errors = audit.record(
            "evict", new, {"reason": reason, "forced": forced,
                           "hooks": {n: c.hook.to_json() for n, c in done.items() if c.hook}},
            outcome=DONE if ok else FAILED,
            reason=reason if forced is None else f"{reason} (forced past {forced})", at=at)
    return EvictReport("evict", tuple(done.get(n) or unchanged[n] for n in nodes), dry_run,
                       audit.operator, forced, tuple(errors))


def _what_remains(inv: Inventory, state: DaemonState, node: str, members: list[str],
                  now: float) -> Optional[str]:
    """For a machine of the job: who swaps a standby in, or what is left to do by hand."""
    if inv.job is None or node not in members:
        return None
    lease = state.lease()
    if lease is not None and float(lease["expires"]) > now:
        return (f"{node} is in job {inv.job.name}: the daemon ({lease['owner']}) swaps a checked "
                "standby in and restarts the job at its next poll")
    return (f"{node} is still in job {inv.job.name} and no daemon holds the job's lease: start "
            "brctl daemon run (it swaps a checked standby in and restarts the job at its first "
            "poll), or restart the job without it yourself")


def unevict(inv: Inventory, pattern: str, *, dry_run: bool, timeout: float, audit: Audit,
            now: Optional[float] = None) -> EvictReport:
    """Close the quarantine of the machines of ``pattern`` (each may become a standby
    again after a self-check).

    ``job.unevict_command`` returns each to the scheduler (e.g. ``scontrol update
    NodeName={node} State=RESUME``); the audit trail names the operator. A dry run
    only says what would change and which command would run.

    Raises:
        InputError: a name or group in ``pattern`` that is not in the inventory.
    """
    at = time.time() if now is None else now
    state = audit.state
    nodes = machines_of(inv, pattern, "unevict")
    quarantined = state.quarantined()
    members = state.members(inv.job.nodes) if inv.job is not None else []
    adapter = JobAdapter(inv, timeout) if inv.job is not None else None
    out: list[HandChange] = []
    for node in nodes:
        record = quarantined.get(node)
        if record is None:
            out.append(HandChange(node, False, ""))
            continue
        argv = adapter.unevict_preview(members, node) if adapter else None
        hook = None
        if not dry_run:
            state.release(node, at)
            state.mark_checked(node, False, "released from quarantine; not checked since", at)
            hook = adapter.unevict(members, node) if adapter else None
        out.append(HandChange(node, True, record.reason, argv, hook))
    released = [c for c in out if c.changed]
    errors: list[str] = []
    if released and not dry_run:
        ok = all(c.hook is None or c.hook.ok for c in released)
        errors = audit.record(
            "unevict", [c.node for c in released],
            {"was": {c.node: c.reason for c in released},
             "hooks": {c.node: c.hook.to_json() for c in released if c.hook}},
            outcome=DONE if ok else FAILED, reason="returned to service", at=at)
    return EvictReport("unevict", tuple(out), dry_run, audit.operator, None, tuple(errors))


@dataclass(frozen=True)
class RearmReport:
    """What ``brctl daemon rearm`` did: the halt it lifted (None: the daemon was not halted)."""

    job: str
    was: Optional[str]
    operator: str
    reason: str
    notify_errors: tuple[str, ...] = ()

    @property
    def exit_code(self) -> ExitCode:
        """0: re-armed, or nothing to re-arm."""
        return ExitCode.OK

    def to_json(self) -> dict[str, Any]:
        """``{job, rearmed, was, operator, reason, notify_errors}``."""
        return {"job": self.job, "rearmed": self.was is not None, "was": self.was,
                "operator": self.operator, "reason": self.reason,
                "notify_errors": list(self.notify_errors)}


def rearm(audit: Audit, reason: str, now: Optional[float] = None) -> RearmReport:
    """Lift the job's daemon halt (a refusal or an abandoned plan): the running daemon acts
    again from its next poll, a restarted one from its start. Recorded and announced with
    the operator; nothing is recorded when the daemon is not halted.

    Raises:
        UsageError: an empty ``reason``.
    """
    if not reason.strip():
        raise UsageError("daemon rearm: --reason must say what the human did (it goes to the log)")
    was = audit.state.halt()
    errors: list[str] = []
    if was is not None:
        errors = audit.record("rearmed", [], {"reason": reason, "was": was}, outcome="rearmed",
                              reason=reason, at=now)
    return RearmReport(audit.state.job, was, audit.operator, reason, tuple(errors))
