"""``stacks:``: settings of ``brctl stacks`` and the daemon's stall evidence (issue 32).

Every key has a default, so ``stacks: {}`` works. Both thresholds judge the
flight recorders' evidence (``analysis/wavefront.py``, ``analysis/stragglers.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from brctl.core.schema import field as sfield
from brctl.core.schema import positive


@dataclass(frozen=True)
class StacksSection:
    """Settings of brctl stacks' collective evidence."""

    # A pending collective is stuck once its earliest enqueue is this old (seconds, on
    # the recording machine's own clock), or pending in two captures --interval apart;
    # younger, it is in flight. Above the slowest healthy collective (a large all-gather,
    # a checkpoint barrier).
    stuck_after: float = sfield(60.0, check=positive)
    # A rank that arrives last by more than this (ms behind its peers' median) in most
    # of a group's recent collectives is late: well above NTP/PTP clock error.
    straggler_threshold_ms: float = sfield(20.0, check=positive)
