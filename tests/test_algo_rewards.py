"""Reward shaping (OpenAI Five appendix G) against a per-agent reference and hand-computed values."""

import numpy as np
import pytest

from hpc_rl.algo.rewards import RewardConfig, shape_rewards


def reference(events, teams, weights, decayed, tau, game_time):
    env_count, agents, _ = events.shape
    out = np.zeros((env_count, agents))
    for e in range(env_count):
        rho = []
        for i in range(agents):
            total = 0.0
            for k, w in enumerate(weights):
                factor = 0.6 ** (game_time[e] / 600.0) if decayed[k] else 1.0
                total += w * events[e, i, k] * factor
            rho.append(total)
        spirit = []
        for i in range(agents):
            mates = [rho[j] for j in range(agents) if teams[j] == teams[i]]
            spirit.append((1 - tau) * rho[i] + tau * sum(mates) / len(mates))
        for i in range(agents):
            enemies = [spirit[j] for j in range(agents) if teams[j] != teams[i]]
            out[e, i] = spirit[i] - (sum(enemies) / len(enemies) if enemies else 0.0)
    return out


def test_matches_reference_5v5():
    rng = np.random.default_rng(0)
    teams = (0,) * 5 + (1,) * 5
    events = rng.normal(size=(3, 10, 3)).astype(np.float32)
    cfg = RewardConfig(weights=(1.0, 0.5, 5.0), decayed=(True, True, False))
    times = np.array([0.0, 600.0, 1500.0])
    got = shape_rewards(events, teams, cfg, 0.3, times)
    np.testing.assert_allclose(got, reference(events, teams, cfg.weights, cfg.decayed, 0.3, times), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(got.sum(axis=1), 0.0, atol=1e-5)  # zero-sum with equal team sizes


def test_hand_values_1v1():
    # events: (gold, win); weights (0.1, 10); gold decays, win does not; at 10 min the factor is 0.6.
    events = np.array([[[20.0, 1.0], [10.0, 0.0]]])
    cfg = RewardConfig(weights=(0.1, 10.0), decayed=(True, False))
    got = shape_rewards(events, (0, 1), cfg, team_spirit=0.0, game_time_s=np.array([600.0]))
    rho0, rho1 = 20 * 0.1 * 0.6 + 10.0, 10 * 0.1 * 0.6
    assert got[0].tolist() == pytest.approx([rho0 - rho1, rho1 - rho0])


def test_team_spirit_one_shares_everything_and_single_team_is_not_zero_summed():
    events = np.array([[[4.0], [0.0]]])
    cfg = RewardConfig(weights=(1.0,), decayed=(False,), decay_period_s=None)
    assert shape_rewards(events, (0, 0), cfg, team_spirit=1.0)[0].tolist() == [2.0, 2.0]
    assert shape_rewards(events, (0, 0), cfg, team_spirit=0.0)[0].tolist() == [4.0, 0.0]


def test_bad_input():
    with pytest.raises(ValueError, match="decayed"):
        RewardConfig(weights=(1.0, 2.0), decayed=(True,))
    cfg = RewardConfig()
    with pytest.raises(ValueError, match="events"):
        shape_rewards(np.zeros((1, 2, 3)), (0, 1), cfg, 0.0, np.zeros(1))
    with pytest.raises(ValueError, match="game_time_s"):
        shape_rewards(np.zeros((1, 2, 1)), (0, 1), cfg, 0.0)
    with pytest.raises(ValueError, match="team_spirit"):
        shape_rewards(np.zeros((1, 2, 1)), (0, 1), cfg, 1.5, np.zeros(1))
