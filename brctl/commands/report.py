"""``brctl report``: one self-contained HTML page of the job's incidents, from the state database."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from brctl.commands import _options as opt
from brctl.env import Env


def register(app: typer.Typer) -> None:
    """Add the command to the root app."""
    app.command("report")(report)


def report(
    ctx: typer.Context,
    output: Optional[Path] = typer.Option(None, "-o", "--output", metavar="FILE",
                                          help="Where to write the page (default: "
                                               "brctl-report-JOB.html here)."),
    png: bool = typer.Option(False, "--png", help="Also write a picture of the page "
                                                  "(FILE with .png) for chat; needs Chromium."),
    window: float = typer.Option(3600.0, "--window", metavar="SECONDS", callback=opt.seconds,
                                 help="Sliding window of the ETTR line."),
    points: int = typer.Option(200, "--points", metavar="N", help="Samples of the ETTR line."),
) -> int:
    """Write one HTML page telling the job's incidents, for a post-mortem or a chat.

    From what brctl daemon recorded in the state database (no machine is
    contacted): ETTR over time with its axis and window, lost time by cause
    (detection, diagnosis, standby, restart, replay, waiting for a human), the
    incident timeline (detections, decisions, evictions, swaps, restarts,
    rollbacks, each with its reason) and the machines involved. The page is one
    file that loads nothing from the network (inline SVG, a few lines of inline
    script); every name and reason in it is escaped. --png also has a headless
    Chromium take a picture of it (exit 2 when none is installed). Exit 0, also
    when nothing has been recorded for the job yet (the page says so).
    """
    from brctl.core.errors import UsageError
    from brctl.operations.report import write_report
    from brctl.render.report import page, render_report

    env: Env = ctx.obj
    inv = env.inventory(as_listed=True)
    if inv.job is None:
        raise UsageError(f"report: {inv.source} has no job: section")
    target = output if output is not None else Path(f"brctl-report-{_safe(inv.job.name)}.html")
    out = env.output
    written = write_report(inv, env.store(), lambda r: page(r, out.stamp, out.utc), target,
                           window=window, points=points, png=png, environ=env.environ,
                           timeout_scale=env.timeout_scale())
    render_report(out, written)
    return int(written.exit_code)


def _safe(name: str) -> str:
    """The job's name as a file name (no path separators, no leading dot)."""
    import re

    return re.sub(r"[^A-Za-z0-9_.-]", "_", name).lstrip(".") or "job"
