"""Find and read the inventory file: ``-i FILE``, else ``$BRCTL_INVENTORY``, else ./inventory.yaml.

brctl never falls back to local nodes by itself: cron must not run against the
wrong cluster.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from brctl.analysis.inventory import Inventory, from_document
from brctl.core.errors import InputError


def find_inventory(explicit: str | None, environ: dict[str, str] | None = None) -> Path:
    """The inventory path by precedence; exit 2 with a hint when there is none."""
    env = os.environ if environ is None else environ
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise InputError(f"inventory {explicit}: no such file")
        return path
    if env.get("BRCTL_INVENTORY"):
        path = Path(env["BRCTL_INVENTORY"]).expanduser()
        if not path.is_file():
            raise InputError(f"inventory {path} (from $BRCTL_INVENTORY): no such file")
        return path
    path = Path("inventory.yaml")
    if path.is_file():
        return path
    raise InputError(
        "no inventory: give -i FILE, set $BRCTL_INVENTORY, or create ./inventory.yaml",
        hint="try the local example: brctl -i examples/local.yaml nodes "
        "(see inventory.example.yaml for every key)",
    )


def load_inventory(path: Path) -> Inventory:
    """Read, parse (``yaml.safe_load``) and validate the inventory at ``path``."""
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"inventory {source}: cannot read: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputError(f"inventory {source}:{where}: malformed YAML: {problem}") from None
    return from_document(data, source)
