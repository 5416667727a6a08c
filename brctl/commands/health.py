"""``brctl health``: real-time checks of every machine, folded across nodes."""

from __future__ import annotations

from typing import Optional

import typer

from brctl.commands import _options as opt
from brctl.env import Env


def register(app: typer.Typer) -> None:
    """Add the command to the root app."""
    app.command("health")(health_command)


def health_command(
    ctx: typer.Context,
    select: Optional[str] = opt.nodes("every machine"),
    exclude: Optional[str] = opt.EXCLUDE,
    watch: Optional[float] = typer.Option(None, "--watch", metavar="SECONDS", callback=opt.seconds,
                                          help="Repeat every SECONDS; after the first report "
                                               "print only the checks whose status changed "
                                               "(with --json: one document per line, NDJSON)."),
    count: Optional[int] = typer.Option(None, "--count", metavar="N",
                                        help="With --watch: stop after N sweeps."),
    timeout: Optional[float] = opt.timeout(None, "Per-node probe timeout (default: health.timeout)."),
) -> int:
    """Check GPUs (NVML), kernel-log Xids, InfiniBand/NICs, disks and training processes.

    Each check is ok, warn, fail, unknown (it should have looked and could not:
    NVML unusable on a machine declared with GPUs, a log or /proc not readable) or
    skip (it does not apply) with a one-line reason; healthy machines
    fold into one line (gpu[001-015]: ok) and each finding names its machines.
    Deltas (link_downed, NVLink and PCIe errors) and the kernel-log cursor are kept
    per machine in the state directory; thresholds and the checks that run come
    from the inventory's health: section (brctl-inventory(5)). Machines with a
    confident eviction signal are listed under "evict". Exit 0 healthy, 1 some
    check failed, 3 some machine gave no answer or some check is unknown (turn a
    check off in health.checks where it cannot apply).
    """
    from brctl.core.errors import UsageError
    from brctl.operations.health import HealthReport, sweep, sweeps
    from brctl.render.health import render, render_changes

    env: Env = ctx.obj
    if count is not None and count < 1:
        raise UsageError(f"--count {count}: expected a whole number >= 1")
    inv = env.inventory()
    nodes = inv.select(select, exclude)
    if not nodes:
        raise UsageError("health: the selection is empty", hint="check -w / -x against brctl nodes")
    env.output.ndjson = watch is not None  # --watch --json: one document per line
    per_node = (timeout or inv.health.timeout) * env.timeout_scale()

    def one_sweep() -> HealthReport:
        with env.output.progress("health", len(nodes), [n.name for n in nodes]) as advance:
            return sweep(inv, env.transport(), nodes, env.store(), runner=env.probes(),
                         timeout=per_node, on_done=advance)

    previous: HealthReport | None = None
    for report in sweeps(one_sweep, every=watch, count=count, sleep=env.sleep):
        if previous is None:
            render(env.output, report)
        else:
            render_changes(env.output, previous, report)
        previous = report
    assert previous is not None  # sweeps() always runs one
    return int(previous.exit_code)
