"""Global options anywhere: ``brctl health --json`` reads as ``brctl --json health``.

Click only accepts a group's options before its subcommand; SREs type them where
they think of them (``kubectl get pods -o json``). ``hoist`` moves brctl's global
options to the front of argv, walking the command tree so that it never takes a
subcommand option's value for one (``--reason -v``) and never touches what a
command takes verbatim: anything after ``--`` and, for commands that stop parsing
options at their first argument (``exec``), everything from that argument on.
"""

from __future__ import annotations

from typing import Any

# The root callback's options (brctl/cli/app.py); -vv style counts are flags too.
FLAGS = frozenset({"--json", "--debug", "-v", "--verbose", "-q", "--quiet", "--utc"})
VALUED = frozenset({"-i", "--inventory"})


def _is_global_flag(token: str) -> bool:
    return token in FLAGS or (len(token) > 2 and token[0] == "-" and token[1] != "-"
                              and set(token[1:]) == {"v"})


def _takes_value(command: Any, token: str) -> bool:
    """Whether ``token`` is an option of ``command`` that is followed by its value."""
    name = token.split("=", 1)[0]
    for param in getattr(command, "params", ()):
        if getattr(param, "param_type_name", "") != "option" or name not in param.opts:
            continue
        return "=" not in token and not param.is_flag and not param.count
    return False


def hoist(argv: list[str], root: Any) -> tuple[list[str], list[str]]:
    """Split ``argv`` into (global options, the rest), in their original order.

    Args:
        argv: the command line after ``brctl``.
        root: the click group built from the typer app (its subcommands and params).

    Returns:
        The global option tokens (with ``-i``'s value) and every other token; run
        ``globals + rest``.
    """
    front: list[str] = []
    rest: list[str] = []
    command = root
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            rest += argv[i:]
            break
        if _is_global_flag(token):
            front.append(token)
        elif token in VALUED and i + 1 < len(argv):
            front += argv[i:i + 2]
            i += 1
        elif token.startswith(("--inventory=", "-i")) and token not in VALUED and \
                not _takes_value(command, token) and _inventory_glued(token):
            front.append(token)
        elif token.startswith("-") and token != "-":
            rest.append(token)
            if _takes_value(command, token) and i + 1 < len(argv):
                rest.append(argv[i + 1])
                i += 1
        else:
            rest.append(token)
            sub = getattr(command, "commands", {}).get(token)
            if sub is not None:
                command = sub
            elif not command.context_settings.get("allow_interspersed_args", True):
                rest += argv[i + 1:]
                break
        i += 1
    return front, rest


def _inventory_glued(token: str) -> bool:
    """``--inventory=FILE`` or ``-iFILE``."""
    return token.startswith("--inventory=") or (token.startswith("-i") and len(token) > 2
                                                and not token.startswith("--"))


def named_command(argv: list[str]) -> str | None:
    """The subcommand ``argv`` names: its first word that is not a global option
    (``-i``'s value skipped); None when another option comes first (``--help``,
    ``--version``: the root answers) or there is no word."""
    i = 0
    while i < len(argv):
        token = argv[i]
        if token in VALUED:
            i += 2
        elif _is_global_flag(token) or _inventory_glued(token):
            i += 1
        else:
            return None if token.startswith("-") else token
    return None
