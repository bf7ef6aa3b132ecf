"""attnid.reports.statistics (docs/design.md §11): the paired comparison, the verdict rule and the rank
correlation, checked against their definitions: brute-force enumeration of the permutation nulls, Holm's
procedure by hand and step by step, the t-interval against scipy's t-test, every label of the rule reached,
the rule's minimum n, the power row against a simulation, and the smallest p a few seeds can give."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from scipy import stats as scipy_stats

from attnid.reports import statistics

# Loss differences of a few seeds: moderate magnitudes, as val-loss differences are.
differences = st.lists(st.floats(-1.0, 1.0, allow_nan=False, allow_subnormal=False), min_size=2, max_size=12)
# Integer-valued differences: every sum of flipped signs is exact, so ties in the null are exact ties.
integer_differences = st.lists(st.integers(-6, 6), min_size=2, max_size=12)
FAST = settings(max_examples=40, deadline=None)


# ---------------------------------------------------------------------------- paired comparison


def brute_force_sign_flip_p(values) -> float:
    """P(|mean of sign-flipped values| >= |observed mean|) over all 2^n sign vectors, counted directly."""
    values = np.asarray(values, dtype=float)
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=len(values))))  # (2^n, n)
    observed = abs(values.sum())
    return float(np.mean(np.abs(signs @ values) >= observed * (1 - 1e-12)))


@FAST
@given(integer_differences)
def test_sign_flip_p_is_the_enumerated_two_sided_p(values):
    p = statistics.sign_flip_p_value(values)
    assert p == pytest.approx(brute_force_sign_flip_p(values), abs=1e-12)
    assert 0 < p <= 1
    assert p >= statistics.smallest_sign_flip_p_value(len(values)) - 1e-12


def test_sign_flip_p_is_exact_at_the_paper_s_sixteen_seeds():
    """16 seeds (paper.yaml): every one of the 2^16 sign vectors, not a draw; the same number twice."""
    values = np.random.default_rng(0).normal(0.005, 0.012, size=16)
    p = statistics.sign_flip_p_value(values)
    assert p == pytest.approx(brute_force_sign_flip_p(values), abs=1e-12)
    assert (p * 2**16) == pytest.approx(round(p * 2**16), abs=1e-6)  # a count of sign vectors over 2^16
    assert statistics.EXACT_SIGN_FLIP_SEEDS >= 16


@pytest.mark.parametrize("n_seeds", [2, 3, 5, 8, 10])
def test_one_sign_everywhere_gives_the_smallest_p_there_is(n_seeds):
    rng = np.random.default_rng(n_seeds)
    values = rng.uniform(0.01, 0.2, size=n_seeds)
    smallest = statistics.smallest_sign_flip_p_value(n_seeds)
    assert smallest == 2 / 2**n_seeds
    assert statistics.sign_flip_p_value(values) == pytest.approx(smallest)
    assert statistics.sign_flip_p_value(-values) == pytest.approx(smallest)
    assert statistics.smallest_sign_flip_p_value(5) == 0.0625  # 5 seeds never reach 0.05
    assert statistics.smallest_sign_flip_p_value(8) == pytest.approx(0.0078125)


def test_holm_by_hand():
    """m = 4: sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 is 0.02, 0.03, 0.06, 0.04; the running maximum
    makes the last 0.06; back in the given order."""
    adjusted = statistics.holm_adjusted([0.01, 0.04, 0.03, 0.005])
    assert adjusted.tolist() == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert statistics.holm_adjusted([0.2]).tolist() == [0.2]  # a family of one is not corrected
    assert statistics.holm_adjusted([0.5, 0.6, 0.7]).tolist() == [1.0, 1.0, 1.0]  # capped at 1
    assert statistics.holm_adjusted([0.001, math.nan]).tolist() == [0.002, 1.0]  # no p: enters as 1


def holm_step_down_rejections(p_values, alpha) -> set[int]:
    """Holm's procedure as stated: compare the i-th smallest p with alpha / (m - i + 1), reject until the
    first that is not below it."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    rejected = set()
    for step, index in enumerate(order):
        if not p_values[index] < alpha / (len(p_values) - step):
            break
        rejected.add(index)
    return rejected


