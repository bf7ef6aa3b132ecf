"""Statistics that can say no: paired seed comparisons and rank correlations, on ``scipy.stats``.

Every number here is defined in docs/design.md §11; this module only applies scipy to the project's
samples, with fixed settings so that the same runs always give the same table.

* A **paired comparison** of an arm with its baseline (the interventions study): the per-seed
  differences ``arm - baseline`` of a loss, matched by seed (:func:`paired_differences`), summarised by
  :func:`estimate_paired`: their mean with a Student-t CI (:func:`t_interval`), the exact two-sided
  sign-flip p-value over all ``2**n`` sign vectors (:func:`sign_flip_p_value`), the paired sd and, from
  ``n >= 20`` seeds on, a percentile bootstrap CI beside the t one. **Lower loss is better**: a difference
  below zero means the arm reached a lower loss than the baseline.
* The **verdict rule** (§11.3), :class:`VerdictRule`: two tests on every judged comparison, and the
  label their combination (:func:`outcome`). The **difference test**: the exact sign-flip p, Holm's
  step-down correction over a declared family of comparisons (:func:`holm_adjusted`; the primary comparison
  alone), *different* when it is below ``alpha``. The **equivalence test** (TOST at ``±δ``,
  :meth:`VerdictRule.equivalence_p_value`): the two one-sided t-tests of a difference of ``δ`` or more,
  *equivalent* when both reject at ``alpha`` (the ``1 - 2 alpha`` t-interval lies inside ``±δ``). The six
  labels: ``better``/``worse`` (different, not equivalent), ``better, within the margin``/``worse, within
  the margin`` (both: a real effect smaller than ``δ``), ``equivalent`` (not different, equivalent),
  ``inconclusive`` (neither); and no label at all below the smallest ``n`` at which the exact test can
  reach ``alpha`` after Holm over the family (:func:`minimum_seeds`). Beside it, the smallest effect the
  comparison could detect with 80 % power at its ``n`` (:func:`detectable_effect`).
* A **rank correlation** across the points of a study (Spearman's ``r_s``, :func:`rank_correlation`) with a
  permutation p-value over the point means (:func:`rank_correlation_p_value`) and a bootstrap CI over seeds
  (:func:`rank_correlation_ci_over_seeds`).

With ``n`` paired seeds the smallest two-sided sign-flip p-value there is is ``2 / 2**n``
(:func:`smallest_sign_flip_p_value`: 0.0625 at 5 seeds, 0.0078 at 8): the rule's minimum ``n`` follows
from it and from the family's size, never from a hand-written constant.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Final, cast

import numpy as np
from numpy.typing import ArrayLike

# scipy is imported at first use (_scipy_stats, and brentq's one import): the workflow's parse loads this
# module (the figure registry's modules import it), and so does every cluster job's parse, which needs none
# of scipy

CONFIDENCE_LEVEL = 0.95
# Percentile, not scipy's default BCa: BCa's acceleration is a jackknife over the sample, which at 3-10
# seeds is itself noise, and it is undefined for a sample whose values are all equal (§11.1).
BOOTSTRAP_METHOD: Final = "percentile"
BOOTSTRAP_RESAMPLES = 9_999
# The percentile bootstrap of a mean covers about its nominal level only from about 20 values on (§11.3);
# below, a paired comparison has the t-interval alone.
BOOTSTRAP_MIN_SEEDS = 20
# The sign-flip test enumerates all 2**n sign vectors up to this many seeds (2**20 means, in batches of
# SIGN_FLIP_BATCH); beyond, it draws SIGN_FLIP_RESAMPLES of them (its smallest p is far below any alpha).
EXACT_SIGN_FLIP_SEEDS = 20
SIGN_FLIP_BATCH = 2**16
SIGN_FLIP_RESAMPLES = 99_999
# The same for the n! orderings of a correlation's point means: exact up to n = 8 points.
PERMUTATION_RESAMPLES = 99_999
# The most points whose null distribution scipy enumerates in full at these settings.
EXACT_PERMUTATION_POINTS = max(n for n in range(1, 20) if math.factorial(n) <= PERMUTATION_RESAMPLES)
# Fixed, so that a table computed twice from the same runs is the same table.
RESAMPLING_SEED = 0
# A mean's interval needs two values; a rank correlation needs three points to be worth a number.
MIN_PAIRED_SEEDS = 2
MIN_CORRELATION_POINTS = 3

# The verdict rule's defaults (§11.3); a pipeline config declares its own under interventions: verdict:.
ALPHA = 0.05
POWER = 0.80

# The labels of the verdict rule (§11.3, :func:`outcome`), and the rows that get none.
BETTER, WORSE, EQUIVALENT, INCONCLUSIVE = "better", "worse", "equivalent", "inconclusive"
WITHIN_MARGIN = ", within the margin"
BETTER_WITHIN_MARGIN, WORSE_WITHIN_MARGIN = BETTER + WITHIN_MARGIN, WORSE + WITHIN_MARGIN
N_TOO_SMALL = "n too small"
NOT_IN_FAMILY = "not in family"
LABELS = (BETTER, WORSE, BETTER_WITHIN_MARGIN, WORSE_WITHIN_MARGIN, EQUIVALENT, INCONCLUSIVE)
# The labels of a difference the test shows (the difference test rejects), with or without equivalence.
DIFFERENT_LABELS = (BETTER, WORSE, BETTER_WITHIN_MARGIN, WORSE_WITHIN_MARGIN)
NO_LABEL = (N_TOO_SMALL, NOT_IN_FAMILY)


# ---------------------------------------------------------------------------- paired seeds


def _scipy_stats() -> ModuleType:
    """``scipy.stats``, imported where a function first needs it (the note above)."""
    # lazy: scipy, a second of imports that the workflow's parse skips
    from scipy import stats

    return stats


def paired_differences(
    arm: Mapping[int, float], baseline: Mapping[int, float]
) -> tuple[list[int], np.ndarray]:
    """The seeds of ``arm`` (sorted) and ``arm[seed] - baseline[seed]`` for each: ``{seed: value}`` maps,
    matched by seed. A baseline seed without an arm run is not used; an arm seed without a baseline run is a
    ``ValueError`` (a pairing is the point: an unpaired run compares nothing)."""
    unpaired = sorted(seed for seed in arm if seed not in baseline)
    if unpaired:
        raise ValueError(f"seed(s) {', '.join(map(str, unpaired))} have no baseline run to pair with")
    seeds = sorted(arm)
    return seeds, np.array([float(arm[seed]) - float(baseline[seed]) for seed in seeds])


def _as_sample(values: ArrayLike, minimum: int) -> np.ndarray:
    sample = np.asarray(values, dtype=float).ravel()
    if sample.size < minimum:
        raise ValueError(f"needs at least {minimum} values, got {sample.size}")
    if not np.all(np.isfinite(sample)):
        raise ValueError("the values must be finite (leave out the pairs with a missing or diverged run)")
    return sample


def _mean(sample, axis=-1):
    return np.mean(sample, axis=axis)


def mean_confidence_interval(values: ArrayLike, confidence: float = CONFIDENCE_LEVEL) -> tuple[float, float]:
    """The percentile bootstrap CI of the mean of ``values`` (``scipy.stats.bootstrap``,
    :data:`BOOTSTRAP_RESAMPLES` resamples with replacement, seed :data:`RESAMPLING_SEED`; §11.1). It covers
    less than its level at few values (§11.3): the verdict rule shows it only from
    :data:`BOOTSTRAP_MIN_SEEDS` seeds on."""
    sample = _as_sample(values, MIN_PAIRED_SEEDS)
    stats = _scipy_stats()
    result = stats.bootstrap(
        (sample,),
        _mean,
        vectorized=True,
        n_resamples=BOOTSTRAP_RESAMPLES,
        confidence_level=confidence,
        method=BOOTSTRAP_METHOD,
        random_state=RESAMPLING_SEED,
    )
    # the percentiles of the resampled means of a constant sample can come out one ulp apart in either order
    low, high = sorted((float(result.confidence_interval.low), float(result.confidence_interval.high)))
    return low, high


def t_interval(values: ArrayLike, confidence: float = CONFIDENCE_LEVEL) -> tuple[float, float]:
    """Student's t-interval of the mean of ``values`` (§11.1): ``mean ± t_{(1+c)/2, n-1} s / sqrt(n)``
    with the sample sd ``s`` (``scipy.stats.t``; the interval of ``scipy.stats.ttest_1samp``). A constant
    sample's interval is that constant."""
    sample = _as_sample(values, MIN_PAIRED_SEEDS)
    mean = float(np.mean(sample))
    sem = float(np.std(sample, ddof=1)) / math.sqrt(sample.size)
    stats = _scipy_stats()
    half = float(stats.t.ppf(0.5 + confidence / 2, sample.size - 1)) * sem
    return mean - half, mean + half


