"""The vectorised multi-agent environment API every environment and adapter implements.

Many copies of one environment are stepped together; every array has leading dimensions
``(num_envs, num_agents)`` (``E``, ``A``). Environments know nothing of learning, torch or MPI.

The loop, in three lines::

    obs = env.reset(seed)
    while True:
        obs, reward_events, dones, infos = env.step({"action": a, "move": m, "target": t})

Observation fields (``Obs`` is a dict of numpy arrays):

================================  =================================  ==========================================
key                               shape, dtype                       meaning
================================  =================================  ==========================================
``entities/<type>``               (E, A, max_count, F_type) float32  one attribute vector per unit of that type
                                                                     seen by the agent's team (fog of war)
``entities/<type>/mask``          (E, A, max_count) bool             True where the slot holds a unit
``global``                        (E, A, G) float32                  global features (time, own hero, gold, ...)
``action_mask``                   (E, A, num_actions) bool           primary actions legal now
``move_mask``                     (E, A, num_moves) bool             move offsets legal now
``target_mask``                   (E, A, num_targets) bool           units that may be targeted now; index into
                                                                     the entity slots concatenated in
                                                                     ``spec.entities`` order
================================  =================================  ==========================================

``step`` returns ``reward_events`` (E, A, len(spec.reward_events)) float32, the per-agent game events of that step
(the learner weights and shapes them), ``dones`` (E,) bool, and ``infos``, a dict of arrays of shape (E,) (at least
``winner``: team index, -1 for a draw, meaningful where ``dones``). A copy that ends is reset in the same call: the
observation returned for it is the first of its next game. An environment may declare per-agent quantities of every
step in ``spec.step_infos`` (``infos[name]`` of shape (E, A, *shape)): they travel with the experience to the learner
as the batch field ``info/<name>`` (``hpc_rl.data.batch``). One of them, ``truncated`` (E, A) bool, marks the steps
where a time limit rather than a terminal state ended the game (its ``dones``): the learner bootstraps the return past
them where ``ppo.time_limit_bootstrap`` asks (``hpc_rl.algo.gae``).

Episodes end per copy (``dones``) unless ``spec.agent_episodes``: then an agent's episode ends on its own, at the step
where ``infos["agent_done"]`` (E, A) bool is True (a persistent world: an agent dies, its world goes on), and the
pipeline ends episodes per agent (``EnvSpec.episode_ends``: the done that GAE, the value bootstrap and the LSTM reset
read). Such a world may hold empty agent slots (before a spawn, after a death): ``spec.occupied_feature`` names the
``global`` feature that is 1 where a slot holds an agent and 0 where it is empty (``EnvSpec.occupied``); an empty
slot's steps are never trained on.

Actions are decoupled heads, each an int64 array (E, A): ``action`` (primary), ``move`` (move offset) and ``target``
(unit slot). ``spec.action_uses_move[a]`` / ``spec.action_uses_target[a]`` say which heads a primary action reads, so a
learner gates the parameter heads by the chosen action as in OpenAI Five; unused heads are ignored by the env.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

Obs = dict[str, np.ndarray]
Actions = dict[str, np.ndarray]
AgentId = int
TeamId = int
AGENT_DONE = "agent_done"  # the step info that ends one agent's episode where ``spec.agent_episodes``
TRUNCATED = "truncated"  # the step info that marks a game ended by a time limit (ppo.time_limit_bootstrap)


@dataclass(frozen=True)
class EntitySpec:
    """One unit type of the observation: at most ``max_count`` units of ``num_features`` attributes each."""

    name: str
    max_count: int
    num_features: int


@dataclass(frozen=True)
class StepInfo:
    """A per-agent quantity the environment reports in ``infos[name]`` at every step, (E, A, *shape) of ``dtype``,
    carried to the learner beside the step's reward (the batch field ``info/<name>``)."""

    name: str
    shape: tuple[int, ...] = ()
    dtype: str = "float32"


