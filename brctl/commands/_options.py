"""The options several commands share: ``-w/--nodes``, ``-x/--exclude``, ``-t/--timeout``, ``--by``,
and the callbacks every duration (``seconds``) and other float option (``finite``) is read by.

Declared once so the flags, metavars and wording cannot drift apart; each command
says only what its selection or timeout means. As with pdsh and clush, ``-w ^FILE``
reads the node set from FILE (one or more per line, ``#`` comments) and ``-w -``
from standard input; the inventory resolves ``@groups`` and refuses unknown names.
"""

from __future__ import annotations

import math
import re
import sys
from typing import Any, Optional

import typer

from brctl.core.errors import UsageError

EXAMPLE = "e.g. gpu[001-004], @rack:r01, @job!gpu3, ^FILE or - (stdin)"


STDIN_TAKEN = "brctl.stdin_taken"  # ctx.meta key: an option already read standard input


def _node_set_option(ctx: typer.Context, param: Any, value: Optional[str]) -> Optional[str]:
    if value == "-":
        ctx.meta[STDIN_TAKEN] = param.opts[0]
    return node_set_text(value)


def node_set_text(value: Optional[str]) -> Optional[str]:
    """A ``-w``/``-x`` value as a node set: ``^FILE`` and ``-`` are read, the rest kept.

    Raises:
        UsageError: FILE cannot be read, or it (or stdin) holds no names.
    """
    if value is None or (value != "-" and not value.startswith("^")):
        return value
    where = "standard input" if value == "-" else value[1:]
    try:
        if value == "-":
            text = sys.stdin.read()
        else:
            with open(value[1:], encoding="utf-8") as handle:
                text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"node set file {where}: {getattr(exc, 'strerror', None) or exc}") from None
    items = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    items = [word for line in items for word in line.split() if word]
    if not items:
        raise UsageError(f"node set from {where} is empty", hint="give one node set per line")
    return ",".join(items)


def _complete_nodes(ctx: typer.Context, incomplete: str) -> list[str]:
    from brctl.commands._complete import node_names  # completion only: keep --help light

    return node_names(ctx, incomplete)


def nodes(default_is: str) -> Any:
    """``-w/--nodes NODESET``: the machines to act on; ``default_is`` names the default."""
    return typer.Option(None, "-w", "--nodes", metavar="NODESET", callback=_node_set_option,
                        autocompletion=_complete_nodes,
                        help=f"Machines to act on, {EXAMPLE} (default: {default_is}).")


EXCLUDE: Any = typer.Option(None, "-x", "--exclude", metavar="NODESET", callback=_node_set_option,
                            autocompletion=_complete_nodes,
                            help="Machines to leave out (same forms as -w).")


BY: Any = typer.Option(
    None, "--by", metavar="NAME",
    help="Who is acting, for the audit trail (default: $SUDO_USER, else $USER, at this host).")


def timeout(default: Optional[float], meaning: str, **extra: Any) -> Any:
    """``-t/--timeout SECONDS``; ``meaning`` says what it bounds (and its default)."""
    return typer.Option(default, "-t", "--timeout", metavar="SECONDS", help=meaning,
                        callback=seconds, **extra)


def seconds(ctx: typer.Context, param: Any, value: Optional[float]) -> Optional[float]:
    """A duration option's callback: a finite number of seconds above zero, else exit 2
    naming the flag (typer reads ``nan``, ``inf`` and ``1e400`` as floats)."""
    if value is not None and not 0 < value < math.inf:  # NaN fails both
        raise UsageError(f"{param.opts[-1]} {value:g}: expected a finite number of seconds greater than 0")
    return value


def finite(ctx: typer.Context, param: Any, value: Optional[float]) -> Optional[float]:
    """Any other float option's callback: a finite number, else exit 2 naming the flag
    (no option of brctl means ``nan`` or ``inf``)."""
    if value is not None and not math.isfinite(value):
        raise UsageError(f"{param.opts[-1]} {value:g}: expected a finite number")
    return value


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str, what: str) -> float:
    """Seconds from ``90``, ``90s``, ``45m``, ``24h`` or ``2d``.

    Raises:
        UsageError: not a positive duration (the message names ``what``).
    """
    match = re.match(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([smhd]?)\s*$", text)  # not \d: '٣'
    seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"] if match else 0.0
    if not 0 < seconds < math.inf:  # 400 nines is inf
        raise UsageError(f"{what} {text!r}: expected a duration like 90s, 45m, 24h or 2d")
    return seconds
