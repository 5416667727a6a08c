"""``brctl init --local|--example``: write a starting inventory."""

from __future__ import annotations

import typer

from brctl.core.errors import UsageError
from brctl.env import Env


def register(app: typer.Typer) -> None:
    """Add the command to the root app."""
    app.command("init")(init)


def init(
    ctx: typer.Context,
    local: bool = typer.Option(False, "--local",
                               help="Four machines that are this host (connection: local)."),
    reference: bool = typer.Option(False, "--example",
                                   help="The richly commented reference of every key, to edit."),
    output: str = typer.Option("inventory.yaml", "-o", "--output", metavar="FILE",
                               help="Where to write it."),
    force: bool = typer.Option(False, "--force", help="Replace FILE if it exists."),
) -> int:
    """Write a starting inventory to ./inventory.yaml (or FILE), where brctl looks first.

    --local writes a working inventory of four local machines and a standby, all this
    host, so every command can be tried without a cluster (brctl nodes, brctl exec
    hostname, brctl health). --example writes the commented reference
    (inventory.example.yaml) to fill in for a real cluster. An existing FILE is kept
    (exit 2) unless --force.
    """
    from pathlib import Path

    from brctl.operations.init import write_example

    env: Env = ctx.obj
    if local == reference:
        raise UsageError("init: give one of --local or --example")
    report = write_example("local.yaml" if local else "inventory.example.yaml", Path(output),
                           force=force)
    if env.output.json:
        env.output.emit_json("init", report.to_json())
    else:
        env.output.plain(f"wrote {report.path}; try: brctl -i {report.path} nodes\n")
    return int(report.exit_code)
