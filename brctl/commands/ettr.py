"""``brctl ettr``: effective training time ratio from the state database."""

from __future__ import annotations

import typer

from brctl.commands import _options as opt
from brctl.env import Env


def register(app: typer.Typer) -> None:
    """Add the command to the root app."""
    app.command("ettr")(ettr)


def ettr(
    ctx: typer.Context,
    window: float = typer.Option(3600.0, "--window", metavar="SECONDS", callback=opt.seconds,
                                 help="Sliding window for the windowed ratio."),
    points: int = typer.Option(40, "--points", metavar="N",
                               help="Columns of the chart (samples of the windowed ratio)."),
) -> int:
    """Show ETTR (productive time / observed wall-clock), cumulative and over a window.

    brctl daemon records each poll interval as productive (the job logged a new
    step) or not (down, restarting, hung). The chart shows the windowed ratio over
    the recorded time (0-100 %, the time range under it), then the lost time by
    cause: detection, diagnosis, standby, restart, replay, waiting for a human
    (brctl report draws the same as a page). Exit 0, also when nothing has been
    recorded for the job yet (it says so).
    """
    from brctl.core.errors import UsageError
    from brctl.operations.report import ettr as compute
    from brctl.render.report import render_ettr

    env: Env = ctx.obj
    inv = env.inventory(as_listed=True)
    if inv.job is None:
        raise UsageError(f"ettr: {inv.source} has no job: section")
    report = compute(inv, env.store(), window=window, points=points)
    render_ettr(env.output, inv.job.name, report)
    return int(report.exit_code)