def sign_flip_p_value(differences: ArrayLike) -> float:
    """Two-sided p-value of the paired sign-flip permutation test of mean difference 0 (§11.2):
    ``scipy.stats.permutation_test`` on the one sample of differences with ``permutation_type='samples'``,
    which flips the sign of each difference independently (under the null, which run of a pair is the arm
    is a coin toss). Exact, over all ``2**n`` sign vectors (``n_resamples=inf``), for ``n <=``
    :data:`EXACT_SIGN_FLIP_SEEDS`; twice the smaller one-sided p, at most 1, which for this symmetric null
    is the share of sign vectors whose ``|mean|`` is at least the observed one."""
    sample = _as_sample(differences, MIN_PAIRED_SEEDS)
    exact = sample.size <= EXACT_SIGN_FLIP_SEEDS
    stats = _scipy_stats()
    result = stats.permutation_test(
        (sample,),
        _mean,
        permutation_type="samples",
        vectorized=True,
        # scipy's documented value for "every sign vector" is np.inf, which its stubs do not allow for
        n_resamples=cast(int, np.inf) if exact else SIGN_FLIP_RESAMPLES,
        batch=SIGN_FLIP_BATCH,
        alternative="two-sided",
        random_state=RESAMPLING_SEED,
    )
    return float(result.pvalue)


