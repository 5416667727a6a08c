"""Effective training time ratio (ETTR): productive time / wall-clock time.

The daemon records each poll interval as productive (the job made a new step
during it) or not (down, restarting, hung, waiting for a decision). Pure
functions here turn those intervals into the cumulative ratio, a sliding-window
series (``brctl ettr`` and ``brctl report`` draw it; ``analysis.report.lost_time``
names the cause of the unproductive time). Time the daemon did not watch is not counted
either way (it cannot know).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Interval:
    """``[start, end)`` seconds since the epoch, productive or not."""

    start: float
    end: float
    productive: bool


def _overlap(iv: Interval, lo: float, hi: float) -> float:
    return max(0.0, min(iv.end, hi) - max(iv.start, lo))


def ratio(intervals: Sequence[Interval], lo: Optional[float] = None,
          hi: Optional[float] = None) -> Optional[float]:
    """Productive / observed time within ``[lo, hi)`` (all time when None); None if nothing observed."""
    if not intervals:
        return None
    lo = min(iv.start for iv in intervals) if lo is None else lo
    hi = max(iv.end for iv in intervals) if hi is None else hi
    total = productive = 0.0
    for iv in intervals:
        span = _overlap(iv, lo, hi)
        total += span
        if iv.productive:
            productive += span
    return productive / total if total > 0 else None


def totals(intervals: Sequence[Interval]) -> tuple[float, float]:
    """(productive seconds, observed seconds)."""
    observed = sum(max(0.0, iv.end - iv.start) for iv in intervals)
    productive = sum(max(0.0, iv.end - iv.start) for iv in intervals if iv.productive)
    return productive, observed


def window_series(intervals: Sequence[Interval], *, window: float, points: int,
                  now: Optional[float] = None) -> list[tuple[float, Optional[float]]]:
    """``points`` samples of the sliding-window ETTR ending at evenly spaced times.

    The samples span from the first observation (or ``now - window*points``,
    whichever is later) to ``now``; each is the ratio over ``[t - window, t)``.
    """
    if not intervals or points < 1:
        return []
    end = max(iv.end for iv in intervals) if now is None else now
    first = min(iv.start for iv in intervals)
    begin = max(first, end - window * points)
    if points == 1 or end <= begin:
        return [(end, ratio(intervals, end - window, end))]
    step = (end - begin) / (points - 1)
    out = []
    for i in range(points):
        t = begin + i * step
        out.append((t, ratio(intervals, t - window, t)))
    return out
