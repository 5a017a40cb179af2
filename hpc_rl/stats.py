"""Small statistics shared by the controller's progress lines, evaluation and the offline analysis (numpy only).

    wilson_interval(wins, games)        # 95% interval of a win rate
    mean_ci95(values)                   # a mean and its 95% interval
    ratio_ci95(a, b)                    # a ratio of two samples' means and its 95% interval
    trailing_mean(values, window)       # causal smoothing of a curve
    spread([v_seed0, None, v_seed2])    # a statistic over seeds, counting those that have no value
    permutation_p([40, None, 35], [20, 25, 30])   # one-sided: does the first group take longer than the second?
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np


def wilson_interval(wins: float, games: float, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a win rate: the p with (p̂ − p)² ≤ z² p (1 − p) / n. Unlike p̂ ± z·se it
    stays inside [0, 1] and is not empty at 0 or n wins, which matters for the few games a short run finishes."""
    if games < 0 or wins < 0 or wins > games:
        raise ValueError(f"need 0 <= wins <= games, got wins={wins}, games={games}")
    if games == 0:
        return 0.0, 1.0
    p = wins / games
    centre = (p + z * z / (2 * games)) / (1 + z * z / games)
    half = z * math.sqrt(p * (1 - p) / games + z * z / (4 * games * games)) / (1 + z * z / games)
    return max(0.0, centre - half), min(1.0, centre + half)


def mean_ci95(values: np.ndarray) -> tuple[float, float, float]:
    """The mean and its 95% interval (normal approximation: mean ± 1.96 standard errors)."""
    mean = float(np.mean(values))
    half = 1.96 * float(np.std(values, ddof=1)) / np.sqrt(values.size) if values.size > 1 else float("nan")
    return mean, mean - half, mean + half


def ratio_ci95(numerator: np.ndarray, denominator: np.ndarray, numerator_worlds: np.ndarray | None = None,
               denominator_worlds: np.ndarray | None = None, z: float = 1.96) -> tuple[float, float, float]:
    """mean(numerator) / mean(denominator) of two samples of positive values (lifetimes) and its 95% interval, by the
    delta method on the ratio's logarithm, where the interval stays positive and is wider above than below, as a
    ratio's sampling spread is.

    Without worlds every value is an independent draw: log r ± z·sqrt(s_a² / (n_a·ā²) + s_b² / (n_b·b̄²)). With
    each value's world (cluster; both sides may share worlds, as players evaluated in the same worlds do), the
    worlds are the independent draws: with each world's sums S and counts N of the two sides, log r = log ΣS_a −
    log ΣN_a − log ΣS_b + log ΣN_b is linearised per world as S_a,w / S̄_a − N_a,w / N̄_a − S_b,w / S̄_b +
    N_b,w / N̄_b, whose variance over the W worlds, divided by W, is log r's. Agents of one world share its map
    and neighbours, so their lifetimes move together: the per-value interval is then too narrow. With a single
    value (or world) the bounds are NaN."""
    a, b = np.asarray(numerator, dtype=np.float64), np.asarray(denominator, dtype=np.float64)
    if a.size == 0 or b.size == 0:
        raise ValueError(f"a ratio of means needs values on both sides, got {a.size} and {b.size}")
    mean_a, mean_b = float(np.mean(a)), float(np.mean(b))
    if mean_a <= 0 or mean_b <= 0:
        raise ValueError(f"a ratio's interval needs positive means, got {mean_a} and {mean_b}")
    ratio = mean_a / mean_b
    if (numerator_worlds is None) != (denominator_worlds is None):
        raise ValueError("give the worlds of both sides or of neither")
    if numerator_worlds is None:
        if a.size < 2 or b.size < 2:
            return ratio, float("nan"), float("nan")
        var_log = a.var(ddof=1) / (a.size * mean_a ** 2) + b.var(ddof=1) / (b.size * mean_b ** 2)
    else:
        worlds, index = np.unique(np.concatenate([numerator_worlds, denominator_worlds]), return_inverse=True)
        if index.size != a.size + b.size:
            raise ValueError(f"one world per value: {a.size} and {b.size} values, {np.size(numerator_worlds)} and "
                             f"{np.size(denominator_worlds)} worlds")
        if worlds.size < 2:
            return ratio, float("nan"), float("nan")
        ia, ib = index[:a.size], index[a.size:]
        sums_a, sums_b = (np.bincount(i, weights=v, minlength=worlds.size) for i, v in ((ia, a), (ib, b)))
        counts_a, counts_b = (np.bincount(i, minlength=worlds.size).astype(np.float64) for i in (ia, ib))
        linear = (sums_a / sums_a.mean() - counts_a / counts_a.mean() - sums_b / sums_b.mean()
                  + counts_b / counts_b.mean())
        var_log = linear.var(ddof=1) / worlds.size
    half = z * math.sqrt(var_log)
    return ratio, ratio * math.exp(-half), ratio * math.exp(half)


