"""``update:`` — where releases live on each node (``brctl update``)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from brctl.core.schema import at_least_one, field, positive


def _root(value: str) -> str:
    if not value.strip():
        raise ValueError("expected a directory path")
    for name in re.findall(r"\{([^}]*)\}", value):
        if name != "node":
            raise ValueError(f"unknown placeholder {{{name}}}: only {{node}} is allowed here")
    return value


@dataclass(frozen=True)
class UpdateSection:
    """Hot update settings."""

    # <root>/releases/<version>/ and the <root>/current symlink on each machine; {node}
    # is replaced by the machine's name (machines sharing one filesystem, local nodes).
    root: str = field("/opt/train", check=_root)
    # a lazy push is applied by `brctl update apply --if-due` once this many seconds passed
    window: float = field(24 * 3600.0, check=positive)
    # releases kept on each machine (and artifacts on the controller) after a switch:
    # the most recently pushed ones, plus always the job's, the previous and the pending one
    keep: int = field(5, check=at_least_one)
    # `update push DIR`: the tree's files together may hold at most this many bytes (the
    # controller reads them whole, as root, from a tree the job user may own)
    max_bytes: int = field(1 << 30, check=at_least_one)
