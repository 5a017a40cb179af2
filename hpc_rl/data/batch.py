"""A batch of trajectory segments, time-major, and the buffer an inference rank fills one step at a time."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from hpc_rl.algo.bptt import LSTMState
from hpc_rl.envs.api import EnvSpec
from hpc_rl.model.policy import HEADS, PolicyStep


@dataclass
class Batch:
    """Segments of T steps for B agents, time-major; what an inference rank ships to a learner."""

    obs: dict[str, torch.Tensor]  # (T, B, ...) per observation key
    hero: torch.Tensor  # (T, B) hero index
    starts: torch.Tensor  # (T, B) bool: the step is the first of a game (reset the LSTM state before it)
    actions: dict[str, torch.Tensor]  # (T, B) per head
    logp: torch.Tensor  # (T, B) behaviour log-probability of the whole action
    value: torch.Tensor  # (T, B) behaviour value
    reward: torch.Tensor  # (T, B) shaped reward
    done: torch.Tensor  # (T, B) bool: the step ended the game
    weight: torch.Tensor  # (T, B) 1 for steps to train on, 0 for others (opponents' steps)
    version: torch.Tensor  # (T, B) behaviour policy version
    chunk_h: torch.Tensor  # (T / chunk_len, B, H) LSTM state before the first step of every chunk
    chunk_c: torch.Tensor
    bootstrap_value: torch.Tensor  # (B,) value of the observation after the last step

    @property
    def num_samples(self) -> int:
        return int(self.weight.sum())


class SegmentBuffer:
    """Fills one segment of ``segment_len`` steps for N agents, then hands it out as a ``Batch``."""

    def __init__(self, spec: EnvSpec, num_agents: int, segment_len: int, chunk_len: int, lstm_size: int):
        if segment_len % chunk_len:
            raise ValueError(f"segment_len {segment_len} is not a multiple of the BPTT chunk length {chunk_len}")
        self.segment_len, self.chunk_len = segment_len, chunk_len
        lead = (segment_len, num_agents)
        self.obs = {key: np.zeros(lead + shape[2:], dtype=dtype)
                    for key, (shape, dtype) in spec.observation_shapes(1).items()}
        self.hero = np.zeros(lead, dtype=np.int64)
        self.starts = np.zeros(lead, dtype=bool)
        self.actions = {head: np.zeros(lead, dtype=np.int64) for head in HEADS}
        self.logp = np.zeros(lead, dtype=np.float32)
        self.value = np.zeros(lead, dtype=np.float32)
        self.reward = np.zeros(lead, dtype=np.float32)
        self.done = np.zeros(lead, dtype=bool)
        self.weight = np.zeros(lead, dtype=np.float32)
        self.version = np.zeros(lead, dtype=np.int64)
        self.chunk_h = torch.zeros(segment_len // chunk_len, num_agents, lstm_size)
        self.chunk_c = torch.zeros_like(self.chunk_h)

    def store_state(self, t: int, state: LSTMState) -> None:
        """Record the LSTM state before step ``t`` if ``t`` starts a chunk."""
        if t % self.chunk_len == 0:
            self.chunk_h[t // self.chunk_len] = state[0].cpu()
            self.chunk_c[t // self.chunk_len] = state[1].cpu()

    def store(self, t: int, obs: dict[str, np.ndarray], hero: np.ndarray, starts: np.ndarray, step: PolicyStep,
              reward: np.ndarray, done: np.ndarray, weight: np.ndarray, version: int) -> None:
        for key, value in obs.items():
            self.obs[key][t] = value
        self.hero[t], self.starts[t] = hero, starts
        for head in HEADS:
            self.actions[head][t] = step.actions[head].cpu().numpy()
        self.logp[t] = step.logp.cpu().numpy()
        self.value[t] = step.value.cpu().numpy()
        self.reward[t], self.done[t], self.weight[t], self.version[t] = reward, done, weight, version

    def batch(self, bootstrap_value: torch.Tensor) -> Batch:
        t = torch.from_numpy
        return Batch({k: t(v.copy()) for k, v in self.obs.items()}, t(self.hero.copy()), t(self.starts.copy()),
                     {k: t(v.copy()) for k, v in self.actions.items()}, t(self.logp.copy()), t(self.value.copy()),
                     t(self.reward.copy()), t(self.done.copy()), t(self.weight.copy()), t(self.version.copy()),
                     self.chunk_h.clone(), self.chunk_c.clone(), bootstrap_value.cpu().float())
