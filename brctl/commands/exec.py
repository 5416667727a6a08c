"""``brctl exec``: run one command on many machines and fold identical output."""

from __future__ import annotations

import shlex
from typing import Optional

import typer

from brctl.commands import _options as opt
from brctl.env import Env


def register(app: typer.Typer) -> None:
    """Add the command to the root app."""
    app.command(
        "exec",
        context_settings={"allow_interspersed_args": False},
    )(exec_command)


def exec_command(
    ctx: typer.Context,
    command: list[str] = typer.Argument(..., metavar="CMD [ARG...]",
                                        help="The command as an argv list (put it after --)."),
    select: Optional[str] = opt.nodes("every machine in the inventory"),
    exclude: Optional[str] = opt.EXCLUDE,
    timeout: Optional[float] = opt.timeout(
        None, "Per-node command timeout (default: ssh.command_timeout)."),
    fanout: Optional[int] = typer.Option(None, "-f", "--fanout", metavar="N",
                                         help="Machines in flight at once (default: ssh.fanout)."),
) -> int:
    """Run CMD on every selected machine and fold identical output (ClusterShell style).

    CMD is an argv list, never passed through a shell: write `brctl exec -w gpu[01-04]
    -- nvidia-smi -L`; a single quoted argument is split like a shell would
    (`brctl exec 'uname -r'`), still without a shell. For pipes, run `sh -c '...'`
    explicitly. Exit 0 when every machine exited 0, 1 when some exited non-zero,
    3 when some were unreachable, timed out, or refused auth or the host key.
    """
    from brctl.commands._render_exec import render
    from brctl.core.errors import UsageError
    from brctl.operations.exec_ import execute

    env: Env = ctx.obj
    argv = shlex.split(command[0]) if len(command) == 1 else list(command)
    if not argv:
        raise UsageError("exec: empty command")
    opt.check_seconds("--timeout", timeout)
    inv = env.inventory()
    nodes = inv.select(select, exclude)
    if not nodes:
        raise UsageError("exec: the selection is empty", hint="check -w / -x against brctl nodes")
    with env.output.progress("exec", len(nodes)) as advance:
        report = execute(env.transport(), nodes, argv, timeout=timeout,
                         concurrency=fanout or inv.ssh.fanout, on_done=advance)
    render(env.output, report)
    return int(report.exit_code)
