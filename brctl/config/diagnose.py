"""``diagnose:``: settings of ``brctl diagnose``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DiagnoseSection:
    """Settings of brctl diagnose (keys are added by the feature that reads them)."""
