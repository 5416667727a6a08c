"""``brctl nodes``: show the inventory, node sets and the job's groups by machine."""

from __future__ import annotations

from typing import Optional, cast

import typer

from brctl.commands import _options as opt
from brctl.commands._complete import node_names
from brctl.core.errors import UsageError
from brctl.env import Env


def register(app: typer.Typer) -> None:
    """Add the command to the root app."""
    app.command("nodes")(nodes)


def nodes(
    ctx: typer.Context,
    sets: Optional[list[str]] = typer.Argument(
        None, metavar="[NODESET]...", autocompletion=node_names,
        help="With --fold/--expand/--count: the node sets to combine ('-' reads stdin)."),
    fold: bool = typer.Option(False, "-f", "--fold", help="Print NODESET... folded, as nodeset -f."),
    expand: bool = typer.Option(False, "-e", "--expand", help="Print NODESET... expanded, as nodeset -e."),
    count: bool = typer.Option(False, "-c", "--count", help="Print how many machines NODESET... names."),
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

    With --fold, --expand or --count it is a node-set calculator like ClusterShell's
    nodeset: 'brctl nodes -f gpu1 gpu2 gpu3' prints gpu[1-3]; operators ! & ^,
    steps gpu[1-16/2] and @groups (which read the inventory) work as in -w.
    """
    from brctl.operations.nodes import SetMode, describe, node_sets
    from brctl.render.nodes import render, render_sets

    env: Env = ctx.obj
    modes = [m for m, on in (("fold", fold), ("expand", expand), ("count", count)) if on]
    if len(modes) > 1:
        raise UsageError("--fold, --expand and --count: give one")
    if sets and not modes:
        raise UsageError(f"nodes {sets[0]!r}: node sets as arguments need --fold, --expand or --count",
                         hint="to pick machines for the table, use -w NODESET")
    if modes:
        patterns = [opt.node_set_text(s) or "" for s in (sets or ["-"])]
        sets_report = node_sets(patterns, cast(SetMode, modes[0]), env.inventory)
        render_sets(env.output, sets_report)
        return int(sets_report.exit_code)
    # a Slurm job that is not running still shows (its state, no machines)
    inv = env.inventory(job_may_wait=True)
    probed = [n.name for n in inv.select(select, exclude)] if probe else []
    with env.output.progress("probe", len(probed), probed) as advance:
        report = describe(inv, select, exclude, kinds, probe=env.probes() if probe else None,
                          timeout=timeout * env.timeout_scale(), on_done=advance)
    render(env.output, report)
    return int(report.exit_code)
