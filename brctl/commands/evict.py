"""``brctl evict NODESET --reason`` / ``brctl unevict NODESET``: quarantine by hand."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import typer

from brctl.commands._complete import node_names
from brctl.commands._options import BY, EXAMPLE, node_set_text
from brctl.env import Env

if TYPE_CHECKING:
    from brctl.operations.ledger.audit import Audit



def _node_set(ctx: typer.Context, param: Any, value: str) -> str:
    return node_set_text(value) or value


def _nodes(what: str) -> Any:
    return typer.Argument(..., metavar="NODESET", callback=_node_set, autocompletion=node_names,
                          help=f"The machines to {what}, {EXAMPLE}.")


def register(app: typer.Typer) -> None:
    """Add both commands to the root app."""
    app.command("evict")(evict)
    app.command("unevict")(unevict)


def _audit(env: Env, by: Optional[str]) -> Audit:
    """The job's audit trail (its records in ``.state``) for operator ``by``."""
    from brctl.operations.ledger.audit import Audit
    from brctl.operations.ledger.state import DaemonState
    from brctl.operations.update.ops import who

    inv = env.inventory(as_listed=True)
    return Audit.of(inv, DaemonState(env.store(), inv.job_key), env.state_dir(),
                    by or who(env.environ))


def evict(
    ctx: typer.Context,
    nodeset: str = _nodes("take out of service"),
    reason: str = typer.Option(..., "--reason", metavar="TEXT",
                               help="Why (recorded, and given to job.evict_command as {reason})."),
    dry_run: bool = typer.Option(False, "--dry-run",
                                 help="Check the caps and show the commands; change nothing."),
    force: bool = typer.Option(False, "--force",
                               help="Go past an eviction cap (recorded with --by and --reason, "
                                    "and announced)."),
    by: Optional[str] = BY,
) -> int:
    """Take NODESET out of service: quarantine each machine and tell the scheduler.

    The record is kept in the state database (with who evicted it and why); a
    quarantined machine is never picked as a standby and the daemon never swaps it
    back in. job.evict_command (placeholders {node} {reason}) drains each machine in
    the scheduler. A machine of the job stays in its machine list until the daemon,
    at its next poll, swaps a checked standby in and restarts the job; with no
    daemon running, the output says what remains to do. The daemon's caps apply to
    the whole set (daemon.max_evictions_per_hour, daemon.max_evict_fraction),
    checked and recorded at once: a refusal is recorded, announced and exits 4.
    --force goes past a cap; the cap, the operator and the reason go to the audit
    trail (the daemon's events and event log) and the daemon's notifier, as every
    hand eviction does. --dry-run writes nothing, runs no hook and notifies no one.
    Exit 0 when done (or already quarantined), 1 when an evict_command failed, 2 for
    a name not in the inventory, 4 when a cap refused it.
    """
    from brctl.operations.evict import evict as do_evict
    from brctl.render.daemon import render_evict

    env: Env = ctx.obj
    inv, audit = env.inventory(as_listed=True), _audit(env, by)
    report = do_evict(inv, nodeset, reason, dry_run=dry_run,
                      force=force, timeout=inv.daemon.command_timeout * env.timeout_scale(),
                      audit=audit)
    render_evict(env.output, report)
    return int(report.exit_code)


def unevict(
    ctx: typer.Context,
    nodeset: str = _nodes("return to service"),
    dry_run: bool = typer.Option(False, "--dry-run",
                                 help="Say what would change and show the commands; change nothing."),
    by: Optional[str] = BY,
) -> int:
    """Return NODESET to service: close each machine's quarantine record.

    Each joins the standby pool as unchecked: run brctl standby check before the
    daemon may swap it in. job.unevict_command (placeholder {node}; for Slurm
    scontrol update NodeName={node} State=RESUME) returns it to the scheduler.
    The audit trail and the daemon's notifier name who did it. Exit 0 when done (or
    not quarantined), 1 when an unevict_command failed, 2 for a name not in the
    inventory.
    """
    from brctl.operations.evict import unevict as do_unevict
    from brctl.render.daemon import render_evict

    env: Env = ctx.obj
    inv, audit = env.inventory(as_listed=True), _audit(env, by)
    report = do_unevict(inv, nodeset, dry_run=dry_run,
                        timeout=inv.daemon.command_timeout * env.timeout_scale(), audit=audit)
    render_evict(env.output, report)
    return int(report.exit_code)
