"""Reward shaping from game events (OpenAI Five appendix G).

The environment reports per-agent event counts; the learner turns them into rewards in four steps:

1. weighted sum of events:           ρ_i = Σ_k w_k e_{i,k}
2. game-time decay of every event but win/loss:  ρ_i ← ρ_i × 0.6^(T / 10 min)  (late-game rewards are larger;
   without decay learning would focus on the late game)
3. team spirit τ:                     ρ_i ← (1 − τ) ρ_i + τ ρ̄_team(i)
4. zero-sum:                          r_i = ρ_i − mean of ρ over the agents of the other teams

With one team (a single-agent Gymnasium environment) step 4 leaves rewards unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np


@dataclass(frozen=True)
class RewardConfig:
    """How game events become rewards."""

    weights: tuple[float, ...] = (1.0,)  # one weight per event in ``EnvSpec.reward_events`` order
    decayed: tuple[bool, ...] = (True,)  # per event: does the game-time decay apply (False for win/loss)
    decay_base: float = 0.6  # the reward factor after ``decay_period_s`` of game time
    decay_period_s: float | None = 600.0  # seconds of game time per factor of ``decay_base``; None: no decay
    zero_sum: bool = True  # subtract the mean reward of the enemy agents

    def __post_init__(self) -> None:
        if len(self.weights) != len(self.decayed):
            raise ValueError(f"weights has {len(self.weights)} entries, decayed has {len(self.decayed)}")
        if not 0.0 < self.decay_base <= 1.0:
            raise ValueError(f"decay_base must lie in (0, 1], got {self.decay_base}")
        if self.decay_period_s is not None and self.decay_period_s <= 0:
            raise ValueError(f"decay_period_s must be > 0 or None, got {self.decay_period_s}")


def shape_rewards(events: np.ndarray, agent_team: tuple[int, ...], config: RewardConfig, team_spirit: float,
                  game_time_s: np.ndarray | None = None) -> np.ndarray:
    """Rewards (E, A) from events (E, A, K), the team of every agent, τ and the game time (E,) in seconds."""
    events = np.asarray(events, dtype=np.float64)
    if events.ndim != 3 or events.shape[2] != len(config.weights):
        raise ValueError(f"events must be (E, A, {len(config.weights)}), got {events.shape}")
    if events.shape[1] != len(agent_team):
        raise ValueError(f"events has {events.shape[1]} agents, agent_team {len(agent_team)}")
    if not 0.0 <= team_spirit <= 1.0:
        raise ValueError(f"team_spirit must lie in [0, 1], got {team_spirit}")
    weights, decayed = _event_weights(config)
    if config.decay_period_s is not None and decayed.any():
        if game_time_s is None:
            raise ValueError("game_time_s is required when decay_period_s is set and an event decays")
        factor = config.decay_base ** (np.asarray(game_time_s, dtype=np.float64) / config.decay_period_s)
        per_event = np.where(decayed, factor[:, None, None], 1.0)
        rho = (events * weights * per_event).sum(axis=2)
    else:
        rho = (events * weights).sum(axis=2)

    team_mean_of, enemy_mean_of, has_enemy = _team_averages(tuple(agent_team))
    if team_spirit > 0.0:
        team_mean = rho @ team_mean_of
        rho = (1.0 - team_spirit) * rho + team_spirit * team_mean
    if config.zero_sum and enemy_mean_of is not None:
        enemy_mean = rho @ enemy_mean_of
        rho = rho - np.where(has_enemy, enemy_mean, 0.0)
    return rho.astype(np.float32)


# Every env step shapes its rewards with the same config and teams: the arrays derived from them are made once
# (both are hashable: a frozen dataclass of tuples, a tuple).
@lru_cache(maxsize=16)
def _event_weights(config: RewardConfig) -> tuple[np.ndarray, np.ndarray]:
    """``(weights, decayed)`` as arrays (K,)."""
    return np.asarray(config.weights), np.asarray(config.decayed, dtype=bool)


@lru_cache(maxsize=16)
def _team_averages(agent_team: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """``rho @ team_mean_of`` is each agent's team's mean of ``rho`` (A, A); ``rho @ enemy_mean_of`` the mean over the
    other teams' agents (None when every agent is on one team); ``has_enemy`` (A,): agents that have any."""
    teams = np.asarray(agent_team)
    same = (teams[:, None] == teams[None, :]).astype(np.float64)  # (A, A): same[i, j] = agents i, j are teammates
    team_mean_of = (same / same.sum(axis=1, keepdims=True)).T
    if same.all():
        return team_mean_of, None, np.zeros(len(agent_team), bool)
    enemy = 1.0 - same
    counts = enemy.sum(axis=1)
    return team_mean_of, (enemy / np.maximum(counts, 1.0)[:, None]).T, counts > 0
