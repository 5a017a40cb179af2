"""What Neural MMO agents do (``hpc_rl.envs.nmmo_measures``): the measures against slow references, the rollout's
records against the lifetimes it reports, and jobs/evaluate.py and analysis/nmmo_behaviour.py on a tiny trained run."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from hpc_rl.actors import MaskedActor
from hpc_rl.config import EnvConfig, LeagueConfig, PipelineConfig, TrainConfig
from hpc_rl.envs import nmmo_measures as m
from hpc_rl.envs.nmmo_config import NmmoConfig
from hpc_rl.envs.scripted import RandomBot
from hpc_rl.evaluation import AGENT_STRIDE, head_to_head_teams, nmmo_exploration, nmmo_niches, nmmo_rollout
from hpc_rl.algo.config import PPOConfig
from hpc_rl.model.config import ModelConfig
from hpc_rl.runner import SerialRunner

ROOT = Path(__file__).resolve().parent.parent
WORLD = NmmoConfig(num_agents=8, map_size=20, border=2, vision=3, max_seen=4)


def tiny_config(runs_dir=".") -> TrainConfig:
    return TrainConfig(run_name="tiny", runs_dir=str(runs_dir),
                       env=EnvConfig(name="nmmo", num_envs=2, vs_scripted_fraction=0.0, nmmo=WORLD),
                       league=LeagueConfig(past_fraction=0.0), model=ModelConfig(core="lstm", lstm_size=8, embed_size=8),
                       ppo=PPOConfig(epochs=1, num_minibatches=1),
                       pipeline=PipelineConfig(segment_len=16, segments_per_batch=1, max_versions=1,
                                               final_eval_games=2))


def script(path: Path):
    """A script's module, imported from its file (its main() not run)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def slow_js(p, q) -> float:
    """½ KL(p‖m) + ½ KL(q‖m) in bits, term by term."""
    total = 0.0
    for pi, qi in zip(p, q):
        mi = (pi + qi) / 2
        total += (0.5 * pi * np.log2(pi / mi) if pi > 0 else 0.0) + (0.5 * qi * np.log2(qi / mi) if qi > 0 else 0.0)
    return total


def test_exploration_measures_match_slow_references():
    rng = np.random.default_rng(0)
    agent, cell = rng.integers(0, 30, 2000), rng.integers(0, 400, 2000)
    agents, counts = m.distinct_tiles(agent, cell)
    seen: dict[int, set[int]] = {}
    for a, c in zip(agent.tolist(), cell.tolist()):
        seen.setdefault(a, set()).add(c)
    assert agents.tolist() == sorted(seen) and counts.tolist() == [len(seen[a]) for a in sorted(seen)]
    passable = rng.random(400) < 0.7
    assert m.coverage(cell, passable) == len({c for c in cell.tolist() if passable[c]}) / passable.sum()
    assert m.coverage([3], np.arange(10) == 3) == 1.0
    with pytest.raises(ValueError, match="passable"):
        m.coverage([0], np.zeros(4, dtype=bool))


def test_divergences_match_slow_references_and_their_bounds():
    rng = np.random.default_rng(1)
    p, q, r = (x / x.sum() for x in rng.random((3, 12)) * (rng.random((3, 12)) < 0.6))
    assert m.js_divergence(p, q) == pytest.approx(slow_js(p, q), abs=1e-12)
    assert m.js_divergence(p, p) == 0.0 and m.js_divergence([1, 0], [0, 1]) == pytest.approx(1.0)
    assert m.mean_pairwise_js([p, q, r]) == pytest.approx((slow_js(p, q) + slow_js(p, r) + slow_js(q, r)) / 3)
    assert m.mean_pairwise_js([p]) is None
    dists = m.population_distributions(np.array([0, 0, 1, 1, 1]), np.array([2, 0, 1, 1, 2]), 3)
    np.testing.assert_allclose(dists[0], [0.5, 0, 0.5])
    np.testing.assert_allclose(dists[1], [0, 2 / 3, 1 / 3])


