"""OpenAI Five's opponent pool (appendix H): 80% of games against the latest policy, 20% against past versions.

A past version is drawn with probability ``p = softmax(q)`` over quality scores ``q``. A version entering the pool
gets the pool's maximum quality, so a new version is tried soon; when the current policy beats past version ``i``,
``q_i <- q_i - eta / (N p_i)`` (N past versions). Dividing by ``N p_i`` makes the expected decrease per game the same
for every version however often it is drawn, so only the win rate against it, not its draw frequency, lowers its
quality.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

LATEST = -1  # the opponent id meaning "the current policy" (self-play against itself)


def softmax(q: np.ndarray) -> np.ndarray:
    z = np.exp(q - q.max())
    return z / z.sum()


def quality_after_win(q: np.ndarray, i: int, eta: float) -> np.ndarray:
    """Qualities after the current policy beat past version at index ``i``: ``q_i - eta / (N p_i)``."""
    p = softmax(q)
    out = q.copy()
    out[i] -= eta / (len(q) * p[i])
    return out


@dataclass
class OpponentPool:
    """Past policy versions with quality scores; ``sample`` picks the opponent of one game."""

    latest_fraction: float = 0.8  # games against the current policy
    eta: float = 0.01  # quality learning rate
    versions: list[int] = field(default_factory=list)
    qualities: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 0.0 <= self.latest_fraction <= 1.0:
            raise ValueError(f"latest_fraction must be in [0, 1], got {self.latest_fraction}")
        if self.eta <= 0:
            raise ValueError(f"eta must be > 0, got {self.eta}")
        if len(self.versions) != len(self.qualities):
            raise ValueError("versions and qualities differ in length")

    def add(self, version: int) -> None:
        if version in self.versions:
            raise ValueError(f"version {version} is already in the pool")
        self.qualities.append(max(self.qualities, default=0.0))
        self.versions.append(version)

    def probabilities(self) -> np.ndarray:
        return softmax(np.asarray(self.qualities, dtype=np.float64))

    def sample(self, rng: np.random.Generator) -> int:
        """The opponent of one game: ``LATEST`` or a past version id."""
        if not self.versions or rng.random() < self.latest_fraction:
            return LATEST
        return self.versions[rng.choice(len(self.versions), p=self.probabilities())]

    def record_win(self, version: int) -> None:
        """The current policy beat past ``version``: lower its quality."""
        i = self.versions.index(version)
        self.qualities = quality_after_win(np.asarray(self.qualities, dtype=np.float64), i, self.eta).tolist()
