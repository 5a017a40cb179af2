"""The game loop against a hand-written one, and its checks of who plays which agent."""

from __future__ import annotations

import numpy as np
import pytest

from hpc_rl.envs.moba import MobaConfig, MobaEnv
from hpc_rl.envs.scripted import RandomBot, ScriptedBot
from hpc_rl.play import NOT_FINISHED, play, team_agents

pytestmark = pytest.mark.light  # runs in the base install tier (scripts/light_tier_check.sh)


def slow_play(env, actors, seed: int) -> list[tuple[int, int, list[float]]]:
    """The first game of every copy as (winner, length, every agent's summed events), written out copy by copy and
    agent by agent."""
    E, A = env.num_envs, env.spec.num_agents
    obs = env.reset(seed)
    results: list = [None] * E
    totals = [[0.0] * A for _ in range(E)]
    t = 0
    while any(r is None for r in results):
        answers = [actor.act(obs) for actor, _ in actors]
        actions = {head: np.zeros((E, A), dtype=np.int64) for head in answers[0]}
        for e in range(E):
            for a in range(A):
                owner = next(k for k, (_, agents) in enumerate(actors) if agents[e, a])
                for head in actions:
                    actions[head][e, a] = answers[owner][head][e, a]
        obs, events, dones, infos = env.step(actions)
        t += 1
        for actor, _ in actors:
            actor.reset(dones)
        for e in range(E):
            if results[e] is None:
                for a in range(A):
                    totals[e][a] += float(events[e, a].sum())
                if dones[e]:
                    results[e] = (int(infos["winner"][e]), t, totals[e])
    return results


def _scripted_against_random(config: MobaConfig, copies: int):
    """The scripted bot as team 0 in even copies and team 1 in odd ones, random on the other side."""
    spec = config.spec()
    scripted_side = team_agents(spec, np.arange(copies) % 2)
    return [(ScriptedBot(config), scripted_side), (RandomBot(5), ~scripted_side)]


def test_play_matches_a_hand_written_loop():
    config = MobaConfig()
    steps = []
    games = play(MobaEnv(config, 2), _scripted_against_random(config, 2), seed=4,
                 on_step=lambda t, finished: steps.append((t, finished.copy())))
    expected = slow_play(MobaEnv(config, 2), _scripted_against_random(config, 2), seed=4)
    assert games.winner.tolist() == [w for w, _, _ in expected] == [0, 1]  # the scripted bot won from both sides
    assert games.length.tolist() == [n for _, n, _ in expected]
    assert games.length[0] != games.length[1]  # so the copy that ended first played on into an uncounted game
    np.testing.assert_allclose(games.returns, [r for _, _, r in expected], rtol=1e-6)
    # on_step: at the start, then after every step, with each copy finished from the step its game ended.
    assert [t for t, _ in steps] == list(range(games.length.max() + 1))
    for e in range(2):
        assert [bool(finished[e]) for _, finished in steps] == [t >= games.length[e] for t, _ in steps]


def test_max_steps_leaves_games_unfinished():
    config = MobaConfig()
    games = play(MobaEnv(config, 2), _scripted_against_random(config, 2), seed=0, max_steps=7)
    assert games.winner.tolist() == [NOT_FINISHED] * 2 and games.length.tolist() == [7, 7]
    assert games.returns.shape == (2, 2)


def test_every_agent_needs_exactly_one_actor():
    config = MobaConfig()
    env = MobaEnv(config, 2)
    bot = ScriptedBot(config)
    side = team_agents(env.spec, np.array([0, 1]))
    assert side.tolist() == [[True, False], [False, True]]
    with pytest.raises(ValueError, match="agent 1 of copy 0 has 0"):
        play(env, [(bot, side)], seed=0)
    with pytest.raises(ValueError, match="agent 0 of copy 0 has 2"):
        play(env, [(bot, side), (bot, np.ones((2, 2), dtype=bool))], seed=0)
    with pytest.raises(ValueError, match=r"\(2, 2\) bool mask, got \(3, 2\)"):
        play(env, [(bot, np.ones((3, 2), dtype=bool))], seed=0)
    with pytest.raises(ValueError, match="max_steps"):
        play(env, [(bot, np.ones((2, 2), dtype=bool))], seed=0, max_steps=0)
