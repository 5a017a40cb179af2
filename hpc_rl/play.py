"""The game loop: actors (``hpc_rl.actors``) play one game in every copy of a vectorised environment.

    side = team_agents(env.spec, np.arange(env.num_envs) % 2)          # (E, A): team 0 in even copies, 1 in odd
    games = play(env, [(policy_actor, side), (scripted_bot, ~side)], seed)
    games.winner, games.length, games.returns                         # the first game of every copy

Every agent of every copy is played by exactly one actor, given as (actor, its agents as an (E, A) bool mask). Each
step every actor answers for the observation (in the order given: actors that sample draw from their generators in
that order), its answers are applied to its agents, the env steps, and every actor is told which copies' games
ended. Copies that finish early play on (the env has started their next game) until every copy has finished its
first one; only first games count. Evaluation, matches between policies and bots, tournaments, bot-against-bot
games and replays all run this loop; numpy only (no torch, no MPI).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from hpc_rl.envs.api import Actions, EnvSpec, VecEnv

if TYPE_CHECKING:
    from hpc_rl.actors import Actor

NOT_FINISHED = -2  # ``Games.winner`` of a copy whose first game had not ended after ``max_steps``


@dataclass
class Games:
    """The first game of every copy: ``winner`` (E,) the winning team (-1 a draw, ``NOT_FINISHED``), ``length`` (E,)
    its steps (steps played where not finished), ``returns`` (E, A) every agent's reward events summed over it."""

    winner: np.ndarray
    length: np.ndarray
    returns: np.ndarray


def team_agents(spec: EnvSpec, teams: np.ndarray) -> np.ndarray:
    """(E, A) bool: the agents of team ``teams[e]`` in every copy e."""
    return np.asarray(spec.agent_team)[None, :] == np.asarray(teams)[:, None]


def _merge_actions(chosen: Sequence[tuple[Actions, np.ndarray]]) -> Actions:
    """One action dict from several actors' answers: each agent takes the answer of the actor whose mask holds it
    (agents no mask holds get 0)."""
    merged: Actions = {}
    for actions, agents in chosen:
        for head, values in actions.items():
            merged[head] = np.where(agents, values, merged.get(head, 0))
    return merged


def play(env: VecEnv, actors: Sequence[tuple[Actor, np.ndarray]], seed: int,
         on_step: Callable[[int, np.ndarray], None] | None = None, max_steps: int | None = None) -> Games:
    """Reset ``env`` with ``seed`` and play until every copy has finished one game (or ``max_steps`` steps).

    ``actors``: (actor, agents) pairs whose (E, A) bool masks cover every agent exactly once. ``on_step(t,
    finished)`` runs once the games have started (t = 0) and after every step t, with ``finished`` (E,) the copies
    whose first game has ended: a rank heartbeats there, a replay draws its frames; it may raise to abandon the games.
    """
    shape = (env.num_envs, env.spec.num_agents)
    count = np.zeros(shape, dtype=np.int64)
    for _, agents in actors:
        if np.shape(agents) != shape or np.asarray(agents).dtype != bool:
            raise ValueError(f"every actor's agents must be a {shape} bool mask, got {np.shape(agents)} "
                             f"{np.asarray(agents).dtype}")
        count += agents
    if (count != 1).any():
        e, a = np.argwhere(count != 1)[0]
        raise ValueError(f"every agent must be played by exactly one actor: agent {a} of copy {e} has {count[e, a]}")
    if max_steps is not None and max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    obs = env.reset(seed)
    for actor, _ in actors:
        actor.reset(np.ones(env.num_envs, dtype=bool))
    winner = np.full(env.num_envs, NOT_FINISHED, dtype=np.int64)
    length = np.zeros(env.num_envs, dtype=np.int64)
    returns = np.zeros(shape)
    finished = np.zeros(env.num_envs, dtype=bool)
    t = 0
    if on_step is not None:
        on_step(t, finished)
    while not finished.all() and (max_steps is None or t < max_steps):
        obs, events, dones, infos = env.step(_merge_actions([(actor.act(obs), agents) for actor, agents in actors]))
        t += 1
        for actor, _ in actors:
            actor.reset(dones)
        returns[~finished] += events.sum(axis=2)[~finished]
        ended = dones & ~finished
        winner[ended] = infos["winner"][ended]
        length[ended] = t
        finished |= dones
        if on_step is not None:
            on_step(t, finished)
    length[~finished] = t
    return Games(winner, length, returns)