def test_split_half_is_the_baseline_that_populations_in_niches_exceed():
    # Two agents on disjoint tiles: every split puts one in each half.
    assert m.split_half_js(np.array([5, 5, 9]), np.array([0, 1, 2]), 3, seed=0) == pytest.approx(1.0)
    assert m.split_half_js(np.array([5, 5]), np.array([0, 1]), 3, seed=0) is None
    # Populations 0 and 1 draw tiles from different halves of the map; each agent draws 20 visits.
    rng = np.random.default_rng(2)
    agent = np.repeat(np.arange(40), 20)
    population = (agent >= 20).astype(np.int64)
    cell = rng.integers(0, 30, agent.size) + 20 * population
    apart = m.niche_measures(population, agent, cell, 50, seed=0)
    assert apart["between"] == pytest.approx(slow_js(*m.population_distributions(population, cell, 50).values()))
    assert apart["between"] > 0.5 > apart["split_half"] > 0  # finite samples of one population differ a little
    one = m.niche_measures(np.zeros_like(agent), agent, cell, 50, seed=0)
    assert one["between"] is None and one["split_half"] == pytest.approx(
        m.split_half_js(agent, cell, 50, seed=0))


def test_shuffled_baseline_compares_groups_of_the_populations_sizes():
    # Four populations of 6 agents, 15 visits each, all from one distribution over 40 tiles: no niches.
    rng = np.random.default_rng(4)
    agent = np.repeat(np.arange(24) * 7 + 3, 15)  # agent numbers need not be 0..n-1
    population = np.repeat(np.arange(24) % 4, 15)
    cell = rng.integers(0, 40, agent.size)
    same = m.niche_measures(population, agent, cell, 40, seed=0)
    # By hand: the agents' labels permuted 99 times from one generator, each time the mean pairwise divergence.
    gen, agents = np.random.default_rng(0), np.unique(agent)
    labels = np.array([population[agent == a][0] for a in agents])
    slow = []
    for _ in range(99):
        new = dict(zip(agents.tolist(), gen.permutation(labels).tolist()))
        shuffled = np.array([new[a] for a in agent.tolist()])
        slow.append(np.mean([slow_js(*[np.bincount(cell[shuffled == k], minlength=40) / (shuffled == k).sum()
                                        for k in (i, j)]) for i in range(4) for j in range(i + 1, 4)]))
    assert same["shuffled"] == pytest.approx(np.mean(slow), rel=1e-9)
    assert same["shuffled_p"] == pytest.approx((1 + sum(x >= same["between"] for x in slow)) / 100) and \
        same["shuffled_p"] > 0.05
    # Without niches the populations diverge as much as shuffled groups of their sizes, and less than the halves of
    # one population (3 agents each), which is why the split-half baseline is the stricter one for small populations.
    assert abs(same["between"] - same["shuffled"]) < 0.05 < same["split_half"] - same["between"]
    # Each population on tiles of its own: far above both baselines; one population: no shuffled baseline.
    apart = m.niche_measures(population, agent, cell % 10 + 10 * population, 40, seed=0)
    assert apart["between"] > 0.9 > 0.5 > apart["shuffled"] and apart["shuffled_p"] == 0.01  # none of the 99
    assert m.niche_measures(np.zeros_like(agent), agent, cell, 40, seed=0)["shuffled"] is None
    # Three worlds of 8 agents (2 of each population), each world's tiles its own: permuted within the worlds, the
    # groups keep the populations' share of every world, and without niches match them.
    world = np.repeat(np.arange(24) // 8, 15)
    worlds = m.niche_measures(population, agent, cell + 40 * world, 120, seed=0, world=world)
    assert abs(worlds["between"] - worlds["shuffled"]) < 0.05 and worlds["shuffled_p"] > 0.05
    per_world = m.shuffled_js(population, agent, cell + 40 * world, 120, seed=1, world=world, shuffles=3)
    assert per_world.shape == (3,)


@pytest.mark.timeout(240)  # the first use of the world compiles its kernels
def test_rollout_records_every_agent_tick_and_the_reports_show_the_measures(tmp_path, capsys):
    config = tiny_config()
    rollout = nmmo_rollout("random", config, copies=2, seed=3)
    # A cohort agent stands somewhere on each tick it lives, and where it spawned (one more while alive at the end).
    agents, visits = np.unique(rollout.visit_agent, return_counts=True)
    cohort = rollout.in_cohort(agents)
    order = np.argsort(agents[cohort] // AGENT_STRIDE * WORLD.num_agents + agents[cohort] % AGENT_STRIDE)
    assert cohort.sum() == rollout.lifetimes.size == 16 and rollout.alive_at_end == 0
    np.testing.assert_array_equal(visits[cohort][order], rollout.lifetimes)
    assert rollout.passable[rollout.visit_cell].all() and (rollout.visit_population == 0).all()
    assert set(rollout.attack_style.tolist()) <= {1, 2, 3} and np.isin(rollout.attack_agent, agents).all()
    explored = nmmo_exploration(rollout)
    assert 1 <= explored["tiles_per_life"] <= rollout.lifetimes.mean() and 0 < explored["coverage"] < 1
    niches = nmmo_niches(rollout, seed=0)
    assert niches["tiles"]["between"] is None and 0 < niches["tiles"]["split_half"] <= 1

    # Head to head: groups of slots in the same worlds, each played by its own player; a bot plays only its own.
    teams = head_to_head_teams(WORLD.num_agents, 1)
    assert teams.tolist() == [0, 1] * 4 and head_to_head_teams(8, 2).tolist() == [0, 1, 2, 2, 0, 1, 2, 2]
    mask = np.broadcast_to(teams == 1, (2, WORLD.num_agents))
    masked = MaskedActor(RandomBot(0), mask).act(config.env.make(num_envs=2).reset(0))
    assert all((chosen[~mask] == 0).all() for chosen in masked.values())
    mixed = nmmo_rollout(["random", "random"], config, copies=2, seed=3, teams=teams)
    assert mixed.lifetimes.size == 16 and set(mixed.population.tolist()) == {0, 1}
    assert set(mixed.visit_population.tolist()) == {0, 1}
    with pytest.raises(ValueError, match="3 players for 2 groups of slots"):
        nmmo_rollout(["random"] * 3, config, copies=1, seed=3, teams=teams)

    # A run of one version, then the two commands that report the measures (in this process: no second start-up).
    SerialRunner(tiny_config(tmp_path)).run()
    capsys.readouterr()
    assert script(ROOT / "jobs" / "evaluate.py").main([str(tmp_path / "tiny"), "--games", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    result = json.loads(lines[-1])
    for player in ("policy", "random"):
        low, high = result[f"{player}_tiles_per_life_ci95"]
        assert 1 <= low <= result[f"{player}_tiles_per_life"] <= high and 0 < result[f"{player}_coverage"] < 1
    # Head to head: the policy's agents and the random bot's, about half the first spawns each.
    assert result["head_to_head_policy_agents"] + result["head_to_head_random_agents"] == 16
    for player in ("policy", "random"):
        low, high = result[f"head_to_head_{player}_ci95"]
        assert 1 <= result[f"head_to_head_{player}_mean_lifetime"] and low <= high
    assert result["head_to_head_ratio"] == (result["head_to_head_policy_mean_lifetime"] /
                                            result["head_to_head_random_mean_lifetime"])
    for ratio in ("lifetime_ratio", "head_to_head_ratio"):  # the ratios' intervals (hpc_rl.stats.ratio_ci95)
        low, high = result[f"{ratio}_ci95"]
        assert 0 < low < result[ratio] < high
        assert f"{result[ratio]:.2f}x [{low:.2f}, {high:.2f}]" in lines[0]
    assert lines[1].startswith("exploration: policy ")
    behaviour = script(ROOT / "analysis" / "nmmo_behaviour.py")
    assert behaviour.run_script(behaviour.parser(), behaviour.body,
                                [str(tmp_path / "tiny"), "--games", "2", "--out", str(tmp_path / "plots")]) == 0
    table = (tmp_path / "plots" / "behaviour.md").read_text().splitlines()
    assert [row.split("|")[2].strip() for row in table[4:]] == ["policy v1", "random"]
    assert (tmp_path / "plots" / "visits.png").stat().st_size > 0
