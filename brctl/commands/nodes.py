"""``brctl nodes``: show the inventory, node sets and the job's groups by machine."""

from __future__ import annotations

from typing import Optional

import typer

from brctl.commands import _options as opt
from brctl.env import Env


def register(app: typer.Typer) -> None:
    """Add the command to the root app."""
    app.command("nodes")(nodes)


def nodes(
    ctx: typer.Context,
    select: Optional[str] = opt.nodes("every machine"),
    exclude: Optional[str] = opt.EXCLUDE,
    kinds: str = typer.Option("pp,dp", "--groups", metavar="KINDS",
                              help="Group kinds to tabulate: tp,cp,ep,dp,edp,pp or 'all'."),
    probe: bool = typer.Option(False, "--probe",
                               help="Also contact each machine: Python, hostname, CPUs, ssh peer."),
    timeout: float = opt.timeout(30.0, "Per-machine timeout for --probe."),
) -> int:
    """Show the inventory's machines and, when a job is defined, its parallel groups.

    The table lists each machine's address, connection, GPUs, labels and role (job,
    standby). With a job it also shows which machines form each group of the chosen
    kinds (default PP and DP), so you can see what an over-eviction would take.
    With --probe every machine is contacted (brctl's probe code is shipped and cached
    there if needed); exit 3 when some machine did not answer.
    """
    from brctl.commands._render_nodes import render
    from brctl.operations.nodes import describe

    env: Env = ctx.obj
    report = describe(env.inventory(), select, exclude, kinds, probe=env.probes() if probe else None,
                      timeout=timeout * env.timeout_scale())
    render(env.output, report)
    return int(report.exit_code)