@dataclass(frozen=True)
class EnvSpec:
    """Static description of a vectorised environment: what ``reset``/``step`` return and accept."""

    num_agents: int
    agent_team: tuple[TeamId, ...]  # team of each agent slot, len == num_agents
    global_features: int
    num_actions: int
    num_moves: int = 1
    entities: tuple[EntitySpec, ...] = ()
    action_uses_move: tuple[bool, ...] = ()  # per primary action; empty = no action uses it
    action_uses_target: tuple[bool, ...] = ()
    reward_events: tuple[str, ...] = ("reward",)
    learning_agents: tuple[AgentId, ...] = field(default=())  # agents a learner controls; empty = all
    step_infos: tuple[StepInfo, ...] = ()  # per-agent infos that travel with the experience
    agent_episodes: bool = False  # episodes end per agent at infos["agent_done"] (declared in step_infos)
    occupied_feature: int | None = None  # the global feature that is 1 where a slot holds an agent; None: always

    def __post_init__(self) -> None:
        if len(self.agent_team) != self.num_agents:
            raise ValueError(f"agent_team has {len(self.agent_team)} entries for {self.num_agents} agents")
        for name, flags in (("action_uses_move", self.action_uses_move), ("action_uses_target", self.action_uses_target)):
            if flags and len(flags) != self.num_actions:
                raise ValueError(f"{name} has {len(flags)} entries for {self.num_actions} actions")
        if self.num_actions < 1 or self.num_moves < 1 or self.global_features < 0:
            raise ValueError("num_actions and num_moves must be >= 1, global_features >= 0")
        if self.agent_episodes and StepInfo(AGENT_DONE, (), "bool") not in self.step_infos:
            raise ValueError(f"agent_episodes needs step_infos to declare {AGENT_DONE!r} of shape () and dtype bool")
        if self.occupied_feature is not None and not 0 <= self.occupied_feature < self.global_features:
            raise ValueError(f"occupied_feature {self.occupied_feature} is not a global feature "
                             f"(0..{self.global_features - 1})")

    def episode_ends(self, dones: np.ndarray, agent_done: np.ndarray | None) -> np.ndarray:
        """(E, A) bool: the agents whose episode ended at this step: every agent of a copy that is done, and where
        ``agent_episodes`` the agents ``agent_done`` (E, A) marks (``infos["agent_done"]``)."""
        ends = np.repeat(np.asarray(dones, bool)[:, None], self.num_agents, axis=1)
        if self.agent_episodes:
            ends |= np.asarray(agent_done, bool)
        return ends

    def occupied(self, obs_global: np.ndarray) -> np.ndarray:
        """(...) bool for ``global`` observations (..., G): the slots that hold an agent (all, where
        ``occupied_feature`` is None)."""
        if self.occupied_feature is None:
            return np.ones(obs_global.shape[:-1], dtype=bool)
        return obs_global[..., self.occupied_feature] > 0.5

    @property
    def num_targets(self) -> int:
        return sum(e.max_count for e in self.entities)

    @property
    def num_teams(self) -> int:
        return len(set(self.agent_team))

    @staticmethod
    def opponent_team(num_copies: int) -> np.ndarray:
        """(copies,): the team an opponent (the scripted bot or a past version) plays in a two-team game: team 1 in
        even copies and team 0 in odd ones, so the learning policy plays and learns both sides (it is the other
        team, ``1 - opponent_team``)."""
        return 1 - np.arange(num_copies) % 2

    def opponent_side(self, num_copies: int) -> np.ndarray:
        """(copies, agents) bool: the agents of ``opponent_team`` in each copy."""
        return np.asarray(self.agent_team)[None, :] == self.opponent_team(num_copies)[:, None]

    def observation_shapes(self, num_envs: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """The shape and dtype of every observation field for ``num_envs`` copies."""
        lead = (num_envs, self.num_agents)
        shapes: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
        for e in self.entities:
            shapes[f"entities/{e.name}"] = (lead + (e.max_count, e.num_features), np.dtype(np.float32))
            shapes[f"entities/{e.name}/mask"] = (lead + (e.max_count,), np.dtype(bool))
        shapes["global"] = (lead + (self.global_features,), np.dtype(np.float32))
        shapes["action_mask"] = (lead + (self.num_actions,), np.dtype(bool))
        shapes["move_mask"] = (lead + (self.num_moves,), np.dtype(bool))
        shapes["target_mask"] = (lead + (self.num_targets,), np.dtype(bool))
        return shapes

    def check_obs(self, obs: Obs, num_envs: int) -> None:
        """Raise ValueError naming the first field whose key, shape or dtype differs from the spec."""
        expected = self.observation_shapes(num_envs)
        if set(obs) != set(expected):
            raise ValueError(f"observation keys {sorted(obs)} differ from the spec's {sorted(expected)}")
        for key, (shape, dtype) in expected.items():
            if obs[key].shape != shape or obs[key].dtype != dtype:
                raise ValueError(f"observation {key!r}: got {obs[key].shape} {obs[key].dtype}, expected {shape} {dtype}")


class VecEnv(Protocol):
    """Many copies of one environment stepped together (see the module docstring for every field)."""

    spec: EnvSpec
    num_envs: int

    def reset(self, seed: int) -> Obs: ...

    def step(self, actions: Actions) -> tuple[Obs, np.ndarray, np.ndarray, dict[str, np.ndarray]]: ...
