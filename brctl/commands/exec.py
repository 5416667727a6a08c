"""``brctl exec``: run one command on many machines and fold identical output."""

from __future__ import annotations

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
                                        help="One argument: a shell command line (sh -c). "
                                             "Two or more: an argv list (put it after --)."),
    select: Optional[str] = opt.nodes("every machine in the inventory"),
    exclude: Optional[str] = opt.EXCLUDE,
    timeout: Optional[float] = opt.timeout(
        None, "Per-node command timeout (default: ssh.command_timeout)."),
    fanout: Optional[int] = typer.Option(None, "-f", "--fanout", metavar="N",
                                         help="Machines in flight at once (default: ssh.fanout)."),
    argv_only: bool = typer.Option(False, "--argv",
                                   help="Read a single argument as an argv too (a program name, "
                                        "no shell)."),
    stdin: bool = typer.Option(False, "-s", "--stdin",
                               help="Send brctl's standard input to the command on every node."),
    lines: bool = typer.Option(False, "-L", "--lines",
                               help="Print every output line as 'node: line', sorted by node "
                                    "(as clush -L), instead of folding identical output."),
) -> int:
    """Run CMD on every selected machine and fold identical output (ClusterShell style).

    The number of arguments decides, as with ssh, clush and pdsh: exactly one
    argument is a shell command line, run as the argv sh -c ARG on each node:

        brctl exec -w gpu[01-04] 'nvidia-smi -L | wc -l'

    Two or more are an argv list, each argument passed as it is (quoted per
    argument, no shell; the form the daemon and hooks use):

        brctl exec -w gpu[01-04] -- nvidia-smi -L

    --argv reads a single argument as an argv too (brctl exec --argv -- /opt/check).
    -s sends standard input to every node (brctl exec -s -- tee /etc/x < x).
    Remote stdout goes to stdout, remote stderr to stderr ('nodes: line').
    Exit 0 when every machine exited 0, 1 when some exited non-zero, 3 when some
    were unreachable, timed out, or refused auth or the host key.
    A timed-out command is killed with everything it started. Ctrl-C kills the
    running commands on every machine and waits up to 5 s for them; a second
    Ctrl-C exits at once (exit 130 either way). Each stream keeps its first and
    last ssh.output_keep bytes. With --json a cut stream also has its byte count
    (stdout_total, stderr_total), and output that is not valid UTF-8 its exact
    bytes in base64 (stdout_b64, stderr_b64; stdout shows U+FFFD for them).
    """
    import sys

    from brctl.core.errors import UsageError
    from brctl.operations.exec_ import command_argv, execute
    from brctl.render.exec import render

    env: Env = ctx.obj
    argv = command_argv(command, shell=not argv_only)
    if stdin and opt.STDIN_TAKEN in ctx.meta:
        raise UsageError(f"exec: -s/--stdin and {ctx.meta[opt.STDIN_TAKEN]} - both want standard input",
                         hint="give the node set with -w NODESET when sending stdin")
    data = sys.stdin.buffer.read() if stdin else None
    inv = env.inventory()
    nodes = inv.select(select, exclude)
    if not nodes:
        raise UsageError("exec: the selection is empty", hint="check -w / -x against brctl nodes")
    with env.output.progress("exec", len(nodes), [n.name for n in nodes]) as advance:
        report = execute(env.transport(), nodes, argv, timeout=timeout, stdin=data,
                         concurrency=fanout or inv.ssh.fanout, on_done=advance)
    render(env.output, report, lines=lines)
    return int(report.exit_code)
