"""`python -m hpc_rl.bench env` on a tiny setting: whole games played and counted, every figure present and sane
(no timing asserted)."""

from argparse import Namespace

import numpy as np
import pytest

from hpc_rl.bench import env as bench
from hpc_rl.envs.moba import MobaConfig, MobaEnv
from hpc_rl.envs.moba_config import EV_HP, EV_TOWER_HP
from hpc_rl.envs.nmmo_config import NmmoConfig

ARGS = dict(copies_1v1=2, copies_5v5=2, games=5, replay_every=4, replay_window=10, warmup=0, seed=0, nmmo_copies=1,
            nmmo_steps=5)


def test_env_bench_plays_whole_games_with_fighting():
    copies, games = 3, 5
    config = MobaConfig(map_size=32.0, towers_per_lane=1, time_limit=700)  # the small map, games capped at 700 steps
    r = bench.measure(config, copies, games, replay_every=4, replay_window=50, warmup=2, seed=0)
    assert r["episodes_finished"] >= games * copies and r["min_episodes_per_copy"] >= games
    assert sum(r["outcomes"].values()) == r["episodes_finished"] and r["outcomes"]["scripted"] > 0  # bases fall
    assert 0 < r["mean_episode_length"] <= 700 and r["steps"] >= games * r["mean_episode_length"]
    assert 0 < r["combat_step_share"] <= 1
    for key in ("agent_steps_per_s", "env_steps_per_s", "env_seconds_per_step", "bot_share", "full_games_vs_replay"):
        assert r[key] > 0, key
    assert r["agent_steps_per_s"] == pytest.approx(2 * r["env_steps_per_s"])
    assert r["bot_share"] < 1 and set(r["bot_seconds_per_step"]) == {"scripted", "random"}
    assert all(s > 0 for s in r["bot_seconds_per_step"].values())
    assert r["bots"] == ["scripted", "random"] and r["num_envs"] == copies and r["agents_per_env"] == 2
    replay = r["early_game_replay"]
    assert replay["agent_steps_per_s"] > 0 and replay["replayed_actions"] == 64
    assert replay["steps"] == -(-r["steps"] // 4)  # interleaved: after the first game step and every 4th from there
    assert replay["episodes_finished"] == 0 and replay["combat_step_share"] < r["combat_step_share"]  # walking out


def test_combat_is_read_from_every_unit_not_only_the_reward_events():
    # Heroes that stand still take no damage; the creep waves meet in the middle of the lane after ~100 steps and
    # fight there, which no hero's or structure's reward event shows.
    env = MobaEnv(MobaConfig(), 1)
    env.reset(0)
    noop = {head: np.zeros((1, 2), dtype=np.int64) for head in ("action", "move", "target")}
    hit = []
    for _ in range(200):
        hp0, alive0 = bench.non_hero_state(env)
        _, events, dones, infos = env.step(noop)
        assert not dones.any() and not (events[..., [EV_HP, EV_TOWER_HP]] < 0).any()
        hit.append(bool(bench.took_damage(env, hp0, alive0, events, dones, infos["winner"])[0]))
    first = hit.index(True)
    assert 60 < first < 150, first
    assert sum(hit[first:]) >= 10  # the creeps go on fighting (every unit strikes once per 7-9 steps)


def test_nmmo_bench_keeps_a_full_world_and_compares_the_papers_drain():
    config = NmmoConfig(num_agents=24, map_size=24, border=2, drain=0)
    r = bench.measure_nmmo(config, 2, steps=20, seed=0)
    assert r["agents_per_env"] == 24 and r["num_envs"] == 2 and r["drain"] == 0 and r["steps"] == 20
    for key in ("agent_steps_per_s", "agent_steps_per_cpu_s", "live_agent_steps_per_s", "env_seconds_per_step"):
        assert r[key] > 0, key
    assert r["live_agent_steps_per_s"] == pytest.approx(r["mean_alive"] * r["agent_steps_per_s"])
    assert r["mean_alive"] > 0.8  # no starvation: the population stays near its cap
    paper = r["paper_drain"]
    assert 0 < paper["mean_alive"] < r["mean_alive"] and paper["deaths_per_tick"] > r["deaths_per_tick"]
    assert len(r["load_average"]) == 2
    assert [name for name, _, _ in bench.nmmo_worlds(8)] == ["nmmo_128", "nmmo_1024"]


@pytest.mark.parametrize("field, value", [("copies_1v1", 0), ("copies_5v5", -1), ("games", 0), ("replay_every", 0),
                                          ("replay_window", 0), ("warmup", -1), ("seed", -1), ("nmmo_copies", 0),
                                          ("nmmo_steps", 0)])
def test_env_bench_rejects_bad_options(field, value):
    with pytest.raises(ValueError, match=field.replace("_", "-")):
        bench.run(Namespace(**{**ARGS, field: value}))
