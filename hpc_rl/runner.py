"""The serial runner: a vectorised environment, the policy and the PPO learner in one process.

    runner = SerialRunner(env, RunnerConfig(...), PPOConfig(...), ModelConfig(...))
    while runner.env_steps < total: batch = runner.collect(); metrics = runner.learner.update(batch)

It is built from the pieces the distributed roles reuse: ``act`` (one policy step for a batch of agents, as an
inference rank runs it), ``SegmentBuffer`` (segments of ``segment_len`` steps with the LSTM state at every BPTT
chunk start, as an inference rank assembles them) and ``Learner`` (``update(batch) -> metrics``, as a learner rank
runs it, with seams for the allreduce of gradients and of statistics).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from hpc_rl.actors import Actor
from hpc_rl.algo.config import PPOConfig
from hpc_rl.algo.learner import Learner
from hpc_rl.algo.rewards import RewardConfig, shape_rewards
from hpc_rl.data.batch import Batch, SegmentBuffer
from hpc_rl.envs.api import VecEnv
from hpc_rl.model.config import ModelConfig
from hpc_rl.model.device import select_device, to_device
from hpc_rl.model.policy import Policy, act, hero_indices

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunnerConfig:
    """How the serial runner collects experience."""

    num_envs: int = 8  # environment copies stepped together
    segment_len: int = 64  # steps per segment (a multiple of the BPTT chunk length)
    seed: int = 0  # seeds torch, the environments (seed + copy) and sampling
    step_seconds: float = 1 / 7.5  # game seconds per step (Honor of Kings acts every 133 ms), for the reward's
    # game-time decay when the env's infos lack ``game_time``
    log_every: int = 10  # updates between progress lines (0: none)
    device: str = "auto"  # "auto": CUDA if available, else CPU

    def __post_init__(self) -> None:
        if self.num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {self.num_envs}")
        if self.segment_len < 1:
            raise ValueError(f"segment_len must be >= 1, got {self.segment_len}")
        if self.step_seconds <= 0:
            raise ValueError(f"step_seconds must be > 0, got {self.step_seconds}")


class SerialRunner:
    """Collects segments from ``env`` with the current policy and trains on each as it fills."""

    def __init__(self, env: VecEnv, config: RunnerConfig | None = None, ppo: PPOConfig | None = None,
                 model: ModelConfig | None = None, reward: RewardConfig | None = None,
                 opponent: Actor | None = None, learning_agents: tuple[int, ...] | None = None,
                 alternate_sides: bool = False):
        """``opponent`` (an actor, e.g. the scripted bot) plays every agent outside ``learning_agents`` (default:
        ``spec.learning_agents``, or all); without it the policy plays every agent (self-play) and is trained on the
        learning agents' steps only. ``alternate_sides`` (two teams, with an opponent) swaps the sides in odd copies,
        so that the policy learns to play both (the map is not symmetric in absolute coordinates)."""
        config = config or RunnerConfig(num_envs=env.num_envs)
        ppo = ppo or PPOConfig()
        model = model or ModelConfig()
        if env.num_envs != config.num_envs:
            raise ValueError(f"env has {env.num_envs} copies, config.num_envs is {config.num_envs}")
        spec = env.spec
        self.env, self.config, self.spec = env, config, spec
        self.reward = reward or RewardConfig(weights=(1.0,) * len(spec.reward_events),
                                             decayed=(False,) * len(spec.reward_events))
        if len(self.reward.weights) != len(spec.reward_events):
            raise ValueError(f"reward weights has {len(self.reward.weights)} entries for events {spec.reward_events}")
        torch.manual_seed(config.seed)
        self.device = select_device(config.device)
        self.policy = Policy(spec, model).to(self.device)
        self.learner = Learner(self.policy, ppo, device=self.device, seed=config.seed)
        agents = spec.num_agents
        self.num_agents = config.num_envs * agents
        self.hero = np.tile(hero_indices(spec), config.num_envs)
        learning = learning_agents if learning_agents is not None else (spec.learning_agents or tuple(range(agents)))
        if not learning or not set(learning) <= set(range(agents)):
            raise ValueError(f"learning_agents {learning} must be a non-empty subset of 0..{agents - 1}")
        self.learning_agents = tuple(learning)
        self.opponent = opponent
        if alternate_sides and (opponent is None or spec.num_teams != 2):
            raise ValueError("alternate_sides needs an opponent and a two-team environment")
        controlled = np.isin(np.arange(agents), learning)
        self.controlled = np.tile(controlled, (config.num_envs, 1))  # (E, A): the agents this policy plays
        if alternate_sides:
            self.controlled[1::2] = ~controlled
        self.weight = self.controlled.reshape(-1).astype(np.float32)
        self.buffer = SegmentBuffer(spec, self.num_agents, config.segment_len, model.chunk_len, model.lstm_size)
        self.obs = env.reset(config.seed)
        self.starts = np.ones(self.num_agents, dtype=bool)
        self.state = self.policy.initial_state(self.num_agents, self.device)
        self.game_steps = np.zeros(config.num_envs)
        self.env_steps = 0
        self.episode_returns: deque[float] = deque(maxlen=100)
        self.episode_returns_sum = np.zeros(self.num_agents)
        self.wins: deque[float] = deque(maxlen=100)

    def _flat(self, obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {k: v.reshape(self.num_agents, *v.shape[2:]) for k, v in obs.items()}

    def collect(self) -> Batch:
        """Play one segment of ``segment_len`` steps in every copy; returns it as a batch."""
        agents = self.spec.num_agents
        hero = torch.from_numpy(self.hero).to(self.device)
        tau = self.learner.config.team_spirit(self.learner.version)
        for t in range(self.config.segment_len):
            self.buffer.store_state(t, self.state)
            flat = self._flat(self.obs)
            step = act(self.policy, to_device(flat, self.device), hero,
                       torch.from_numpy(self.starts).to(self.device), self.state)
            self.state = step.state
            actions = {k: v.cpu().numpy().reshape(self.config.num_envs, agents) for k, v in step.actions.items()}
            if self.opponent is not None:
                theirs = self.opponent.act(self.obs)
                actions = {k: np.where(self.controlled, v, theirs[k]) for k, v in actions.items()}
            obs, events, dones, infos = self.env.step(actions)
            if self.opponent is not None:
                self.opponent.reset(dones)
            self.game_steps += 1
            game_time = infos.get("game_time", self.game_steps * self.config.step_seconds)
            reward = shape_rewards(events, self.spec.agent_team, self.reward, tau, game_time).reshape(-1)
            done = np.repeat(dones, agents)
            self.buffer.store(t, flat, self.hero, self.starts, step, reward, done, self.weight,
                              self.learner.version)
            self._record_episodes(events, dones, infos)
            self.game_steps[dones] = 0
            self.obs, self.starts = obs, done
            self.env_steps += self.config.num_envs
        bootstrap = act(self.policy, to_device(self._flat(self.obs), self.device), hero,
                        torch.from_numpy(self.starts).to(self.device), self.state)
        return self.buffer.batch(bootstrap.value)

    def _record_episodes(self, events: np.ndarray, dones: np.ndarray, infos: dict[str, np.ndarray]) -> None:
        self.episode_returns_sum += events.sum(axis=2).reshape(-1)
        ended = np.repeat(dones, self.spec.num_agents) & (self.weight > 0)
        self.episode_returns.extend(self.episode_returns_sum[ended].tolist())
        self.episode_returns_sum[np.repeat(dones, self.spec.num_agents)] = 0.0
        if self.spec.num_teams > 1:
            first = self.controlled.argmax(axis=1)  # one agent this policy plays in every copy
            learner_team = np.asarray(self.spec.agent_team)[first]
            self.wins.extend((infos["winner"][dones] == learner_team[dones]).astype(float).tolist())

    def run(self, total_steps: int, on_update: Callable[[SerialRunner, dict[str, float]], bool] | None = None
            ) -> dict[str, float]:
        """Collect and train until ``total_steps`` env steps (or ``on_update`` returns True); the last metrics."""
        metrics: dict[str, float] = {}
        started = time.perf_counter()
        updates = 0
        while self.env_steps < total_steps:
            batch = self.collect()
            metrics = self.learner.update(batch)
            updates += 1
            metrics.update(self.stats(started))
            if self.config.log_every and updates % self.config.log_every == 0:
                log.info("version %d  steps %d  %.0f steps/s  return %.1f  policy_loss %.3f  value_loss %.3f  "
                         "entropy %.3f", self.learner.version, self.env_steps, metrics["perf/steps_per_s"],
                         metrics["stats/episode_return"], metrics["train/policy_loss"],
                         metrics["train/value_loss"], metrics["train/entropy"])
            if on_update is not None and on_update(self, metrics):
                break
        return metrics

    def stats(self, started: float) -> dict[str, float]:
        out = {"perf/env_steps": float(self.env_steps), "perf/version": float(self.learner.version),
               "perf/steps_per_s": self.env_steps / max(time.perf_counter() - started, 1e-9),
               "stats/episode_return": float(np.mean(self.episode_returns)) if self.episode_returns else float("nan")}
        if self.wins:
            out["stats/win_rate"] = float(np.mean(self.wins))
        return out
