"""The arena's statistics over seeds: mean, sample standard deviation, and Welch's one-sided t-test of a variant
against the baseline (does it reach lower bits per byte than the baseline, beyond seed noise?).

Student's t distribution comes from scipy when it is installed; otherwise from the regularised incomplete beta
function, computed here by its continued fraction (Numerical Recipes, 3rd ed., 6.4), which agrees with scipy to
about 1e-12 (tests/arena/test_arena_stats.py checks it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1); the deviation is NaN for fewer than two values."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = math.fsum(values) / n
    if n < 2:
        return mean, math.nan
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))


def welch_less(a: Sequence[float], b: Sequence[float]) -> float:
    """One-sided p-value of Welch's t-test for mean(a) < mean(b), unequal variances; NaN with fewer than two values
    on either side. 1 - p is the one-sided p for mean(a) > mean(b)."""
    if len(a) < 2 or len(b) < 2:
        return math.nan
    (ma, sa), (mb, sb) = mean_std(a), mean_std(b)
    va, vb = sa * sa / len(a), sb * sb / len(b)
    if va + vb == 0.0:  # no spread at all (every seed equal): the difference is exact, or there is none
        return 0.0 if ma < mb else 1.0 if ma > mb else 0.5
    t = (ma - mb) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va * va / (len(a) - 1) + vb * vb / (len(b) - 1))  # Welch-Satterthwaite
    return t_cdf(t, df)


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` (possibly fractional) degrees of freedom."""
    try:
        from scipy.stats import t as student
    except ImportError:
        return t_cdf_series(t, df)
    return float(student.cdf(t, df))


def t_cdf_series(t: float, df: float) -> float:
    """P(T <= t) without scipy: the tail is I_x(df/2, 1/2) / 2 with x = df / (df + t^2)."""
    tail = 0.5 * incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return tail if t < 0 else 1.0 - tail


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b), for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):  # the continued fraction converges fast here; else use the symmetry
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def _beta_fraction(a: float, b: float, x: float, tiny: float = 1e-300) -> float:
    """The continued fraction of I_x(a, b), by the modified Lentz method."""
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def verdict(p: float, alpha: float) -> str:
    """How a row reads against the baseline: better or worse beyond noise at level ``alpha`` (one-sided each way),
    or not significant."""
    if math.isnan(p):
        return "n/a"
    return "better" if p < alpha else "worse" if p > 1.0 - alpha else "n.s."
