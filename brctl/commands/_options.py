"""The options several commands share: ``-w/--nodes``, ``-x/--exclude``, ``-t/--timeout``.

Declared once so the flags, metavars and wording cannot drift apart; each command
says only what its selection or timeout means.
"""

from __future__ import annotations

import re
from typing import Any, Optional

import typer

from brctl.core.errors import UsageError

EXAMPLE = "e.g. gpu[001-004]"


def nodes(default_is: str) -> Any:
    """``-w/--nodes NODESET``: the machines to act on; ``default_is`` names the default."""
    return typer.Option(None, "-w", "--nodes", metavar="NODESET",
                        help=f"Machines to act on, {EXAMPLE} (default: {default_is}).")


EXCLUDE: Any = typer.Option(None, "-x", "--exclude", metavar="NODESET",
                            help="Machines to leave out.")


def timeout(default: Optional[float], meaning: str, **extra: Any) -> Any:
    """``-t/--timeout SECONDS``; ``meaning`` says what it bounds (and its default)."""
    return typer.Option(default, "-t", "--timeout", metavar="SECONDS", help=meaning, **extra)


def check_seconds(flag: str, value: Optional[float]) -> None:
    """Refuse a duration option that is not above zero (exit 2, naming the flag)."""
    if value is not None and value <= 0:
        raise UsageError(f"{flag} {value:g}: expected seconds greater than 0")


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str, what: str) -> float:
    """Seconds from ``90``, ``90s``, ``45m``, ``24h`` or ``2d``.

    Raises:
        UsageError: not a positive duration (the message names ``what``).
    """
    match = re.match(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$", text)
    seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"] if match else 0.0
    if seconds <= 0:
        raise UsageError(f"{what} {text!r}: expected a duration like 90s, 45m, 24h or 2d")
    return seconds
