"""Warm standby pool sizing: a quantile of Binomial(machines, p).

ByteRobust keeps self-checked machines warm so an eviction swaps one in instead of
waiting for a requeue. How many: enough to cover the machines that fail before
the pool is replenished, with high probability. With ``n`` machines each failing
with probability ``p`` in the replenish window, the failures are Binomial(n, p);
the pool is its ``q`` quantile (smallest k with P[X <= k] >= q).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

DAY_HOURS = 24.0


def window_probability(daily_rate: float, window_hours: float) -> float:
    """Per-machine failure probability within the window from a daily one: 1-(1-p)^(w/24h)."""
    if not 0 <= daily_rate <= 1:
        raise ValueError(f"daily failure rate {daily_rate!r} is not a probability in [0, 1]")
    if daily_rate == 1:
        return 1.0
    return -math.expm1(math.log1p(-daily_rate) * (window_hours / DAY_HOURS))


def daily_rate_from_history(failures: int, machines: int, observed_days: float) -> float:
    """Per-machine daily failure probability from ``failures`` over ``observed_days``.

    Failures per machine-day, capped at 1 (a machine fails at most once a day here).
    """
    if machines <= 0 or observed_days <= 0:
        raise ValueError("need machines > 0 and an observed period > 0 days")
    return min(1.0, failures / (machines * observed_days))


def binomial_pmf(n: int, p: float) -> list[float]:
    """P[X = k] for k = 0..n, computed in log space so n = 10^5 neither under- nor overflows."""
    if n < 0:
        raise ValueError("n must be >= 0")
    if p <= 0:
        return [1.0] + [0.0] * n
    if p >= 1:
        return [0.0] * n + [1.0]
    lp, lq = math.log(p), math.log1p(-p)
    lgn = math.lgamma(n + 1)
    logs = [lgn - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * lp + (n - k) * lq
            for k in range(n + 1)]
    top = max(logs)
    weights = [math.exp(v - top) for v in logs]
    total = math.fsum(weights)
    return [w / total for w in weights]


def binomial_quantile(n: int, p: float, q: float) -> int:
    """Smallest k with P[X <= k] >= q for X ~ Binomial(n, p).

    Raises:
        ValueError: q not in (0, 1].
    """
    if not 0 < q <= 1:
        raise ValueError(f"quantile {q!r} is not in (0, 1]")
    if q == 1:
        # P[X <= k] = 1 only at k = n (0 when p = 0): the slack below would stop where
        # the upper tail underflows (k = 39 for n = 1000, p = 0.01)
        return 0 if p <= 0 else n
    cdf = 0.0
    pmf = binomial_pmf(n, p)
    for k, mass in enumerate(pmf):
        cdf += mass
        # A relative slack of 1e-12 absorbs float rounding at exact boundaries.
        if cdf >= q - 1e-12:
            return k
    return n


def cdf(pmf: Sequence[float], k: int) -> float:
    """P[X <= k] from a pmf list."""
    return math.fsum(pmf[: k + 1])
