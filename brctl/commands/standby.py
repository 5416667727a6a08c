"""``brctl standby size|check|list``: the warm standby pool."""

from __future__ import annotations

from typing import Optional

import typer

from brctl.commands import _options as opt
from brctl.env import Env

app = typer.Typer(help="Size, self-check and list the warm standby pool.", no_args_is_help=True)


def register(root: typer.Typer) -> None:
    """Add the command group to the root app."""
    root.add_typer(app, name="standby", help="Warm standby pool: size it, self-check it, list it.")


@app.command("size")
def size(
    ctx: typer.Context,
    machines: Optional[int] = typer.Option(None, "--machines", metavar="N",
                                           help="Machines in the job (default: the job's count)."),
    quantile: float = typer.Option(0.99, "--quantile", metavar="Q", callback=opt.finite,
                                   help="Coverage probability."),
    window: Optional[float] = typer.Option(None, "--window", metavar="HOURS", callback=opt.finite,
                                           help="Replenish window (default daemon.replenish_window)."),
    daily_rate: Optional[float] = typer.Option(
        None, "--daily-failure-rate", metavar="P", callback=opt.finite,
        help="Per-machine failure probability per day (default: from the recorded history)."),
) -> int:
    """Size the pool: the QUANTILE of Binomial(machines, p) failures in the window.

    p = 1-(1-P)^(window/24h) with P from --daily-failure-rate, or estimated from
    the evictions recorded in the state database. With --machines, --window and
    --daily-failure-rate all given it is a pure calculation: no inventory needed.
    JSON key: size.
    """
    from brctl.operations.ledger.state import DaemonState
    from brctl.operations.standby.ops import standby_size
    from brctl.render.daemon import render_size

    env: Env = ctx.obj
    if machines is not None and window is not None and daily_rate is not None:
        # every input given: a pure calculation, no inventory or history needed
        report = standby_size(machines, quantile, window, daily_rate, None)
        render_size(env.output, report, None)
        return int(report.exit_code)
    inv = env.inventory(as_listed=True)
    n = machines if machines is not None else (len(inv.job.nodes) if inv.job else len(inv.nodes))
    hours = window if window is not None else inv.daemon.replenish_window
    state = DaemonState(env.store(), inv.job_key) if daily_rate is None else None
    report = standby_size(n, quantile, hours, daily_rate, state)
    render_size(env.output, report, have=len(inv.standby))
    return int(report.exit_code)


@app.command("list")
def list_pool(ctx: typer.Context) -> int:
    """List the pool and each machine's standing.

    Standing: checked, failed, untested (every self-check stage skipped),
    unchecked, quarantined, or in-job (swapped in by the daemon).
    """
    from brctl.operations.ledger.state import DaemonState
    from brctl.operations.standby.ops import standby_list
    from brctl.render.daemon import render_pool

    env: Env = ctx.obj
    inv = env.inventory(as_listed=True)
    report = standby_list(inv, DaemonState(env.store(), inv.job_key))
    render_pool(env.output, report, "standby.list")
    return int(report.exit_code)


@app.command("check")
def check(
    ctx: typer.Context,
    select: Optional[str] = opt.nodes("every pool machine"),
    dry_run: bool = typer.Option(False, "--dry-run",
                                 help="Say which machines would be checked, with which stages; "
                                      "contact none, mark nothing."),
) -> int:
    """Self-check the pool and mark each machine checked, failed or untested.

    Runs the health sweep, then the diagnose ladder's machine-local stages (EUD
    with dcgmi diag where dcgmi exists, the intra-machine all-to-all) with no
    symptom needed. Checked: health and every stage that could run passed.
    Untested: every stage was skipped (no dcgmi, no torch): nothing proved the
    machine good. Only checked machines are swapped into the job by the daemon.
    Exit 0 when every machine passed, 1 when some failed, 3 when some gave no
    answer or could not be tested. --dry-run lists the machines and stages and
    exits 0. On a terminal, each stage shows its machines done and left, the one it
    still waits on, and the time.
    """
    from brctl.operations.standby.ops import standby_check
    from brctl.render.daemon import render_pool

    env: Env = ctx.obj
    with env.output.stages("standby check") as track:
        report = standby_check(env.inventory(as_listed=True), env.transport(), env.store(),
                               select, runner=env.probes(),
                               timeout_scale=env.timeout_scale(), dry_run=dry_run,
                               track=track)
    render_pool(env.output, report, "standby.check", report.exit_code)
    return int(report.exit_code)
