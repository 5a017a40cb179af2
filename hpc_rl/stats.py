"""Small statistics shared by the controller's progress lines, evaluation and the offline analysis (numpy only).

    wilson_interval(wins, games)        # 95% interval of a win rate
    trailing_mean(values, window)       # causal smoothing of a curve
    spread([v_seed0, None, v_seed2])    # a statistic over seeds, counting those that have no value
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

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
