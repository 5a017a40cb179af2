"""Running observation normaliser (OpenAI Five appendix E): z-score with running mean and std, clipped to ±5.

The statistics are (count, mean, M2), M2 being the sum of squared deviations from the mean. Two sets merge exactly
(Chan et al. 1979), so statistics gathered on different processes combine into the statistics of the union; this
is how learners agree on one normaliser before shipping it with the parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from hpc_rl.algo.reduce import Reduce, identity_reduce


@dataclass(frozen=True)
class NormStats:
    """Sufficient statistics of a set of feature vectors: how many, their mean, and Σ (x − mean)² per feature."""

    count: float
    mean: np.ndarray
    m2: np.ndarray

    @staticmethod
    def empty(num_features: int) -> NormStats:
        return NormStats(0.0, np.zeros(num_features), np.zeros(num_features))

    @staticmethod
    def of(x: np.ndarray) -> NormStats:
        """The statistics of the rows of ``x`` (any leading shape, features last)."""
        x = np.asarray(x, dtype=np.float64).reshape(-1, np.shape(x)[-1])
        mean = x.mean(axis=0) if len(x) else np.zeros(x.shape[-1])
        return NormStats(float(len(x)), mean, ((x - mean) ** 2).sum(axis=0))

    @property
    def var(self) -> np.ndarray:
        return self.m2 / self.count if self.count > 0 else np.ones_like(self.mean)


def merge(a: NormStats, b: NormStats) -> NormStats:
    """The statistics of the union of two disjoint sets (Chan, Golub and LeVeque's parallel update)."""
    if a.mean.shape != b.mean.shape:
        raise ValueError(f"cannot merge statistics of {a.mean.shape} and {b.mean.shape} features")
    count = a.count + b.count
    if count == 0:
        return a
    delta = b.mean - a.mean
    mean = a.mean + delta * (b.count / count)
    m2 = a.m2 + b.m2 + delta ** 2 * (a.count * b.count / count)
    return NormStats(count, mean, m2)


def normalize(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, clip: float = 5.0) -> torch.Tensor:
    """clip((x − mean) / std, −clip, +clip)."""
    return torch.clamp((x - mean) / std, -clip, clip)


class RunningNormalizer:
    """Keeps the statistics, updates them from batches and turns them into the (mean, std) the policy applies."""

    def __init__(self, num_features: int, clip: float = 5.0, eps: float = 1e-4):
        if num_features < 0:
            raise ValueError(f"num_features must be >= 0, got {num_features}")
        if clip <= 0:
            raise ValueError(f"clip must be > 0, got {clip}")
        self.clip = clip
        self.eps = eps
        self.stats = NormStats.empty(num_features)

    def update(self, x: np.ndarray, reduce: Reduce = identity_reduce) -> None:
        """Fold a batch (features last) into the statistics.

        With several processes, ``reduce`` sums over them: each contributes (n, n·mean, M2 + n·mean²) of its
        batch, whose sums give the statistics of the union batch, which then merges into the (identical) running
        statistics on every process.
        """
        local = NormStats.of(x)
        if reduce is not identity_reduce:
            packed = torch.from_numpy(np.concatenate([[local.count], local.count * local.mean,
                                                      local.m2 + local.count * local.mean ** 2]))
            total = reduce(packed.double()).numpy()
            n = float(total[0])
            f = len(local.mean)
            mean = total[1:1 + f] / max(n, 1.0)
            local = NormStats(n, mean, np.maximum(total[1 + f:] - n * mean ** 2, 0.0))
        self.stats = merge(self.stats, local)

    def mean_std(self) -> tuple[np.ndarray, np.ndarray]:
        return self.stats.mean.astype(np.float32), np.sqrt(self.stats.var + self.eps).astype(np.float32)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        mean, std = self.mean_std()
        return normalize(x, torch.from_numpy(mean).to(x.device), torch.from_numpy(std).to(x.device), self.clip)

    def state_dict(self) -> dict:
        return {"count": self.stats.count, "mean": self.stats.mean.copy(), "m2": self.stats.m2.copy()}

    def load_state_dict(self, state: dict) -> None:
        mean = np.asarray(state["mean"], dtype=np.float64)
        if mean.shape != self.stats.mean.shape:
            raise ValueError(f"normaliser state has {mean.shape} features, expected {self.stats.mean.shape}")
        self.stats = NormStats(float(state["count"]), mean, np.asarray(state["m2"], dtype=np.float64))
