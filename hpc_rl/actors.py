"""Actors: whatever chooses actions for agents of a vectorised environment, behind one interface.

    actor.act(obs) -> actions      # obs of E copies x A agents (``hpc_rl.envs.api``); actions: every head, (E, A)
    actor.reset(done)              # done: (E,) bool, the copies whose game ended (the env already started the next)

The reference bots (``hpc_rl.envs.scripted``: ``RandomBot``, ``ScriptedBot``), ``PolicyActor`` (a policy playing
some agents) and ``PopulationActors`` (policies playing disjoint agents: one per population) implement it;
``hpc_rl.play.play`` runs games between actors, and the serial runner's opponent and an env rank's scripted bot are
actors too. An actor answers for every agent of every copy; the caller applies its
answers to the agents it controls (``PolicyActor`` computes only those and leaves the others 0).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from hpc_rl.envs.api import Actions, Obs
from hpc_rl.model.device import to_device
from hpc_rl.model.policy import Policy, act, hero_indices


class Actor(Protocol):
    """Chooses actions from observations; told after every env step which copies' games ended."""

    def act(self, obs: Obs) -> Actions:
        """The actions of every agent of every copy, one (E, A) int64 array per head, for ``obs``."""
        ...

    def reset(self, done: np.ndarray) -> None:
        """``done`` (E,) bool: the copies whose game ended in the last step; their next observation starts a new one.
        An actor with memory forgets those games (a new actor starts every copy fresh)."""
        ...


class PolicyActor:
    """``policy`` playing the agents ``agents`` ((E, A) bool) of E copies, sampling (or greedy: ``deterministic``).

    It keeps an LSTM state per controlled agent and resets it at the first step of each game, as inference ranks do;
    sampling draws from torch's global generator. Its actions are 0 for the agents it does not control.
    """

    def __init__(self, policy: Policy, agents: np.ndarray, deterministic: bool = False):
        agents = np.asarray(agents)
        spec = policy.spec
        if agents.dtype != bool or agents.ndim != 2 or agents.shape[1] != spec.num_agents:
            raise ValueError(f"agents must be a (copies, {spec.num_agents}) bool array, got {agents.shape} "
                             f"{agents.dtype}")
        self.policy = policy
        self.agents = agents
        self.deterministic = deterministic
        self.device = next(policy.parameters()).device
        self.rows = np.flatnonzero(agents.reshape(-1))  # its agents among the E*A flat ones
        self.copy = self.rows // spec.num_agents  # the copy of each
        self.hero = torch.from_numpy(np.tile(hero_indices(spec), agents.shape[0])[self.rows]).to(self.device)
        self.state = policy.initial_state(self.rows.size, self.device)
        self.starts = np.ones(self.rows.size, dtype=bool)

    def act(self, obs: Obs) -> Actions:
        flat = {k: v.reshape(self.agents.size, *v.shape[2:])[self.rows] for k, v in obs.items()}
        step = act(self.policy, to_device(flat, self.device), self.hero, torch.from_numpy(self.starts).to(self.device),
                   self.state, self.deterministic)
        self.state = step.state
        self.starts = np.zeros(self.rows.size, dtype=bool)
        actions = {}
        for head, chosen in step.actions.items():
            actions[head] = np.zeros(self.agents.shape, dtype=np.int64)
            actions[head].reshape(-1)[self.rows] = chosen.cpu().numpy()
        return actions

    def reset(self, done: np.ndarray) -> None:
        if done.shape != (self.agents.shape[0],):
            raise ValueError(f"done must have one entry per copy ({self.agents.shape[0]}), got shape {done.shape}")
        self.starts |= done[self.copy]

    def reset_agents(self, ends: np.ndarray) -> None:
        """``ends`` (E, A) bool: the agents whose episode ended (a world that ends episodes per agent,
        ``EnvSpec.episode_ends``); their next step starts from a fresh LSTM state."""
        if ends.shape != self.agents.shape:
            raise ValueError(f"ends must be {self.agents.shape}, got {ends.shape}")
        self.starts |= ends.reshape(-1)[self.rows]


class MaskedActor:
    """A bot (``RandomBot``: its choices depend on the current observation only) playing the agents ``agents`` ((E,
    A) bool); its actions are 0 for the others, as ``PolicyActor``'s, so that it plays beside other actors in one
    world (``PopulationActors``)."""

    def __init__(self, bot: Actor, agents: np.ndarray):
        self.bot, self.agents = bot, np.asarray(agents, dtype=bool)

    def act(self, obs: Obs) -> Actions:
        return {head: np.where(self.agents, chosen, 0) for head, chosen in self.bot.act(obs).items()}

    def reset(self, done: np.ndarray) -> None:
        self.bot.reset(done)

    def reset_agents(self, ends: np.ndarray) -> None:
        """Nothing to forget: the bot keeps no state per agent."""


class PopulationActors:
    """Actors of disjoint agents as one: each population's policy (``hpc_rl.populations``) playing its own agents,
    or a bot some of them (``MaskedActor``)."""

    def __init__(self, actors: list[PolicyActor | MaskedActor]):
        self.actors = actors

    def act(self, obs: Obs) -> Actions:
        parts = [actor.act(obs) for actor in self.actors]  # each is 0 for the agents it does not control
        return {head: sum(p[head] for p in parts) for head in parts[0]}

    def reset(self, done: np.ndarray) -> None:
        for actor in self.actors:
            actor.reset(done)

    def reset_agents(self, ends: np.ndarray) -> None:
        for actor in self.actors:
            actor.reset_agents(ends)
