"""attnid.reports.statistics (docs/design.md §11): the paired comparison and the rank correlation,
checked against their definitions: brute-force enumeration of the permutation nulls, the bootstrap's
symmetries, the verdict's consistency with the CI, and the smallest p a few seeds can give."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scipy import stats as scipy_stats

from attnid.reports import statistics

# Loss differences of a few seeds: moderate magnitudes, as val-loss differences are.
differences = st.lists(st.floats(-1.0, 1.0, allow_nan=False, allow_subnormal=False), min_size=2, max_size=12)
# Integer-valued differences: every sum of flipped signs is exact, so ties in the null are exact ties.
integer_differences = st.lists(st.integers(-6, 6), min_size=2, max_size=10)
FAST = settings(max_examples=40, deadline=None)


# ---------------------------------------------------------------------------- paired comparison


def brute_force_sign_flip_p(values) -> float:
    """P(|mean of sign-flipped values| >= |observed mean|) over all 2^n sign vectors, counted directly."""
    values = np.asarray(values, dtype=float)
    observed = abs(values.sum())
    count = sum(
        abs(np.dot(signs, values)) >= observed for signs in itertools.product((1.0, -1.0), repeat=len(values))
    )
    return count / 2 ** len(values)


@FAST
@given(integer_differences)
def test_sign_flip_p_is_the_enumerated_two_sided_p(values):
    p = statistics.sign_flip_p_value(values)
    assert p == pytest.approx(brute_force_sign_flip_p(values), abs=1e-12)
    assert 0 < p <= 1
    assert p >= statistics.smallest_sign_flip_p_value(len(values)) - 1e-12


@pytest.mark.parametrize("n_seeds", [2, 3, 5, 10])
def test_one_sign_everywhere_gives_the_smallest_p_there_is(n_seeds):
    rng = np.random.default_rng(n_seeds)
    values = rng.uniform(0.01, 0.2, size=n_seeds)
    smallest = statistics.smallest_sign_flip_p_value(n_seeds)
    assert smallest == 2 / 2**n_seeds
    assert statistics.sign_flip_p_value(values) == pytest.approx(smallest)
    assert statistics.sign_flip_p_value(-values) == pytest.approx(smallest)
    assert statistics.smallest_sign_flip_p_value(5) == 0.0625  # the default config's 5 seeds never reach 0.05


def test_sign_flip_p_beyond_exact_enumeration_is_a_fixed_draw():
    values = np.random.default_rng(0).normal(0.05, 0.1, size=16)  # 2^16 > the resamples: random sign vectors
    first = statistics.sign_flip_p_value(values)
    assert first == statistics.sign_flip_p_value(values)  # the same table twice
    assert first == pytest.approx(brute_force_sign_flip_p(values), abs=0.02)  # Monte Carlo error ~0.005


@FAST
@given(differences, st.floats(-1.0, 1.0, allow_nan=False))
def test_a_shift_moves_the_ci_by_the_shift(values, shift):
    low, high = statistics.mean_confidence_interval(values)
    shifted_low, shifted_high = statistics.mean_confidence_interval(np.asarray(values) + shift)
    assert shifted_low == pytest.approx(low + shift, abs=1e-9)
    assert shifted_high == pytest.approx(high + shift, abs=1e-9)


@FAST
@given(st.floats(-1.0, 1.0, allow_nan=False, allow_subnormal=False), st.integers(2, 10))
@example(constant=0.74532216649841, n_seeds=7)  # percentiles one ulp apart, high below low
def test_a_constant_difference_has_its_ci_at_the_constant(constant, n_seeds):
    result = statistics.compare_paired([constant] * n_seeds)
    assert result.delta_mean == pytest.approx(constant, abs=1e-15)
    assert result.ci_low == pytest.approx(constant, abs=1e-15)
    assert result.ci_high == pytest.approx(constant, abs=1e-15)
    assert result.n_seeds == n_seeds
    expected = statistics.verdict(result.ci_low, result.ci_high)
    assert result.verdict == expected
    if abs(constant) > 1e-12:
        assert result.verdict == (statistics.BETTER if constant < 0 else statistics.WORSE)


@FAST
@given(differences)
def test_negating_the_differences_mirrors_everything(values):
    forward = statistics.compare_paired(values)
    backward = statistics.compare_paired(-np.asarray(values))
    assert backward.delta_mean == pytest.approx(-forward.delta_mean, abs=1e-12)
    assert backward.ci_low == pytest.approx(-forward.ci_high, abs=1e-9)
    assert backward.ci_high == pytest.approx(-forward.ci_low, abs=1e-9)
    assert backward.p_value == pytest.approx(forward.p_value, abs=1e-12)
    mirror = {
        statistics.BETTER: statistics.WORSE,
        statistics.WORSE: statistics.BETTER,
        statistics.NO_DIFFERENCE: statistics.NO_DIFFERENCE,
    }
    if min(abs(forward.ci_low), abs(forward.ci_high)) > 1e-9:  # not on the edge of round-off
        assert backward.verdict == mirror[forward.verdict]


@FAST
@given(differences)
def test_the_verdict_is_read_off_the_ci(values):
    result = statistics.compare_paired(values)
    assert result.verdict in statistics.VERDICTS
    assert min(values) - 1e-12 <= result.ci_low <= result.ci_high <= max(values) + 1e-12  # means of resamples
    contains_zero = result.ci_low <= 0 <= result.ci_high
    assert (result.verdict == statistics.NO_DIFFERENCE) == contains_zero
    assert (result.verdict == statistics.BETTER) == (result.ci_high < 0)
    assert (result.verdict == statistics.WORSE) == (result.ci_low > 0)
    assert 0 < result.p_value <= 1
    assert result.delta_mean == pytest.approx(np.mean(values))


def test_the_ci_is_scipys_percentile_bootstrap_of_the_mean():
    values = np.array([-0.031, -0.012, -0.02, 0.004, -0.027])
    expected = scipy_stats.bootstrap(
        (values,), np.mean, n_resamples=9_999, method="percentile", random_state=0
    ).confidence_interval
    assert statistics.mean_confidence_interval(values) == pytest.approx((expected.low, expected.high))
    result = statistics.compare_paired(values)
    assert result.verdict == statistics.BETTER and result.ci_high < 0
    assert result.p_value == pytest.approx(4 / 32)  # one sign vector beyond it, each way: 2 x 2 of 32


def test_verdict_edges_and_bad_input():
    assert statistics.verdict(-0.2, -0.1) == statistics.BETTER
    assert statistics.verdict(0.1, 0.2) == statistics.WORSE
    assert statistics.verdict(-0.1, 0.0) == statistics.NO_DIFFERENCE  # a CI touching 0 contains it
    assert statistics.verdict(0.0, 0.0) == statistics.NO_DIFFERENCE
    for low, high in ((math.nan, 0.1), (0.2, 0.1)):
        with pytest.raises(ValueError):
            statistics.verdict(low, high)
    with pytest.raises(ValueError, match="at least 2"):
        statistics.compare_paired([0.1])
    with pytest.raises(ValueError, match="finite"):
        statistics.compare_paired([0.1, math.nan, 0.2])


def test_differences_are_matched_by_seed():
    seeds, delta = statistics.paired_differences({3: 1.5, 1: 2.0}, {1: 2.5, 3: 1.0, 7: 9.0})
    assert seeds == [1, 3] and delta.tolist() == [-0.5, 0.5]  # seed 7 of the baseline has no arm run
    with pytest.raises(ValueError, match="seed.s. 2, 5 have no baseline"):
        statistics.paired_differences({1: 1.0, 2: 1.0, 5: 1.0}, {1: 1.0})


# ---------------------------------------------------------------------------- rank correlation


def brute_force_rank_correlation_p(x, y) -> float:
    """Twice the smaller share of the n! orderings of y whose r_s is at most / at least the observed one."""
    observed = scipy_stats.spearmanr(x, y).statistic
    null = np.array([scipy_stats.spearmanr(x, ordering).statistic for ordering in itertools.permutations(y)])
    tolerance = 1e-12
    at_most, at_least = np.mean(null <= observed + tolerance), np.mean(null >= observed - tolerance)
    return min(1.0, 2 * min(at_most, at_least))


small_points = st.integers(3, 6).flatmap(
    lambda n: st.tuples(
        st.lists(st.integers(0, 4), min_size=n, max_size=n),
        st.lists(st.integers(0, 9), min_size=n, max_size=n),
    )
)


@FAST
@given(small_points)
@example(points=([0, 1, 0, 0, 0, 1], [0, 2, 0, 1, 6, 0]))  # r_s = 0 with ties: float noise around 0
def test_rank_correlation_p_is_the_enumerated_permutation_p(points):
    x, y = (np.asarray(side, dtype=float) for side in points)
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        assert math.isnan(statistics.rank_correlation(x, y))
        assert math.isnan(statistics.rank_correlation_p_value(x, y))
        return
    assert statistics.rank_correlation(x, y) == pytest.approx(scipy_stats.spearmanr(x, y).statistic)
    p = statistics.rank_correlation_p_value(x, y)
    assert 0 < p <= 1
    assert p == pytest.approx(brute_force_rank_correlation_p(x, y), abs=1e-12)
    # ranks only: a monotone map of x changes nothing; so does reversing both sides
    assert statistics.rank_correlation_p_value(np.exp(x), y) == pytest.approx(p, abs=1e-12)
    assert statistics.rank_correlation_p_value(-x, -y) == pytest.approx(p, abs=1e-12)


def test_a_perfect_ordering_of_five_points_has_p_2_over_120():
    x, y = [0.5, 0.75, 0.875, 0.9375, 0.96875], [2.473, 2.470, 2.466, 2.465, 2.4649]
    assert statistics.rank_correlation(x, y) == pytest.approx(-1.0)
    assert statistics.rank_correlation_p_value(x, y) == pytest.approx(2 / 120)


def test_rank_correlation_needs_three_finite_points_and_no_constant_side():
    assert math.isnan(statistics.rank_correlation([1, 2], [3, 4]))
    assert math.isnan(statistics.rank_correlation([1, 1, 1], [1, 2, 3]))
    # a NaN pair is left out
    assert statistics.rank_correlation([1, 2, 3, np.nan], [1, 3, 2, 5]) == pytest.approx(0.5)
    assert math.isnan(statistics.rank_correlation_p_value([1, 2, np.nan], [3, 4, 5]))


def test_seed_bootstrap_ci_of_two_seeds_spans_the_three_seed_draws():
    """With seeds a, b a resample's point means are those of {a, a}, {a, b} or {b, b}: with 9,999 draws
    the percentile CI runs from the smallest of the three correlations to the largest."""
    x = np.array([0.5, 0.75, 0.875, 0.9375])
    per_seed = np.array([[2.40, 2.52], [2.47, 2.45], [2.44, 2.48], [2.50, 2.41]])
    draws = [
        statistics.rank_correlation(x, per_seed[:, list(pair)].mean(axis=1))
        for pair in ((0, 0), (0, 1), (1, 1))
    ]
    low, high = statistics.rank_correlation_ci_over_seeds(x, per_seed)
    assert low == pytest.approx(min(draws)) and high == pytest.approx(max(draws))
    assert min(draws) < max(draws)


@FAST
@given(st.integers(3, 7), st.integers(2, 5), st.integers(0, 10_000))
def test_seed_bootstrap_ci_is_a_correlation_interval(n_points, n_seeds, seed):
    rng = np.random.default_rng(seed)
    x = np.sort(rng.uniform(0.5, 1.0, size=n_points))
    per_seed = rng.normal(2.4, 0.05, size=(n_points, n_seeds))
    low, high = statistics.rank_correlation_ci_over_seeds(x, per_seed)
    assert -1 - 1e-12 <= low <= high <= 1 + 1e-12
    # the same value for every seed: every resample is the data, the CI is the point
    same = np.repeat(per_seed[:, :1], n_seeds, axis=1)
    point = statistics.rank_correlation(x, same[:, 0])
    assert statistics.rank_correlation_ci_over_seeds(x, same) == pytest.approx((point, point))


def test_seed_bootstrap_refuses_ragged_or_missing_seeds():
    x = [0.5, 0.75, 0.875]
    assert all(math.isnan(v) for v in statistics.rank_correlation_ci_over_seeds(x, [[2.0], [2.1], [2.2]]))
    with pytest.raises(ValueError, match="finite"):
        statistics.rank_correlation_ci_over_seeds(x, [[2.0, np.nan], [2.1, 2.0], [2.2, 2.3]])
    with pytest.raises(ValueError, match="points"):
        statistics.rank_correlation_ci_over_seeds(x, [[2.0, 2.1], [2.1, 2.0]])
