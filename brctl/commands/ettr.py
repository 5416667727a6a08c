"""``brctl ettr``: effective training time ratio from the state database."""

from __future__ import annotations

import typer

from brctl.env import Env


def register(app: typer.Typer) -> None:
    """Add the command to the root app."""
    app.command("ettr")(ettr)


def ettr(
    ctx: typer.Context,
    window: float = typer.Option(3600.0, "--window", metavar="SECONDS",
                                 help="Sliding window for the windowed ratio."),
    points: int = typer.Option(40, "--points", metavar="N", help="Samples in the sparkline."),
) -> int:
    """Show ETTR (productive time / observed wall-clock), cumulative and over a window.

    brctl daemon records each poll interval as productive (the job logged a new
    step) or not (down, restarting, hung). The sparkline shows the windowed ratio
    over time. Exit 0, also when nothing has been recorded for the job yet (it says so).
    """
    from brctl.commands._render_daemon import render_ettr
    from brctl.core.errors import UsageError
    from brctl.operations.daemon_state import DaemonState
    from brctl.operations.fleet import ettr as compute

    env: Env = ctx.obj
    inv = env.inventory(as_listed=True)
    if inv.job is None:
        raise UsageError(f"ettr: {inv.source} has no job: section")
    if points < 1:
        raise UsageError(f"--points {points}: expected at least 1")
    intervals = DaemonState(env.store(), inv.job.name).intervals()
    report = compute(intervals, window=window, points=points)
    render_ettr(env.output, inv.job.name, report)
    return int(report.exit_code)
