"""Third-party multi-agent environments through the same API: PettingZoo ``ParallelEnv`` copies as one ``VecEnv``.

Supported spaces (the same for every agent): observations a ``Box`` (flattened into ``global``), or a ``Dict`` with
an ``"observation"`` Box and an ``"action_mask"`` (PettingZoo's convention for legal actions); actions ``Discrete``.
There are no entities and no move or target heads (``num_moves`` 1, no targets). ``reward_events`` is the single
event ``"reward"``, the environment's own reward.

An agent that has left a running game observes zeros and its actions are ignored; its ``action_mask`` row is all True
so that a sampler never meets an empty row. A copy is done when every agent has terminated or been truncated (or
left); it is then reset with the seed of its next game. PettingZoo knows no winner, so ``infos["winner"]`` is the
team with the largest summed return over the game, -1 on a tie. Where a copy is done, ``infos["episode_return"]`` is
its game's return per agent (the mean over agents of each agent's summed reward: what a shared policy earns, and what
``hpc_rl.evaluation.evaluate_return`` averages) and ``infos["episode_length"]`` its steps.

Training selects an environment by its module, ``env.name=pettingzoo:<module>`` (``parallel_env_maker``): every agent
of every copy is one row of the pipeline's batches, and with the default ``agent_team`` (every agent on team 0) one
shared policy plays them all, as in parameter-sharing PPO.

The copies are stepped one after the other: a third-party environment is Python code of its own, so this adapter is
for correctness and small experiments, not for speed.
"""

from __future__ import annotations

import importlib
from typing import Callable

import numpy as np
from gymnasium import spaces

from hpc_rl.envs.api import Actions, EnvSpec, Obs, TeamId


def copy_seed(seed: int, copy: int, game: int) -> int:
    """The seed of game ``game`` of global copy ``copy``: independent of which other copies run alongside."""
    return int(np.random.SeedSequence([seed, copy, game]).generate_state(1)[0])


def parallel_env_maker(module: str) -> Callable[[], object]:
    """The ``parallel_env`` factory of a PettingZoo environment module (``mpe2.simple_spread_v3``,
    ``pettingzoo.butterfly.knights_archers_zombies_v11``, ...). Raises ValueError naming the module when it does not
    import or is not a parallel environment (no ``parallel_env``: PettingZoo's AEC-only games, e.g. chess)."""
    try:
        from pettingzoo import ParallelEnv
    except ImportError as err:
        raise ValueError(f"pettingzoo is not installed ({err}): pip install -e '.[pettingzoo]'") from err
    try:
        env_module = importlib.import_module(module)
    except ImportError as err:  # PettingZoo's own stub for its former MPE says where MPE went (the mpe2 package)
        raise ValueError(f"PettingZoo module {module!r} does not import: {err}") from err
    make = getattr(env_module, "parallel_env", None)
    if not callable(make):
        raise ValueError(f"PettingZoo module {module!r} has no parallel_env(): not a parallel environment")
    probe = make()
    if not isinstance(probe, ParallelEnv):
        raise ValueError(f"{module}.parallel_env() made a {type(probe).__name__}, not a pettingzoo.ParallelEnv")
    probe.close()
    return make


