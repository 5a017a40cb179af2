"""Evaluating policies: matches against the reference bots and other policies, and the greedy return."""

import dataclasses

import numpy as np
import pytest
import torch

from hpc_rl.config import EnvConfig
from hpc_rl.envs.gym_adapter import GymVecEnv
from hpc_rl.envs.scripted import scripted_bot_hash
from hpc_rl.evaluation import evaluate_return, play_match, play_vs_bot
from hpc_rl.model.config import ModelConfig
from hpc_rl.model.policy import Policy, act, hero_indices

from small_moba import one_torch_thread, seeded_policy, small_config  # noqa: F401 (a fixture)

pytestmark = pytest.mark.light  # runs in the base install tier (scripts/light_tier_check.sh)


def test_games_that_reach_the_time_limit_are_draws_and_the_tally_adds_up():
    config = small_config(time_limit=5)
    policy = Policy(config.env.make(num_envs=1).spec, config.model)
    result = play_vs_bot(policy, config, "scripted", games=6, seed=0)
    assert result["games"] == 6 and result["draws"] == 6 and result["wins"] == result["losses"] == 0
    assert result["win_rate"] == 0.0 and result["win_rate_ci95"][0] == 0.0 and result["win_rate_ci95"][1] < 0.5
    assert result["bot_hash"] == scripted_bot_hash()


def test_only_moba_runs_play_against_the_bots():
    config = dataclasses.replace(small_config(5), env=EnvConfig(name="gym:CartPole-v1", vs_scripted_fraction=0.0))
    policy = Policy(config.env.make(num_envs=1).spec, config.model)
    with pytest.raises(ValueError, match="needs a MOBA run"):
        play_vs_bot(policy, config, "scripted", games=2, seed=0)


def test_sides_alternate_and_results_are_counted_from_the_first_players_side():
    config = small_config(time_limit=9000)
    strong = play_match("scripted", "random", config, games=4, seed=3)
    weak = play_match("random", "scripted", config, games=4, seed=3)
    # The scripted bot beats random from either side (it is team 0 in copies 0 and 2, team 1 in 1 and 3).
    assert strong["wins"] >= 3 and strong["scores"][1] == strong["scores"][3] == 1.0
    assert weak["losses"] >= 3 and weak["wins"] + weak["draws"] + weak["losses"] == 4
    with pytest.raises(ValueError, match="even"):
        play_match("scripted", "random", config, games=3, seed=0)


def test_two_policies_play_deterministically_for_a_fixed_seed():
    config = small_config(time_limit=200)
    a, b = seeded_policy(config, 1), seeded_policy(config, 2)
    steps = []
    first = play_match(a, b, config, games=4, seed=7, on_step=lambda: steps.append(1))
    assert play_match(a, b, config, games=4, seed=7) == first
    assert first["wins"] + first["draws"] + first["losses"] == 4 and len(first["scores"]) == 4
    assert len(steps) >= 200  # on_step ran after every env step (games last up to the time limit)


def slow_returns(policy: Policy, env, seed: int) -> list[float]:
    """Every copy's first-game return, the policy acting for all agents at once, written out step by step."""
    n = env.num_envs
    hero = torch.from_numpy(np.tile(hero_indices(env.spec), n))
    obs = env.reset(seed)
    state = policy.initial_state(n)
    starts = torch.ones(n, dtype=torch.bool)
    totals, done = [0.0] * n, [False] * n
    while not all(done):
        step = act(policy, {k: torch.from_numpy(v.reshape(n, *v.shape[2:])) for k, v in obs.items()}, hero, starts,
                   state, deterministic=True)
        state = step.state
        obs, events, dones, _ = env.step({k: v.numpy().reshape(n, 1) for k, v in step.actions.items()})
        for e in range(n):
            if not done[e]:
                totals[e] += float(events[e].sum())
                done[e] = bool(dones[e])
        starts = torch.from_numpy(dones.copy())
    return totals


def test_greedy_return_matches_a_hand_written_loop():
    env = GymVecEnv("CartPole-v1", 6)
    torch.manual_seed(0)
    policy = Policy(env.spec, ModelConfig(core="lstm", lstm_size=16, embed_size=8)).eval()
    returns = evaluate_return(policy, env, seed=11)
    assert returns.shape == (6,)
    assert returns.tolist() == slow_returns(policy, env, seed=11)
    assert len(set(returns.tolist())) > 1  # the copies' games differ
