"""``update:`` — where releases live on each node."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class UpdateSection:
    """Hot update settings."""

    root: str = "/opt/train"  # <root>/releases/<version>/ and the <root>/current symlink