class PettingZooVecEnv:
    """``num_envs`` copies of the PettingZoo parallel environment made by ``make_env``."""

    def __init__(self, make_env: Callable[[], object], num_envs: int, agent_team: tuple[TeamId, ...] | None = None,
                 first_copy: int = 0):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.envs = [make_env() for _ in range(num_envs)]
        self.num_envs = num_envs
        self.first_copy = first_copy
        probe = self.envs[0]
        self.agents = tuple(probe.possible_agents)
        obs_space, act_space = probe.observation_space(self.agents[0]), probe.action_space(self.agents[0])
        if any(probe.observation_space(a) != obs_space or probe.action_space(a) != act_space for a in self.agents):
            raise ValueError("every agent must have the same observation space and the same action space")
        if not isinstance(act_space, spaces.Discrete):
            raise ValueError(f"action space must be Discrete, got {act_space}")
        self.masked = isinstance(obs_space, spaces.Dict)
        if self.masked:
            if set(obs_space.spaces) != {"observation", "action_mask"}:
                raise ValueError(f"a Dict observation space needs exactly 'observation' and 'action_mask', "
                                 f"got {sorted(obs_space.spaces)}")
            obs_space = obs_space["observation"]
        if not isinstance(obs_space, spaces.Box):
            raise ValueError(f"observation space must be a Box (or a Dict holding one), got {obs_space}")
        self.obs_dim = int(np.prod(obs_space.shape))
        self.num_actions = int(act_space.n)
        agent_team = tuple(agent_team) if agent_team is not None else (0,) * len(self.agents)
        self.spec = EnvSpec(num_agents=len(self.agents), agent_team=agent_team, global_features=self.obs_dim,
                            num_actions=self.num_actions, reward_events=("reward",))
        A = len(self.agents)
        self._obs = np.zeros((num_envs, A, self.obs_dim), dtype=np.float32)
        self._mask = np.ones((num_envs, A, self.num_actions), dtype=bool)
        self._returns = np.zeros((num_envs, A))
        self._lengths = np.zeros(num_envs, dtype=np.int64)
        self._game = np.zeros(num_envs, dtype=np.int64)
        self._seed: int | None = None

    def _load(self, i: int, observations: dict) -> None:
        self._obs[i] = 0.0
        self._mask[i] = True
        for j, agent in enumerate(self.agents):
            if agent not in observations:
                continue
            o = observations[agent]
            if self.masked:
                self._mask[i, j] = np.asarray(o["action_mask"], dtype=bool)
                o = o["observation"]
            self._obs[i, j] = np.asarray(o, dtype=np.float32).reshape(-1)

    def _reset_copy(self, i: int) -> None:
        observations, _ = self.envs[i].reset(seed=copy_seed(self._seed, self.first_copy + i, int(self._game[i])))
        self._returns[i] = 0.0
        self._lengths[i] = 0
        self._load(i, observations)

    def _observation(self) -> Obs:
        E, A = self.num_envs, len(self.agents)
        return {"global": self._obs.copy(), "action_mask": self._mask.copy(),
                "move_mask": np.ones((E, A, 1), dtype=bool), "target_mask": np.zeros((E, A, 0), dtype=bool)}

    def reset(self, seed: int) -> Obs:
        self._seed = seed
        self._game[:] = 0
        for i in range(self.num_envs):
            self._reset_copy(i)
        return self._observation()

    def step(self, actions: Actions) -> tuple[Obs, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        if self._seed is None:
            raise RuntimeError("call reset(seed) before step()")
        action = np.asarray(actions["action"])
        E, A = self.num_envs, len(self.agents)
        if action.shape != (E, A):
            raise ValueError(f"actions['action'] has shape {action.shape}, expected {(E, A)}")
        if action.size and (action.min() < 0 or action.max() >= self.num_actions):
            raise ValueError(f"actions['action'] must lie in [0, {self.num_actions})")
        rewards = np.zeros((E, A, 1), dtype=np.float32)
        dones = np.zeros(E, dtype=bool)
        winners = np.full(E, -1, dtype=np.int64)
        episode_return, episode_length = np.zeros(E), np.zeros(E, dtype=np.int64)
        team = np.asarray(self.spec.agent_team)
        for i, env in enumerate(self.envs):
            live = list(env.agents)
            observations, reward, terminated, truncated, _ = env.step(
                {agent: int(action[i, self.agents.index(agent)]) for agent in live})
            for j, agent in enumerate(self.agents):
                rewards[i, j, 0] = reward.get(agent, 0.0)
            self._returns[i] += rewards[i, :, 0]
            self._lengths[i] += 1
            over = not env.agents or all(terminated.get(a, False) or truncated.get(a, False) for a in live)
            if over:
                dones[i] = True
                totals = np.array([self._returns[i, team == t].sum() for t in range(self.spec.num_teams)])
                best = np.flatnonzero(totals == totals.max())
                winners[i] = int(best[0]) if len(best) == 1 else -1
                episode_return[i], episode_length[i] = self._returns[i].mean(), self._lengths[i]
                self._game[i] += 1
                self._reset_copy(i)
            else:
                self._load(i, observations)
        return self._observation(), rewards, dones, {"winner": winners, "episode_return": episode_return,
                                                     "episode_length": episode_length}

    def close(self) -> None:
        for env in self.envs:
            env.close()
