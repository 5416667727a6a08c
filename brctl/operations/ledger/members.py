"""The job's machines now: the inventory's ``job.nodes`` after the daemon's swaps.

``brctl daemon`` swaps a checked standby in for an evicted machine and records the
job's new machine list in the state database (``job_members``); the inventory file
is never rewritten. Every job-aware command sees the job through
``Env.inventory()``, which calls ``current_inventory`` here: when the database has
a list for the job that differs from ``job.nodes``, that list is the job (and
one warning on stderr names the swaps). The database is opened read-only and
only if it exists: a command never creates it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Optional

from brctl.analysis.inventory import Inventory
from brctl.state import read_existing


def recorded_members(state_dir: Path, job: str) -> Optional[list[str]]:
    """The job's machines as the daemon last recorded them, or None (no database, no record)."""
    rows = read_existing(state_dir, "SELECT node FROM job_members WHERE job = ? ORDER BY position",
                         (job,))
    return [str(r[0]) for r in rows] if rows else None


def current_inventory(inv: Inventory, state_dir: Path) -> tuple[Inventory, Optional[str]]:
    """``inv`` with its job on the machines it runs on now, and the warning to print (or None).

    Machines swapped into the job leave ``standby`` in the returned inventory.
    """
    if inv.job is None:
        return inv, None
    if inv.job.slurm is not None:  # the scheduler's allocation wins over recorded swaps
        recorded = recorded_members(state_dir, inv.job.name)
        if recorded is None or recorded == list(inv.job.nodes):
            return inv, None
        return inv, (f"job {inv.job.name}: the state DB lists {', '.join(recorded)}; "
                     f"{inv.job.source} runs on {', '.join(inv.job.nodes) or 'no machine'}, "
                     "and the scheduler's allocation wins")
    recorded = recorded_members(state_dir, inv.job.name)
    if recorded is None:
        return inv, None
    # here, not at the top: analysis.daemon costs every job-aware command ~12 ms to import
    from brctl.analysis.daemon.policy import recorded_membership

    nodes, note = recorded_membership(inv.job.name, inv.job.nodes, recorded, inv.nodes)
    if list(nodes) == list(inv.job.nodes):
        return inv, note
    standby = tuple(n for n in inv.standby if n not in set(nodes))
    return replace(inv, job=replace(inv.job, nodes=tuple(nodes)), standby=standby), note