def smallest_sign_flip_p_value(n_seeds: int) -> float:
    """The smallest two-sided p the exact sign-flip test can give with ``n_seeds`` pairs: ``2 / 2**n``
    (every difference of one sign; 0.0625 at 5 seeds, 0.0078 at 8, 0.00195 at 10)."""
    return min(1.0, 2.0 / 2.0**n_seeds)


def holm_adjusted(p_values: ArrayLike) -> np.ndarray:
    """Holm's step-down adjusted p-values of a family (§11.3), in the order given: with the family's
    ``m`` p-values sorted, ``p_(1) <= ... <= p_(m)``, the ``i``-th adjusted value is
    ``min(1, max_{j <= i} (m - j + 1) p_(j))``. Rejecting where it is below ``alpha`` controls the
    family-wise error rate at ``alpha`` (Holm 1979). A member without a p-value enters as 1."""
    p = np.asarray(p_values, dtype=float).ravel()
    p = np.where(np.isfinite(p), p, 1.0)
    order = np.argsort(p, kind="stable")
    steps = p.size - np.arange(p.size)  # m, m - 1, ..., 1
    adjusted = np.minimum(1.0, np.maximum.accumulate(steps * p[order]))
    out = np.empty_like(p)
    out[order] = adjusted
    return out


def minimum_seeds(alpha: float, family_size: int) -> int:
    """The smallest number of seed pairs at which the exact sign-flip test can reach ``alpha`` after Holm
    over ``family_size`` comparisons (§11.3): the smallest ``n`` with ``m * 2 / 2**n < alpha`` (the
    smallest p there is, :func:`smallest_sign_flip_p_value`, at Holm's first step, where it is multiplied
    by ``m``). 8 for ``alpha = 0.05`` and 4 to 6 comparisons."""
    if not 0 < alpha < 1 or family_size < 1:
        raise ValueError(f"needs 0 < alpha < 1 and a family of at least one, got {alpha}, {family_size}")
    n = 1
    while family_size * smallest_sign_flip_p_value(n) >= alpha:
        n += 1
    return n


def t_test_power(effect_over_sd: float, n_seeds: int, level: float) -> float:
    """Power of the two-sided one-sample t-test at ``level`` with ``n_seeds`` differences whose mean is
    ``effect_over_sd`` standard deviations from 0: ``P(|T| > t_{1 - level/2, n-1})`` with ``T`` noncentral
    t (``scipy.stats.nct``, ``n - 1`` degrees of freedom, noncentrality ``effect_over_sd * sqrt(n)``). The
    lower tail ``P(T < -c)`` is taken as ``P(-T > c)``, ``-T`` noncentral t with ``-noncentrality``: scipy's
    ``nct.cdf`` far in the lower tail returns NaN (e.g. 16 seeds, a family of 12, effect 2 sd)."""
    df = n_seeds - 1
    stats = _scipy_stats()
    critical = float(stats.t.ppf(1 - level / 2, df))
    noncentrality = effect_over_sd * math.sqrt(n_seeds)
    return float(stats.nct.sf(critical, df, noncentrality) + stats.nct.sf(critical, df, -noncentrality))


