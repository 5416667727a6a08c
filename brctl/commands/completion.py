"""``brctl completion SHELL``: print the shell-completion script for bash, zsh or fish."""

from __future__ import annotations

from enum import Enum

import typer

from brctl.core.errors import ExitCode

COMPLETE_VAR = "_BRCTL_COMPLETE"  # what typer's scripts set when they ask brctl for candidates


class Shell(str, Enum):
    """The shells typer writes completion scripts for."""

    bash = "bash"
    zsh = "zsh"
    fish = "fish"


def register(app: typer.Typer) -> None:
    """Add the command to the root app."""
    app.command("completion")(completion)


def completion(
    shell: Shell = typer.Argument(..., metavar="SHELL", help="bash, zsh or fish."),
) -> int:
    """Print the completion script for SHELL: subcommands, options, machines and @groups.

    Machine names and groups (@all, @job, @standby, @rack:r01) come from the
    inventory the line names with -i, else $BRCTL_INVENTORY, else ./inventory.yaml.

    \b
    Install it:
      bash: brctl completion bash > ~/.local/share/bash-completion/completions/brctl
      zsh:  brctl completion zsh > "${fpath[1]}/_brctl"
      fish: brctl completion fish > ~/.config/fish/completions/brctl.fish
    or, for this shell only: eval "$(brctl completion bash)".
    """
    from typer._completion_shared import get_completion_script

    script = get_completion_script(prog_name="brctl", complete_var=COMPLETE_VAR, shell=shell.value)
    typer.echo(script)
    return int(ExitCode.OK)