@FAST
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=8), st.sampled_from([0.01, 0.05, 0.1]))
def test_holm_adjusted_p_below_alpha_is_the_step_down_procedure(p_values, alpha):
    adjusted = statistics.holm_adjusted(p_values)
    assert {i for i, p in enumerate(adjusted) if p < alpha} == holm_step_down_rejections(p_values, alpha)
    assert all(a >= p for a, p in zip(adjusted, p_values, strict=True))


def test_the_rule_s_minimum_n_is_where_the_exact_test_can_reach_alpha_after_holm():
    # m * 2 / 2^n < 0.05: 2^n > 40 m
    assert [statistics.minimum_seeds(0.05, m) for m in range(1, 9)] == [6, 7, 7, 8, 8, 8, 9, 9]
    for alpha in (0.01, 0.05, 0.1):
        for m in range(1, 12):
            n = statistics.minimum_seeds(alpha, m)
            assert m * statistics.smallest_sign_flip_p_value(n) < alpha
            assert m * statistics.smallest_sign_flip_p_value(n - 1) >= alpha
    # five comparisons at 5 seeds: Holm can reject nothing whatever the data (the finding)
    assert statistics.minimum_seeds(0.05, 5) == 8 > 5
    with pytest.raises(ValueError):
        statistics.minimum_seeds(0.05, 0)


@FAST
@given(differences.filter(lambda v: np.ptp(v) > 1e-6), st.sampled_from([0.8, 0.9, 0.95]))
def test_the_t_interval_is_scipy_s_t_test_interval(values, confidence):
    low, high = statistics.t_interval(values, confidence)
    expected = scipy_stats.ttest_1samp(values, 0.0).confidence_interval(confidence)
    assert (low, high) == pytest.approx((expected.low, expected.high), abs=1e-9)


@given(st.floats(-1.0, 1.0, allow_nan=False, allow_subnormal=False), st.integers(2, 10))
@FAST
def test_a_constant_difference_has_its_intervals_at_the_constant(constant, n_seeds):
    estimate = statistics.estimate_paired([constant] * n_seeds)
    for value in (
        estimate.delta_mean,
        estimate.ci_low,
        estimate.ci_high,
        estimate.tost_low,
        estimate.tost_high,
    ):
        assert value == pytest.approx(constant, abs=1e-15)
    assert estimate.sd == pytest.approx(0.0, abs=1e-15) and estimate.n_seeds == n_seeds


@FAST
@given(differences)
def test_negating_the_differences_mirrors_the_estimate(values):
    forward = statistics.estimate_paired(values)
    backward = statistics.estimate_paired(-np.asarray(values))
    assert backward.delta_mean == pytest.approx(-forward.delta_mean, abs=1e-12)
    assert backward.ci_low == pytest.approx(-forward.ci_high, abs=1e-9)
    assert backward.tost_high == pytest.approx(-forward.tost_low, abs=1e-9)
    assert backward.p_value == pytest.approx(forward.p_value, abs=1e-12)
    # the 1 - 2 alpha interval lies inside the 1 - alpha one
    assert forward.ci_low <= forward.tost_low + 1e-12 and forward.tost_high <= forward.ci_high + 1e-12


def test_the_bootstrap_interval_only_from_twenty_seeds():
    rng = np.random.default_rng(2)
    few = statistics.estimate_paired(rng.normal(size=statistics.BOOTSTRAP_MIN_SEEDS - 1))
    assert math.isnan(few.boot_ci_low) and math.isnan(few.boot_ci_high)
    values = rng.normal(0.1, 1.0, size=statistics.BOOTSTRAP_MIN_SEEDS)
    many = statistics.estimate_paired(values)
    expected = scipy_stats.bootstrap(  # of the differences sorted, as every number of the estimate
        (np.sort(values),), np.mean, n_resamples=9_999, method="percentile", random_state=0
    ).confidence_interval
    assert (many.boot_ci_low, many.boot_ci_high) == pytest.approx((expected.low, expected.high))