def detectable_effect(sd: float, n_seeds: int, level: float, power: float = POWER) -> float:
    """The smallest mean difference a paired comparison of ``n_seeds`` seeds with paired sd ``sd`` detects
    with probability ``power`` in a two-sided test at ``level`` (§11.3): the effect ``e`` with
    :func:`t_test_power` ``(e / sd, n, level) = power``, solved with ``scipy.optimize.brentq`` (the t-test's
    power, which the sign-flip test approaches when the differences are normal). NaN below 2 seeds."""
    if n_seeds < MIN_PAIRED_SEEDS or not math.isfinite(sd):
        return math.nan
    if sd == 0:
        return 0.0
    upper = 1.0
    while t_test_power(upper, n_seeds, level) < power:
        upper *= 2
    # lazy: scipy, a second of imports that the workflow's parse skips (note at the top)
    from scipy import optimize

    ratio = optimize.brentq(lambda r: t_test_power(r, n_seeds, level) - power, 0.0, upper, xtol=1e-12)
    return float(ratio * sd)


# The power of the exact sign-flip test (§11.3) is estimated over this many normal samples, the same ones
# (seed RESAMPLING_SEED) at every effect size: its Monte Carlo standard error at a power of 0.8 is 0.006.
POWER_DRAWS = 4_000
# The detectable effect is found by bisection on effect / sd to this precision.
POWER_TOLERANCE = 1e-4
# A sign vector's |sum| counts as reaching the observed one within this relative round-off: the identity
# vector (every sign kept) must count, whatever order its sum was added in.
SIGN_FLIP_TIE_TOLERANCE = 1e-12


def _sign_vectors(n: int) -> np.ndarray:
    """Every vector of ``n`` signs, as rows of a ``(2**n, n)`` array of +-1."""
    codes = np.arange(2**n)[:, None] >> np.arange(n)[None, :]
    return 1.0 - 2.0 * (codes & 1)


def exact_sign_flip_p_values(samples: ArrayLike) -> np.ndarray:
    """The exact two-sided sign-flip p-value (:func:`sign_flip_p_value`, §11.2) of each row of ``samples``
    (``(k, n)``), at once: the share of the ``2**n`` sign vectors whose ``|sum|`` reaches the observed one.
    The sums are split in two halves of the seeds (``2**(n/2)`` partial sums each), so that counting the
    pairs of halves whose total reaches the observed sum is a sort and a search instead of ``2**n`` sums:
    the null distribution is symmetric, so the two-sided count is twice the count of totals ``>= |sum|``."""
    rows = np.atleast_2d(np.asarray(samples, dtype=float))
    n = rows.shape[1]
    first = n // 2
    left = rows[:, :first] @ _sign_vectors(first).T  # (k, 2**first)
    right = np.sort(rows[:, first:] @ _sign_vectors(n - first).T, axis=1)  # (k, 2**(n - first))
    observed = np.abs(rows.sum(axis=1)) * (1 - SIGN_FLIP_TIE_TOLERANCE)
    counts = np.empty(len(rows))
    for i in range(len(rows)):
        below = np.searchsorted(right[i], observed[i] - left[i], side="left")
        counts[i] = right.shape[1] * left.shape[1] - below.sum()
    return np.minimum(1.0, 2.0 * counts / 2.0**n)


@functools.cache
def _standard_normal_draws(n_seeds: int) -> np.ndarray:
    return np.random.default_rng(RESAMPLING_SEED).standard_normal((POWER_DRAWS, n_seeds))


def sign_flip_power(effect_over_sd: float, n_seeds: int, level: float) -> float:
    """Power of the exact two-sided sign-flip test (§11.2) rejecting at ``p < level`` when the ``n_seeds``
    differences are normal with mean ``effect_over_sd`` standard deviations: the share of
    :data:`POWER_DRAWS` simulated samples (fixed, seed :data:`RESAMPLING_SEED`) whose exact p is below
    ``level``. The test is scale-free, so the power depends on the effect in sd units alone. Above
    :data:`EXACT_SIGN_FLIP_SEEDS` seeds, where the test itself samples sign vectors, the t-test's power
    (:func:`t_test_power`), which it approaches. Below :func:`minimum_seeds` for ``level`` it is 0."""
    if 2.0 / 2.0**n_seeds >= level:
        return 0.0
    if n_seeds > EXACT_SIGN_FLIP_SEEDS:
        return t_test_power(effect_over_sd, n_seeds, level)
    p_values = exact_sign_flip_p_values(effect_over_sd + _standard_normal_draws(n_seeds))
    return float(np.mean(p_values < level))


