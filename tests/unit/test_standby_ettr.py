"""Standby sizing (exact binomial quantile vs brute force) and ETTR arithmetic."""

from __future__ import annotations

import itertools
from fractions import Fraction
from math import comb

import pytest

from brctl.analysis.ettr import Interval, ratio, totals, window_series
from brctl.analysis.standby import (
    binomial_pmf,
    binomial_quantile,
    daily_rate_from_history,
    window_probability,
)


def brute_quantile(n: int, p: Fraction, q: Fraction) -> int:
    cdf = Fraction(0)
    for k in range(n + 1):
        cdf += comb(n, k) * p**k * (1 - p) ** (n - k)
        if cdf >= q:
            return k
    return n


@pytest.mark.parametrize("n,p,q", list(itertools.product(
    [1, 2, 5, 16, 64, 200], ["1/1000", "1/100", "1/20", "1/3"], ["1/2", "9/10", "99/100", "999/1000"])))
def test_quantile_matches_exact_fractions(n: int, p: str, q: str) -> None:
    fp, fq = Fraction(p), Fraction(q)
    assert binomial_quantile(n, float(fp), float(fq)) == brute_quantile(n, fp, fq)


def test_large_n_neither_underflows_nor_overflows() -> None:
    pmf = binomial_pmf(100_000, 0.01)
    assert abs(sum(pmf) - 1) < 1e-9
    k = binomial_quantile(100_000, 0.01, 0.99)
    assert 1000 < k < 1100  # mean 1000, sd ~31.5: P99 ~ mean + 2.33 sd
    assert binomial_quantile(10, 0.0, 0.99) == 0
    assert binomial_quantile(10, 1.0, 0.5) == 10


def test_quantile_one_is_every_machine() -> None:
    """P[X <= k] = 1 only at k = n: quantile 1 gave 39 for n = 1000, p = 0.01."""
    assert binomial_quantile(1000, 0.01, 1.0) == 1000
    assert binomial_quantile(7, 0.3, 1.0) == brute_quantile(7, Fraction(3, 10), Fraction(1)) == 7
    assert binomial_quantile(1000, 0.0, 1.0) == 0


def test_window_scaling() -> None:
    assert window_probability(0.01, 24) == pytest.approx(0.01)
    assert window_probability(0.01, 48) == pytest.approx(1 - 0.99**2)
    assert window_probability(0.01, 6) == pytest.approx(1 - 0.99**0.25)
    assert daily_rate_from_history(3, 100, 10) == pytest.approx(0.003)
    with pytest.raises(ValueError):
        window_probability(1.5, 24)


def test_ettr_cumulative_and_window() -> None:
    ivs = [Interval(0, 60, True), Interval(60, 90, False), Interval(90, 120, True)]
    assert ratio(ivs) == pytest.approx(0.75)
    assert ratio(ivs, 60, 120) == pytest.approx(0.5)
    assert ratio([], 0, 1) is None
    assert totals(ivs) == (90, 120)
    series = window_series(ivs, window=30, points=5, now=120)
    assert [t for t, _ in series] == [0, 30, 60, 90, 120]
    assert series[-1][1] == pytest.approx(1.0) and series[3][1] == pytest.approx(0.0)
    assert series[0][1] is None  # nothing observed before t=0
