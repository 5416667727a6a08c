"""``daemon:``: settings of ``brctl daemon``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DaemonSection:
    """Settings of brctl daemon (keys are added by the feature that reads them)."""
