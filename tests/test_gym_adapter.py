"""The Gymnasium adapter keeps the vectorised API's contract: shapes, auto-reset, episode records, errors."""

import gymnasium as gym
import numpy as np
import pytest

from hpc_rl.envs.api import StepInfo
from hpc_rl.envs.gym_adapter import GymVecEnv

pytestmark = pytest.mark.light  # runs in the base install tier (scripts/light_tier_check.sh)


def test_spec_and_observation_layout():
    env = GymVecEnv("CartPole-v1", 3)
    spec = env.spec
    assert (spec.num_agents, spec.global_features, spec.num_actions, spec.num_moves) == (1, 4, 2, 1)
    assert spec.entities == () and spec.reward_events == ("reward",) and spec.num_targets == 0
    assert spec.step_infos == (StepInfo("truncated", (), "bool"),)  # travels to the learner (hpc_rl.algo.gae)
    obs = env.reset(seed=7)
    spec.check_obs(obs, 3)
    assert obs["action_mask"].all()
    reference = gym.make("CartPole-v1")
    for i in range(3):
        np.testing.assert_array_equal(obs["global"][i, 0], reference.reset(seed=7 + i)[0])


def test_steps_match_gymnasium_and_reset_in_the_same_call():
    env = GymVecEnv("CartPole-v1", 2, max_episode_steps=5)
    env.reset(seed=0)
    reference = gym.make("CartPole-v1", max_episode_steps=5)
    ref_obs, _ = reference.reset(seed=0)
    for t in range(5):
        obs, rewards, dones, infos = env.step({"action": np.array([[1], [0]])})
        ref_obs, ref_reward, _, _, _ = reference.step(1)
        assert rewards.shape == (2, 1, 1) and rewards[0, 0, 0] == ref_reward
        if t < 4:
            np.testing.assert_array_equal(obs["global"][0, 0], ref_obs)
            assert not dones.any()
    # The 5-step limit truncates both copies; the returned observation is the first of the next episode.
    assert dones.all() and infos["truncated"].shape == (2, 1) and infos["truncated"].all()
    assert infos["episode_return"].tolist() == [5.0, 5.0] and infos["episode_length"].tolist() == [5, 5]
    assert (infos["winner"] == -1).all()
    assert np.abs(obs["global"][:, 0]).max() <= 0.05  # CartPole starts within ±0.05


def test_terminal_episode_returns_are_counted():
    env = GymVecEnv("CartPole-v1", 1)
    env.reset(seed=3)
    total, done = 0.0, False
    while not done:
        _, rewards, dones, infos = env.step({"action": np.array([[0]])})  # always push left: falls quickly
        total += rewards.sum()
        done = bool(dones[0])
    assert infos["episode_return"][0] == total and 5 <= total < 100 and not infos["truncated"][0]


def test_bad_input_is_rejected():
    env = GymVecEnv("CartPole-v1", 2)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="shape"):
        env.step({"action": np.zeros(2, dtype=np.int64)})
    with pytest.raises(ValueError, match="outside"):
        env.step({"action": np.array([[0], [2]])})
    with pytest.raises(ValueError, match="num_envs"):
        GymVecEnv("CartPole-v1", 0)
    with pytest.raises(TypeError, match="Discrete"):
        GymVecEnv("Pendulum-v1", 1)
