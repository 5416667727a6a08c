"""Shell-completion candidates drawn from the inventory: machine names and ``@groups``.

Called by typer's completion machinery (``_BRCTL_COMPLETE`` set by the script that
``brctl completion SHELL`` prints), where the root callback has not run: the
inventory is found as every command finds it (``-i`` already typed on the line,
``$BRCTL_INVENTORY``, ``./inventory.yaml``). Completing must never fail loudly, so
any error gives no candidates.
"""

from __future__ import annotations

import os

import typer

from brctl.core.errors import BrctlError
from brctl.core.nodeset import OPERATORS


def candidates(names: list[str], groups: list[str], incomplete: str) -> list[str]:
    """What completes the last item of a node set being typed (after its last operator)."""
    cut = max(incomplete.rfind(op) for op in OPERATORS) + 1
    head, last = incomplete[:cut], incomplete[cut:]
    words = [f"@{g}" for g in groups] if last.startswith("@") else names
    return [head + w for w in words if w.startswith(last)]


def node_names(ctx: typer.Context, incomplete: str) -> list[str]:
    """Machine names and ``@groups`` of the inventory that complete ``incomplete``."""
    from brctl.load.inventory import find_inventory, load_inventory

    explicit = ctx.find_root().params.get("inventory")
    try:
        inv = load_inventory(find_inventory(explicit, dict(os.environ)))
    except BrctlError:
        return []
    return candidates(list(inv.nodes), list(inv.groups()), incomplete)