def trailing_mean(values: np.ndarray, window: int) -> np.ndarray:
    """Mean of each value and the ``window - 1`` before it (fewer at the start): causal, so a crossing found on the
    smoothed series happens no earlier than the data that caused it."""
    if window < 1:
        raise ValueError(f"smoothing window must be >= 1, got {window}")
    values = np.asarray(values, dtype=np.float64)
    if window == 1 or values.size == 0:
        return values.copy()
    csum = np.concatenate([[0.0], np.cumsum(values)])
    idx = np.arange(1, values.size + 1)
    lo = np.maximum(idx - window, 0)
    return (csum[idx] - csum[lo]) / (idx - lo)


@dataclass(frozen=True)
class Spread:
    """A statistic over seeds: the values that exist (runs that reached), and how many runs there were."""

    values: tuple[float, ...]
    runs: int

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return float(np.mean(self.values)) if self.values else float("nan")

    @property
    def std(self) -> float:
        """Sample standard deviation (ddof 1); 0 for a single value."""
        return float(np.std(self.values, ddof=1)) if self.n > 1 else 0.0 if self.n else float("nan")

    @property
    def min(self) -> float:
        return float(np.min(self.values)) if self.values else float("nan")

    @property
    def max(self) -> float:
        return float(np.max(self.values)) if self.values else float("nan")


def spread(values: Iterable[float | None]) -> Spread:
    """Spread over seeds, None (a seed that never reached a threshold) counted in ``runs`` but not in the stats."""
    values = list(values)
    return Spread(tuple(float(v) for v in values if v is not None), len(values))


def permutation_p(slower: Sequence[float | None], faster: Sequence[float | None], exact_limit: int = 200_000,
                  draws: int = 100_000, seed: int = 0) -> float:
    """One-sided permutation test over seeds that ``slower`` takes more versions (to a threshold) than ``faster``:
    the fraction of the ways to split the pooled seeds into groups of these sizes whose ``slower`` side has a rank
    sum (equivalently Mann-Whitney's U) at least the observed one. None (a seed that never reached the threshold)
    counts as slower than every seed that did, ties between such seeds as ties; ranks rather than means, since such
    a seed has no number of versions and one slow seed must not outweigh the others.

    Exact (every split enumerated) while there are at most ``exact_limit`` splits; beyond, ``draws`` random
    permutations from ``seed``, with p = (1 + hits) / (1 + draws) so that it is never 0. The smallest exact p is
    1 / C(n + m, n): 0.05 for 3 seeds against 3, 0.014 for 4 against 4, 0.0011 for 6 against 6."""
    a = np.array([math.inf if v is None else float(v) for v in slower])
    b = np.array([math.inf if v is None else float(v) for v in faster])
    if a.size == 0 or b.size == 0:
        raise ValueError(f"a permutation test needs seeds on both sides, got {a.size} and {b.size}")
    if np.isnan(a).any() or np.isnan(b).any():
        raise ValueError("versions to a threshold must be numbers or None, got NaN")
    pooled = np.concatenate([a, b])
    from scipy.stats import rankdata  # here: the training roles import this module, and need no scipy.stats

    ranks = rankdata(pooled)  # tied values share the mean of their ranks (inf ties with inf)
    observed = ranks[:a.size].sum()
    n, k = pooled.size, a.size
    if math.comb(n, k) <= exact_limit:
        splits = np.array(list(combinations(range(n), k)), dtype=np.intp)
        sums = ranks[splits].sum(axis=1)
        # Midranks are multiples of 1/2, so their sums are exact in float64 and >= compares them exactly.
        return float(np.mean(sums >= observed))
    rng = np.random.default_rng(seed)
    picks = np.argsort(rng.random((draws, n)), axis=1)[:, :k]
    hits = int(np.sum(ranks[picks].sum(axis=1) >= observed))
    return (1 + hits) / (1 + draws)