@functools.cache
def sign_flip_detectable_ratio(n_seeds: int, level: float, power: float = POWER) -> float:
    """The smallest effect, in sd units, that the exact sign-flip test at ``level`` detects with
    probability ``power`` (:func:`sign_flip_power`, bisection to :data:`POWER_TOLERANCE` over the same
    simulated samples); infinite where it cannot reject at all."""
    if sign_flip_power(1e6, n_seeds, level) < power:
        return math.inf
    low, high = 0.0, 1.0
    while sign_flip_power(high, n_seeds, level) < power:
        low, high = high, 2 * high
    while high - low > POWER_TOLERANCE:
        middle = (low + high) / 2
        low, high = (low, middle) if sign_flip_power(middle, n_seeds, level) >= power else (middle, high)
    return high


@dataclass(frozen=True)
class PairedEstimate:
    """An arm against its baseline over ``n_seeds`` seed pairs (docs/design.md §11.1, §11.2): the mean of the
    per-seed differences ``arm - baseline`` and their sample sd; the ``1 - alpha`` t-interval (``ci_low``,
    ``ci_high``) and the ``1 - 2 alpha`` one of the equivalence test (``tost_low``, ``tost_high``); the
    ``1 - alpha`` percentile bootstrap interval from :data:`BOOTSTRAP_MIN_SEEDS` seeds on (else NaN); the
    exact two-sided sign-flip p."""

    n_seeds: int
    delta_mean: float
    sd: float
    ci_low: float
    ci_high: float
    tost_low: float
    tost_high: float
    boot_ci_low: float
    boot_ci_high: float
    p_value: float


def estimate_paired(differences: ArrayLike, alpha: float = ALPHA) -> PairedEstimate:
    """Mean, sd, intervals and p-value of per-seed differences ``arm - baseline`` (§11.1, §11.2), of the
    differences sorted: the same numbers, to the last bit, whatever order the seeds come in."""
    sample = np.sort(_as_sample(differences, MIN_PAIRED_SEEDS))
    boot = (
        mean_confidence_interval(sample, 1 - alpha)
        if sample.size >= BOOTSTRAP_MIN_SEEDS
        else (math.nan, math.nan)
    )
    return PairedEstimate(
        n_seeds=int(sample.size),
        delta_mean=float(np.mean(sample)),
        sd=float(np.std(sample, ddof=1)),
        ci_low=t_interval(sample, 1 - alpha)[0],
        ci_high=t_interval(sample, 1 - alpha)[1],
        tost_low=t_interval(sample, 1 - 2 * alpha)[0],
        tost_high=t_interval(sample, 1 - 2 * alpha)[1],
        boot_ci_low=boot[0],
        boot_ci_high=boot[1],
        p_value=sign_flip_p_value(sample),
    )