@FAST
@given(differences, st.floats(-1.0, 1.0, allow_nan=False))
def test_a_shift_moves_the_bootstrap_ci_by_the_shift(values, shift):
    low, high = statistics.mean_confidence_interval(values)
    shifted_low, shifted_high = statistics.mean_confidence_interval(np.asarray(values) + shift)
    assert shifted_low == pytest.approx(low + shift, abs=1e-9)
    assert shifted_high == pytest.approx(high + shift, abs=1e-9)


def _estimate(values) -> statistics.PairedEstimate:
    return statistics.estimate_paired(np.asarray(values, dtype=float))


def test_every_label_of_the_rule_is_reached():
    """Five comparisons at alpha 0.05 with delta 0.01: the rule's minimum is 8 seeds."""
    rule = statistics.VerdictRule(alpha=0.05, equivalence_margin=0.01, family_size=5)
    assert rule.minimum_seeds == 8
    lower = _estimate(-0.02 + 0.001 * np.arange(8))  # one sign on every seed
    higher = _estimate(0.03 + 0.002 * np.arange(8))
    tiny = _estimate(0.001 * np.array([1, -1, 2, -2, 1, -1, 0.5, -0.5]))  # within +-delta, both signs
    wide = _estimate(np.array([0.05, -0.04, 0.03, -0.06, 0.02, -0.01, 0.04, -0.03]))  # neither
    assert lower.p_value == higher.p_value == pytest.approx(2 / 2**8)
    assert rule.label(lower, 5 * lower.p_value) == statistics.BETTER
    assert rule.label(higher, 5 * higher.p_value) == statistics.WORSE
    assert rule.label(tiny, 1.0) == statistics.EQUIVALENT
    assert rule.label(wide, 1.0) == statistics.INCONCLUSIVE
    # a tiny but consistent effect is both: different from 0 and inside the margin
    small_lower = _estimate(-0.001 - 0.0001 * np.arange(8))
    assert rule.label(small_lower, 5 * small_lower.p_value) == statistics.BETTER_WITHIN_MARGIN
    assert rule.label(_estimate(-small_lower.delta_mean + 0.0001 * np.arange(8)), 0.01) == (
        statistics.WORSE_WITHIN_MARGIN
    )
    # Holm's adjusted p at alpha is not below it: no rejection
    assert rule.label(lower, 0.05) not in statistics.DIFFERENT_LABELS
    # no margin declared: nothing is equivalent, and a difference is never within a margin
    assert statistics.VerdictRule(family_size=5).label(tiny, 1.0) == statistics.INCONCLUSIVE
    assert statistics.VerdictRule(family_size=5).label(small_lower, 0.01) == statistics.BETTER


@pytest.mark.parametrize(
    "different, equivalent, delta, expected",
    [
        (True, False, -1.0, "better"),
        (True, False, 1.0, "worse"),
        (True, True, -1.0, "better, within the margin"),
        (True, True, 1.0, "worse, within the margin"),
        (False, True, -1.0, "equivalent"),
        (False, True, 1.0, "equivalent"),
        (False, False, 1.0, "inconclusive"),
        (False, False, -1.0, "inconclusive"),
    ],
)
def test_the_outcome_is_the_two_tests_combined(different, equivalent, delta, expected):
    """docs/design.md §11.3's table of the six outcomes, written out."""
    assert statistics.outcome(different, equivalent, delta) == expected
    assert expected in statistics.LABELS


# Ten seeds, each a unit of noise in [-1, 1], and a margin: the samples of each outcome are built from them.
noise = st.lists(st.floats(-1.0, 1.0, allow_nan=False, allow_subnormal=False), min_size=10, max_size=10)
margins = st.floats(1e-3, 1.0)


def _constructed(outcome: str, units: list[float], margin: float) -> np.ndarray:
    """Ten differences whose outcome at alpha 0.05 (a family of one) is ``outcome`` by construction:
    one sign on every seed (p = 2/2^10) far outside or well inside the margin, or five pairs ``±u`` (mean
    0, p 1) small against the margin or large."""
    u = np.asarray(units)
    one_sign = {
        statistics.BETTER: -3 * margin + 0.5 * margin * u,
        statistics.WORSE: 3 * margin + 0.5 * margin * u,
        statistics.BETTER_WITHIN_MARGIN: -0.5 * margin + 0.1 * margin * u,
        statistics.WORSE_WITHIN_MARGIN: 0.5 * margin + 0.1 * margin * u,
    }
    if outcome in one_sign:
        return one_sign[outcome]
    size = (
        0.5 * margin * np.abs(u[:5]) if outcome == statistics.EQUIVALENT else margin * (2 + 3 * np.abs(u[:5]))
    )
    return np.concatenate([size, -size])


