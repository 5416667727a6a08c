"""``brctl evict NODE --reason`` / ``brctl unevict NODE``: quarantine by hand."""

from __future__ import annotations

from typing import Optional

import typer

from brctl.env import Env

BY: Optional[str] = typer.Option(
    None, "--by", metavar="NAME",
    help="Who is acting, for the record (default: $SUDO_USER, else $USER, at this host).")


def register(app: typer.Typer) -> None:
    """Add both commands to the root app."""
    app.command("evict")(evict)
    app.command("unevict")(unevict)


def evict(
    ctx: typer.Context,
    node: str = typer.Argument(..., metavar="NODE", help="The machine to take out of service."),
    reason: str = typer.Option(..., "--reason", metavar="TEXT",
                               help="Why (recorded, and given to job.evict_command as {reason})."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Check the caps; change nothing."),
    by: Optional[str] = BY,
) -> int:
    """Take NODE out of service: quarantine it and tell the scheduler.

    The record is kept in the state database (with who evicted it); a
    quarantined machine is never picked as a standby and the daemon never swaps
    it back in. job.evict_command (placeholders {node} {reason}) drains it in the
    scheduler. A machine of the job stays in its machine list until the daemon,
    at its next poll, swaps a checked standby in and restarts the job; with no
    daemon running, the output says what remains to do. The daemon's caps apply
    (daemon.max_evictions_per_hour, daemon.max_evict_fraction), checked and
    recorded at once: a refusal is recorded and exits 4. Exit 0 when done (or
    already quarantined), 1 when the evict_command failed.
    """
    from brctl.commands._render_daemon import render_evict
    from brctl.operations.daemon_state import DaemonState
    from brctl.operations.fleet import evict as do_evict
    from brctl.operations.update import who

    env: Env = ctx.obj
    inv = env.inventory(as_listed=True)
    report = do_evict(inv, DaemonState(env.store(), inv.job_key), node, reason, dry_run=dry_run,
                      timeout=inv.daemon.command_timeout * env.timeout_scale(),
                      operator=by or who(env.environ))
    render_evict(env.output, report)
    return int(report.exit_code)


def unevict(
    ctx: typer.Context,
    node: str = typer.Argument(..., metavar="NODE", help="The machine to return to service."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would change; change nothing."),
    by: Optional[str] = BY,
) -> int:
    """Return NODE to service: close its quarantine record.

    It joins the standby pool as unchecked: run brctl standby check before the
    daemon may swap it in. job.unevict_command (placeholder {node}; for Slurm
    scontrol update NodeName={node} State=RESUME) returns it to the scheduler.
    The record names who did it. Exit 0 when done (or not quarantined), 1 when
    the unevict_command failed.
    """
    from brctl.commands._render_daemon import render_evict
    from brctl.operations.daemon_state import DaemonState
    from brctl.operations.fleet import unevict as do_unevict
    from brctl.operations.update import who

    env: Env = ctx.obj
    inv = env.inventory(as_listed=True)
    report = do_unevict(inv, DaemonState(env.store(), inv.job_key), node, dry_run=dry_run,
                        timeout=inv.daemon.command_timeout * env.timeout_scale(),
                        operator=by or who(env.environ))
    render_evict(env.output, report)
    return int(report.exit_code)