@dataclass(frozen=True)
class VerdictRule:
    """The verdict rule of docs/design.md §11.3, fixed before any run: the level ``alpha``, the equivalence
    margin ``equivalence_margin`` (δ, in the metric's units; None: no comparison is equivalent)
    and the size of the declared family of comparisons that Holm's correction runs over."""

    alpha: float = ALPHA
    equivalence_margin: float | None = None
    family_size: int = 1
    power: float = POWER

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 0.5:
            raise ValueError(f"alpha must be in (0, 0.5), not {self.alpha}")
        if self.equivalence_margin is not None and not self.equivalence_margin > 0:
            raise ValueError(f"the equivalence margin must be positive, not {self.equivalence_margin}")
        if self.family_size < 1:
            raise ValueError(f"a family has at least one comparison, not {self.family_size}")

    @property
    def minimum_seeds(self) -> int:
        """Below this many seed pairs a comparison gets no label (:func:`minimum_seeds`)."""
        return minimum_seeds(self.alpha, self.family_size)

    @property
    def detection_level(self) -> float:
        """The two-sided level of the power calculation: Holm's worst case, its first step ``alpha / m``."""
        return self.alpha / self.family_size

    def detectable_effect(self, sd: float, n_seeds: int) -> float:
        """The smallest effect the exact sign-flip test detects with :attr:`power` at ``n_seeds`` pairs of
        paired sd ``sd`` (:func:`sign_flip_detectable_ratio` at :attr:`detection_level`, for normal
        differences); infinite below :attr:`minimum_seeds`, where the test cannot reject at all."""
        if n_seeds < self.minimum_seeds:
            return math.inf
        if not math.isfinite(sd):
            return math.nan
        return sign_flip_detectable_ratio(n_seeds, self.detection_level, self.power) * sd

    def power_at_margin(self, sd: float, n_seeds: int) -> float:
        """The exact test's power (:func:`sign_flip_power` at :attr:`detection_level`) against an effect the
        size of the equivalence margin, at ``n_seeds`` pairs of paired sd ``sd``: how likely a real effect
        of that size is to be called ``better`` or ``worse``. NaN without a margin."""
        margin = self.equivalence_margin
        if margin is None or not math.isfinite(sd) or n_seeds < MIN_PAIRED_SEEDS:
            return math.nan
        if sd == 0:
            return 1.0 if n_seeds >= self.minimum_seeds else 0.0
        return sign_flip_power(margin / sd, n_seeds, self.detection_level)

    def equivalence_p_value(self, estimate: PairedEstimate | None) -> float:
        """The p of the equivalence test (TOST, §11.3) of ``estimate`` at the margin ``±δ``: the larger of
        the two one-sided t-tests' p-values, of a mean of ``δ`` or more (``scipy.stats.t.cdf`` of
        ``(mean - δ) / se``) and of ``-δ`` or less (``t.sf`` of ``(mean + δ) / se``), ``n - 1`` degrees of
        freedom. Below ``alpha`` exactly when the ``1 - 2 alpha`` t-interval lies inside ``(-δ, δ)``. A
        constant sample's is 0 inside the margin and 1 on or outside it; NaN without a margin or an
        estimate."""
        margin = self.equivalence_margin
        if margin is None or estimate is None:
            return math.nan
        mean, n = estimate.delta_mean, estimate.n_seeds
        if estimate.sd == 0:
            return 0.0 if abs(mean) < margin else 1.0
        se = estimate.sd / math.sqrt(n)
        stats = _scipy_stats()
        above = float(stats.t.cdf((mean - margin) / se, n - 1))  # H0: mean >= delta
        below = float(stats.t.sf((mean + margin) / se, n - 1))  # H0: mean <= -delta
        return max(above, below)

    def label(self, estimate: PairedEstimate | None, p_difference: float) -> str:
        """The outcome of a comparison (§11.3, :func:`outcome`): *different* when the difference test's
        ``p_difference`` (Holm-adjusted in the secondary family, its own p for the primary) is below
        ``alpha``, *equivalent* when :meth:`equivalence_p_value` is; ``n too small`` without an estimate or
        below :attr:`minimum_seeds`. Depends on the seeds' differences only through their mean, sd, count
        and sign-flip p, none of which depends on the seeds' order."""
        if estimate is None or estimate.n_seeds < self.minimum_seeds:
            return N_TOO_SMALL
        return outcome(
            p_difference < self.alpha, self.equivalence_p_value(estimate) < self.alpha, estimate.delta_mean
        )


def outcome(different: bool, equivalent: bool, delta_mean: float) -> str:
    """The verdict rule's label (docs/design.md §11.3) from its two tests' decisions and the sign of the
    mean difference (arm minus baseline; lower loss is better): ``better``/``worse`` when only the
    difference test rejects, ``better, within the margin``/``worse, within the margin`` when both do (a real
    effect smaller than the margin), ``equivalent`` when only the equivalence test does, ``inconclusive``
    when neither does. The one place the labels are made (:meth:`VerdictRule.label` calls it)."""
    if different:
        direction = BETTER if delta_mean < 0 else WORSE
        return direction + WITHIN_MARGIN if equivalent else direction
    return EQUIVALENT if equivalent else INCONCLUSIVE


# ---------------------------------------------------------------------------- rank correlation


def _finite_pairs(x: ArrayLike, y: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y)
    return x[keep], y[keep]


