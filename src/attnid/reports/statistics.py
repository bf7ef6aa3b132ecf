"""Statistics that can say no: paired seed comparisons and rank correlations, on ``scipy.stats``.

Every number here is defined in docs/design.md §11; this module only applies scipy to the project's
samples, with fixed settings so that the same runs always give the same table.

* A **paired comparison** of an arm with its baseline (the interventions study): the per-seed
  differences ``arm - baseline`` of a loss, matched by seed (:func:`paired_differences`); their mean with
  a 95 % percentile bootstrap CI (:func:`mean_confidence_interval`); the two-sided sign-flip permutation
  p-value (:func:`sign_flip_p_value`); and a verdict computed from the CI (:func:`verdict`). **Lower loss
  is better**: a difference below zero means the arm reached a lower loss than the baseline.
* A **rank correlation** across the points of a study (Spearman's ``r_s``, :func:`rank_correlation`) with a
  permutation p-value over the point means (:func:`rank_correlation_p_value`) and a bootstrap CI over seeds
  (:func:`rank_correlation_ci_over_seeds`).

What these tests can and cannot say with few seeds (docs/design.md §11.3): with ``n`` paired seeds the
smallest two-sided sign-flip p-value there is is ``2 / 2**n`` (0.0625 at ``n = 5``,
:func:`smallest_sign_flip_p_value`), so at five seeds the test alone can never reach 0.05. The verdict is
taken from the bootstrap CI, not from p, and a percentile bootstrap of five numbers covers less than its
nominal 95 %: both numbers are reported side by side, and neither is a substitute for more seeds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats

CONFIDENCE_LEVEL = 0.95
# Percentile, not scipy's default BCa: BCa's acceleration is a jackknife over the sample, which at 3-10
# seeds is itself noise, and it is undefined for a sample whose values are all equal (§11.1).
BOOTSTRAP_METHOD: Final = "percentile"
BOOTSTRAP_RESAMPLES = 9_999
# scipy enumerates every sign vector when 2**n is at most this (n <= 13 seeds), else draws this many.
SIGN_FLIP_RESAMPLES = 9_999
# The same for the n! orderings of a correlation's point means: exact up to n = 8 points.
PERMUTATION_RESAMPLES = 99_999
# The most seeds / points whose null distribution scipy enumerates in full at these settings.
EXACT_SIGN_FLIP_SEEDS = SIGN_FLIP_RESAMPLES.bit_length() - 1
EXACT_PERMUTATION_POINTS = max(n for n in range(1, 20) if math.factorial(n) <= PERMUTATION_RESAMPLES)
# Fixed, so that a table computed twice from the same runs is the same table.
RESAMPLING_SEED = 0
# A bootstrap CI of a mean needs two values; a rank correlation needs three points to be worth a number.
MIN_PAIRED_SEEDS = 2
MIN_CORRELATION_POINTS = 3

BETTER, WORSE, NO_DIFFERENCE = "better", "worse", "no detectable difference"
VERDICTS = (BETTER, WORSE, NO_DIFFERENCE)


# ---------------------------------------------------------------------------- paired seeds


@dataclass(frozen=True)
class PairedComparison:
    """An arm against its baseline over ``n_seeds`` seed pairs (docs/design.md §11.1): mean of the
    per-seed differences ``arm - baseline``, its 95 % bootstrap CI, the sign-flip p-value, the verdict."""

    n_seeds: int
    delta_mean: float
    ci_low: float
    ci_high: float
    p_value: float
    verdict: str


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


def mean_confidence_interval(values: ArrayLike) -> tuple[float, float]:
    """The 95 % percentile bootstrap CI of the mean of ``values`` (``scipy.stats.bootstrap``,
    :data:`BOOTSTRAP_RESAMPLES` resamples with replacement, seed :data:`RESAMPLING_SEED`; §11.1)."""
    sample = _as_sample(values, MIN_PAIRED_SEEDS)
    result = stats.bootstrap(
        (sample,),
        _mean,
        vectorized=True,
        n_resamples=BOOTSTRAP_RESAMPLES,
        confidence_level=CONFIDENCE_LEVEL,
        method=BOOTSTRAP_METHOD,
        random_state=RESAMPLING_SEED,
    )
    # the percentiles of the resampled means of a constant sample can come out one ulp apart in either order
    low, high = sorted((float(result.confidence_interval.low), float(result.confidence_interval.high)))
    return low, high


def sign_flip_p_value(differences: ArrayLike) -> float:
    """Two-sided p-value of the paired sign-flip permutation test of mean difference 0 (§11.2):
    ``scipy.stats.permutation_test`` on the one sample of differences with ``permutation_type='samples'``,
    which flips the sign of each difference independently (under the null, which run of a pair is the arm
    is a coin toss). Exact, over all ``2**n`` sign vectors, for ``n <= 13``; twice the smaller one-sided
    p, at most 1."""
    sample = _as_sample(differences, MIN_PAIRED_SEEDS)
    result = stats.permutation_test(
        (sample,),
        _mean,
        permutation_type="samples",
        vectorized=True,
        n_resamples=SIGN_FLIP_RESAMPLES,
        alternative="two-sided",
        random_state=RESAMPLING_SEED,
    )
    return float(result.pvalue)


def smallest_sign_flip_p_value(n_seeds: int) -> float:
    """The smallest two-sided p the exact sign-flip test can give with ``n_seeds`` pairs: ``2 / 2**n``
    (every difference of one sign; 0.0625 at 5 seeds, 0.00195 at 10)."""
    return min(1.0, 2.0 / 2.0**n_seeds)


def verdict(ci_low: float, ci_high: float) -> str:
    """``better`` when the whole CI of ``arm - baseline`` lies below 0 (lower loss is better), ``worse`` when
    it lies above 0, ``no detectable difference`` when it contains 0 (§11.1)."""
    if not (math.isfinite(ci_low) and math.isfinite(ci_high)) or ci_low > ci_high:
        raise ValueError(f"not a confidence interval: [{ci_low}, {ci_high}]")
    if ci_high < 0:
        return BETTER
    if ci_low > 0:
        return WORSE
    return NO_DIFFERENCE


def compare_paired(differences: ArrayLike) -> PairedComparison:
    """Mean, CI, p-value and verdict of per-seed differences ``arm - baseline`` (§11.1, §11.2)."""
    sample = _as_sample(differences, MIN_PAIRED_SEEDS)
    low, high = mean_confidence_interval(sample)
    return PairedComparison(
        n_seeds=int(sample.size),
        delta_mean=float(np.mean(sample)),
        ci_low=low,
        ci_high=high,
        p_value=sign_flip_p_value(sample),
        verdict=verdict(low, high),
    )


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
    return float(stats.spearmanr(x, y).statistic) if _rankable(x, y) else math.nan


def _spearman_along(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    """``r_s`` of ``x`` and each slice of ``y`` along ``axis`` at once (the same number as spearmanr: Pearson
    of the average-tie ranks, scipy's rankdata and pearsonr), for scipy's vectorized resampling."""
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
