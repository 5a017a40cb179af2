"""Single-agent Gymnasium environments as an ``hpc_rl.envs.api`` vectorised environment.

N copies of one Gymnasium environment (flat ``Box`` observation, ``Discrete`` action) are stepped together. Each
copy is one agent of team 0: its observation becomes ``global``, there are no entities and no targets, the
action goes to the ``action`` head, ``num_moves`` is 1, and the reward is the single event ``reward``. A copy whose
episode ends (terminated or truncated) is reset in the same call, as the API requires.

``infos`` carries, per copy, ``winner`` (always −1: there is no opponent), ``episode_return`` and
``episode_length`` of the episode that just ended (meaningful where ``dones``), and ``truncated`` (E, 1): the episode
hit its time limit rather than a terminal state. The spec declares it a step info, so it travels with the experience
to the learner, which bootstraps the return past the limit where ``ppo.time_limit_bootstrap`` asks.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from hpc_rl.envs.api import TRUNCATED, Actions, EnvSpec, Obs, StepInfo


class GymVecEnv:
    def __init__(self, env_id: str, num_envs: int, **make_kwargs):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.env_id = env_id
        self.num_envs = num_envs
        self.envs = [gym.make(env_id, **make_kwargs) for _ in range(num_envs)]
        space, actions = self.envs[0].observation_space, self.envs[0].action_space
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
            raise TypeError(f"{env_id}: observation space {space} is not a flat Box")
        if not isinstance(actions, gym.spaces.Discrete):
            raise TypeError(f"{env_id}: action space {actions} is not Discrete")
        self.spec = EnvSpec(num_agents=1, agent_team=(0,), global_features=int(space.shape[0]),
                            num_actions=int(actions.n), reward_events=("reward",),
                            step_infos=(StepInfo(TRUNCATED, (), "bool"),))
        self._obs = np.zeros((num_envs, space.shape[0]), dtype=np.float32)
        self._returns = np.zeros(num_envs)
        self._lengths = np.zeros(num_envs, dtype=np.int64)
        self._masks = {
            "action_mask": np.ones((num_envs, 1, self.spec.num_actions), dtype=bool),
            "move_mask": np.ones((num_envs, 1, 1), dtype=bool),
            "target_mask": np.zeros((num_envs, 1, 0), dtype=bool),
        }

    def _observation(self) -> Obs:
        obs = {"global": self._obs[:, None, :].copy()}
        obs.update({k: v.copy() for k, v in self._masks.items()})
        return obs

    def reset(self, seed: int) -> Obs:
        """Reset every copy; copy i is seeded with ``seed + i`` so runs are reproducible."""
        for i, env in enumerate(self.envs):
            self._obs[i], _ = env.reset(seed=seed + i)
            env.action_space.seed(seed + i)
        self._returns[:] = 0.0
        self._lengths[:] = 0
        return self._observation()

    def step(self, actions: Actions) -> tuple[Obs, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        action = np.asarray(actions["action"])
        if action.shape != (self.num_envs, 1):
            raise ValueError(f"actions['action'] has shape {action.shape}, expected {(self.num_envs, 1)}")
        if action.min() < 0 or action.max() >= self.spec.num_actions:
            raise ValueError(f"actions['action'] outside [0, {self.spec.num_actions}): {action.ravel().tolist()}")
        rewards = np.zeros((self.num_envs, 1, 1), dtype=np.float32)
        dones = np.zeros(self.num_envs, dtype=bool)
        infos = {
            "winner": np.full(self.num_envs, -1, dtype=np.int64),
            "episode_return": np.zeros(self.num_envs),
            "episode_length": np.zeros(self.num_envs, dtype=np.int64),
            TRUNCATED: np.zeros((self.num_envs, 1), dtype=bool),
        }
        for i, env in enumerate(self.envs):
            obs, reward, terminated, truncated, _ = env.step(int(action[i, 0]))
            rewards[i, 0, 0] = reward
            self._returns[i] += reward
            self._lengths[i] += 1
            if terminated or truncated:
                dones[i] = True
                infos["episode_return"][i] = self._returns[i]
                infos["episode_length"][i] = self._lengths[i]
                infos[TRUNCATED][i] = truncated and not terminated
                self._returns[i] = 0.0
                self._lengths[i] = 0
                obs, _ = env.reset()
            self._obs[i] = obs
        return self._observation(), rewards, dones, infos

    def close(self) -> None:
        for env in self.envs:
            env.close()