@FAST
@pytest.mark.parametrize("outcome", statistics.LABELS)
@given(units=noise, margin=margins)
def test_each_outcome_is_reached_on_constructed_samples(outcome, units, margin):
    sample = _constructed(outcome, units, margin)
    estimate = _estimate(sample)
    rule = statistics.VerdictRule(alpha=0.05, equivalence_margin=margin, family_size=1)
    assert rule.label(estimate, estimate.p_value) == outcome


@FAST
@given(
    values=st.lists(st.floats(-0.05, 0.05, allow_nan=False, allow_subnormal=False), min_size=6, max_size=12),
    order=st.randoms(use_true_random=False),
    family_size=st.integers(1, 3),
)
def test_the_label_never_depends_on_the_order_of_the_seeds(values, order, family_size):
    """Permuting the paired differences changes no number of the estimate and so no label."""
    shuffled = list(values)
    order.shuffle(shuffled)
    rule = statistics.VerdictRule(alpha=0.05, equivalence_margin=0.01, family_size=family_size)
    forward, permuted = _estimate(values), _estimate(shuffled)
    fields = ("delta_mean", "sd", "ci_low", "ci_high", "tost_low", "tost_high", "p_value")
    assert [getattr(permuted, f) for f in fields] == [getattr(forward, f) for f in fields]
    p = min(1.0, family_size * forward.p_value)
    assert rule.label(permuted, min(1.0, family_size * permuted.p_value)) == rule.label(forward, p)


@FAST
@given(values=differences, margin=margins)
def test_the_equivalence_test_is_the_interval_inside_the_margin(values, margin):
    """TOST at ±δ rejects at alpha exactly when the 1 - 2 alpha t-interval lies inside (-δ, δ)."""
    estimate = _estimate(values)
    rule = statistics.VerdictRule(alpha=0.05, equivalence_margin=margin)
    inside = -margin < estimate.tost_low and estimate.tost_high < margin
    p = rule.equivalence_p_value(estimate)
    assume(min(abs(estimate.tost_low + margin), abs(estimate.tost_high - margin)) > 1e-9)  # off the edge
    assert (p < 0.05) == inside, (p, estimate)
    assert math.isnan(statistics.VerdictRule().equivalence_p_value(estimate))


def test_below_the_minimum_n_there_is_no_label():
    rule = statistics.VerdictRule(alpha=0.05, equivalence_margin=0.01, family_size=5)
    two = _estimate([-0.5, -0.6])  # smoke: 2 seeds, all one sign, far from 0
    seven = _estimate(-0.02 - 0.001 * np.arange(7))
    assert rule.label(two, two.p_value) == statistics.N_TOO_SMALL
    assert rule.label(seven, 0.0) == statistics.N_TOO_SMALL  # even with a (wrong) p of 0 passed in
    assert rule.label(None, math.nan) == statistics.N_TOO_SMALL
    assert math.isinf(rule.detectable_effect(0.01, 7)) and math.isfinite(rule.detectable_effect(0.01, 8))


def test_the_detectable_effect_has_80_percent_power_in_a_simulation():
    """At the returned effect the exact sign-flip test at alpha / m rejects in 80 % of fresh simulated normal
    samples (20,000, drawn apart from the ones the effect was solved on: Monte Carlo sd 0.003, plus the
    solve's own 0.006)."""
    rule = statistics.VerdictRule(alpha=0.05, family_size=5)
    sd, n = 0.012, 8
    effect = rule.detectable_effect(sd, n)
    samples = np.random.default_rng(1).normal(effect, sd, size=(20_000, n))
    p = statistics.exact_sign_flip_p_values(samples)
    assert np.mean(p < rule.detection_level) == pytest.approx(0.8, abs=0.02)
    assert rule.detection_level == pytest.approx(0.01)
    # scale: twice the sd, twice the effect; more seeds, a smaller one
    assert rule.detectable_effect(2 * sd, n) == pytest.approx(2 * effect)
    assert rule.detectable_effect(sd, 16) < effect
    assert rule.detectable_effect(0.0, 8) == 0.0
    assert statistics.detectable_effect(0.0, 8, 0.01) == 0.0