def _rankable(x: np.ndarray, y: np.ndarray) -> bool:
    return len(x) >= MIN_CORRELATION_POINTS and np.ptp(x) > 0 and np.ptp(y) > 0


def rank_correlation(x: ArrayLike, y: ArrayLike) -> float:
    """Spearman's ``r_s`` of the finite pairs (``scipy.stats.spearmanr``: Pearson's correlation of the
    average-tie ranks). NaN below :data:`MIN_CORRELATION_POINTS` pairs or when either side is constant."""
    x, y = _finite_pairs(x, y)
    stats = _scipy_stats()
    return float(stats.spearmanr(x, y).statistic) if _rankable(x, y) else math.nan


def _spearman_along(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    """``r_s`` of ``x`` and each slice of ``y`` along ``axis`` at once (the same number as spearmanr: Pearson
    of the average-tie ranks, scipy's rankdata and pearsonr), for scipy's vectorized resampling."""
    stats = _scipy_stats()
    rank_x = np.broadcast_to(stats.rankdata(x, axis=-1), np.shape(y))
    return stats.pearsonr(rank_x, stats.rankdata(y, axis=axis), axis=axis).statistic


def rank_correlation_p_value(x: ArrayLike, y: ArrayLike) -> float:
    """Two-sided permutation p-value of ``r_s(x, y) = 0`` over the points (§11.4): the null distribution
    pairs ``x`` with every ordering of ``y`` (``scipy.stats.permutation_test``, ``permutation_type=
    'pairings'`` on the one sample ``y``), exact over all ``n!`` orderings for ``n <= 8`` points, else
    :data:`PERMUTATION_RESAMPLES` random ones. NaN where :func:`rank_correlation` is."""
    x, y = _finite_pairs(x, y)
    if not _rankable(x, y):
        return math.nan

    def statistic(ordering, axis=-1):
        # r_s of n points is a ratio of integers: rounded to 12 digits, orderings that tie with the observed
        # value in exact arithmetic also tie in floating point (scipy compares with a relative tolerance only,
        # which misses ties of an observed r_s of 0 computed as +-1e-17)
        return np.round(_spearman_along(x, ordering, axis=axis), 12)

    stats = _scipy_stats()
    result = stats.permutation_test(
        (y,),
        statistic,
        permutation_type="pairings",
        vectorized=True,
        n_resamples=PERMUTATION_RESAMPLES,
        alternative="two-sided",
        random_state=RESAMPLING_SEED,
    )
    return float(result.pvalue)


def rank_correlation_ci_over_seeds(x: ArrayLike, per_seed: ArrayLike) -> tuple[float, float]:
    """95 % percentile bootstrap CI of ``r_s(x, point means)`` over seeds (§11.4): ``per_seed[i, j]`` is
    point ``i``'s value with seed ``j`` (every point trained with every seed, finite); a resample draws
    seeds with replacement, the same draw for every point (``scipy.stats.bootstrap(paired=True)``), and
    recomputes each point's mean over the drawn seeds and their rank correlation with ``x``. NaN for fewer
    than :data:`MIN_PAIRED_SEEDS` seeds or where :func:`rank_correlation` of the means is NaN."""
    x = np.asarray(x, dtype=float)
    per_seed = np.asarray(per_seed, dtype=float)  # (n_points, n_seeds)
    if per_seed.ndim != 2 or per_seed.shape[0] != len(x):
        raise ValueError(f"per_seed must be (points, seeds) with {len(x)} points, got shape {per_seed.shape}")
    if not (np.all(np.isfinite(per_seed)) and np.all(np.isfinite(x))):
        raise ValueError("per_seed and x must be finite: pass the seeds every point finished")
    if per_seed.shape[1] < MIN_PAIRED_SEEDS or not _rankable(x, per_seed.mean(axis=1)):
        return math.nan, math.nan

    def statistic(*points, axis=-1):
        means = np.stack([np.mean(point, axis=axis) for point in points], axis=-1)  # (..., n_points)
        return _spearman_along(x, means, axis=-1)

    stats = _scipy_stats()
    result = stats.bootstrap(
        tuple(per_seed),
        statistic,
        paired=True,
        vectorized=True,
        n_resamples=BOOTSTRAP_RESAMPLES,
        confidence_level=CONFIDENCE_LEVEL,
        method=BOOTSTRAP_METHOD,
        random_state=RESAMPLING_SEED,
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)
