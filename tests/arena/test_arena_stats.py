"""The arena's statistics: the t distribution without scipy agrees with scipy's, and the Welch test, mean and
standard deviation are scipy's and numpy's."""

import math

import numpy as np
import pytest

from gpt.arena import stats as arena_stats
from gpt.arena.stats import mean_std, t_cdf_series, verdict, welch_less

scipy_stats = pytest.importorskip("scipy.stats", reason="scipy is the reference (pip install scipy)")


@pytest.mark.parametrize("df", [1, 1.5, 2.3, 4, 7.9, 30, 250])
def test_the_t_cdf_without_scipy_matches_scipy(df):
    for t in (-40.0, -6.0, -2.1, -1.0, -0.05, 0.0, 0.4, 1.7, 3.3, 9.0, 60.0):
        assert t_cdf_series(t, df) == pytest.approx(scipy_stats.t.cdf(t, df), abs=1e-12), (t, df)


@pytest.mark.parametrize("a, b", [([3.71, 3.72, 3.705], [3.75, 3.74, 3.76]),  # clearly better
                                  ([3.71, 3.75, 3.69], [3.72, 3.70, 3.74]),  # noise
                                  ([2.0, 2.1, 2.05, 2.2], [1.9, 1.95, 1.92]),  # worse, unequal sizes
                                  ([1.0, 1.3], [1.1, 1.15, 1.12, 1.2, 1.05])])
def test_welch_one_sided_p_is_scipys_with_and_without_scipy(a, b, monkeypatch):
    expected = scipy_stats.ttest_ind(a, b, equal_var=False, alternative="less").pvalue
    assert welch_less(a, b) == pytest.approx(expected, rel=1e-9)
    monkeypatch.setattr(arena_stats, "t_cdf", arena_stats.t_cdf_series)  # as without scipy installed
    assert welch_less(a, b) == pytest.approx(expected, rel=1e-9)
    assert mean_std(a) == pytest.approx((np.mean(a), np.std(a, ddof=1)))


def test_too_few_seeds_give_no_p_and_no_spread_an_exact_answer():
    assert math.isnan(welch_less([1.0], [2.0, 2.1])) and math.isnan(mean_std([3.0])[1])
    assert welch_less([1.0, 1.0], [2.0, 2.0]) == 0.0 and welch_less([2.0, 2.0], [1.0, 1.0]) == 1.0
    assert [verdict(p, 0.05) for p in (0.01, 0.5, 0.99, math.nan)] == ["better", "n.s.", "worse", "n/a"]