def test_the_exact_test_is_less_powerful_than_the_t_test_at_eight_seeds():
    """At 8 seeds and Holm over 5 the exact test rejects only when all 8 signs agree (the next p, 4/256, is
    above 0.05/5), so an effect the t-test detects with 80 % power (1.60 sd) it detects about 63 % of the
    time, and 80 % needs about 1.92 sd."""
    level = 0.05 / 5
    t_effect = statistics.detectable_effect(1.0, 8, level)
    assert t_effect == pytest.approx(1.60, abs=0.01)
    assert statistics.sign_flip_power(t_effect, 8, level) == pytest.approx(0.63, abs=0.03)
    assert statistics.sign_flip_detectable_ratio(8, level) == pytest.approx(1.92, abs=0.04)
    # no effect: it rejects about as often as its level allows (all 8 of one sign: 2/256)
    assert statistics.sign_flip_power(0.0, 8, level) == pytest.approx(2 / 256, abs=0.005)
    # below the rule's minimum it cannot reject at all
    assert statistics.sign_flip_power(10.0, 7, level) == 0.0
    assert math.isinf(statistics.sign_flip_detectable_ratio(7, level))


@settings(max_examples=15, deadline=None)
@given(st.lists(st.floats(-1.0, 1.0, allow_nan=False).map(lambda x: round(x, 3)), min_size=2, max_size=16))
def test_the_vectorised_exact_p_is_scipy_s(values):
    """The p-values the power simulation counts are the test's own (scipy's permutation test over all sign
    vectors), ties of rounded values included."""
    assert statistics.exact_sign_flip_p_values([values])[0] == pytest.approx(
        statistics.sign_flip_p_value(values), abs=1e-12
    )


def test_power_at_the_margin_grows_with_the_margin_over_the_sd():
    rule = statistics.VerdictRule(alpha=0.05, equivalence_margin=0.01, family_size=1)
    powers = [rule.power_at_margin(sd, 16) for sd in (0.04, 0.02, 0.01, 0.005)]
    assert powers == sorted(powers) and powers[0] < 0.3 and powers[-1] > 0.99
    assert rule.power_at_margin(0.01 / statistics.sign_flip_detectable_ratio(16, 0.05), 16) == pytest.approx(
        0.8, abs=0.01
    )
    assert math.isnan(statistics.VerdictRule(family_size=1).power_at_margin(0.01, 16))  # no margin


def test_the_power_of_a_paper_sized_family_is_a_number():
    """16 seeds and a family of 12 (paper.yaml's size): the t-test's lower tail lies where scipy's
    noncentral-t cdf gives NaN; the power is still the two tails' sum, and the detectable effect is found."""
    level = 0.05 / 12
    power = statistics.t_test_power(2.0, 16, level)
    critical = scipy_stats.t.ppf(1 - level / 2, 15)
    upper = scipy_stats.nct.sf(critical, 15, 8.0)  # the mean 2 sd above 0: all but a sliver is the upper tail
    assert math.isfinite(power) and upper <= power < upper + 1e-12
    # a mean 0.5 sd below 0 is as detectable as one 0.5 sd above
    assert statistics.t_test_power(-0.5, 16, level) == pytest.approx(statistics.t_test_power(0.5, 16, level))
    effect = statistics.detectable_effect(1.0, 16, level)
    assert statistics.t_test_power(effect, 16, level) == pytest.approx(0.8, abs=1e-9)


def test_estimates_refuse_bad_input():
    with pytest.raises(ValueError, match="at least 2"):
        statistics.estimate_paired([0.1])
    with pytest.raises(ValueError, match="finite"):
        statistics.estimate_paired([0.1, math.nan, 0.2])
    for bad in ({"alpha": 0.0}, {"equivalence_margin": -0.1}, {"family_size": 0}):
        with pytest.raises(ValueError):
            statistics.VerdictRule(**bad)


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
