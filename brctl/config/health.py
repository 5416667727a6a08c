"""``health:``: settings of ``brctl health``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HealthSection:
    """Settings of brctl health (keys are added by the feature that reads them)."""
