"""PettingZoo parallel environments through the VecEnv API, checked against stepping the raw environment by hand,
and an MPE task trained through the distributed pipeline (env.name=pettingzoo:<module>)."""

from __future__ import annotations

import functools
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from gymnasium import spaces
from pettingzoo import ParallelEnv
from pettingzoo.test import parallel_api_test

from hpc_rl.envs.pettingzoo_adapter import PettingZooVecEnv, copy_seed
from hpc_rl.envs.scripted import RandomBot
from hpc_rl.launch import mpirun_command, rank_env
from hpc_rl.storage import open_run

ROOT = Path(__file__).resolve().parent.parent
GOAL = 6


class CoinRace(ParallelEnv):
    """Two players race their counters to GOAL: wait, +1, or +2 (legal only on an even counter, hence the mask)."""

    metadata = {"name": "coin_race_v0"}

    def __init__(self, max_cycles: int = 12):
        self.possible_agents = ["player_0", "player_1"]
        self.max_cycles = max_cycles

    @functools.lru_cache(maxsize=None)
    def observation_space(self, agent):
        return spaces.Dict({"observation": spaces.Box(0.0, 1.0, (2,), np.float32),
                            "action_mask": spaces.MultiBinary(3)})

    @functools.lru_cache(maxsize=None)
    def action_space(self, agent):
        return spaces.Discrete(3)

    def _obs(self):
        out = {}
        for i, agent in enumerate(self.agents):
            mask = np.array([1, 1, self.count[i] % 2 == 0], dtype=np.int8)
            own, other = self.count[i] / GOAL, self.count[1 - i] / GOAL
            out[agent] = {"observation": np.array([own, other], np.float32), "action_mask": mask}
        return out

    def reset(self, seed=None, options=None):
        rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self.count = rng.integers(0, 2, size=2)
        self.cycles = 0
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions):
        for i, agent in enumerate(self.agents):
            a = actions[agent]
            self.count[i] += 2 if (a == 2 and self.count[i] % 2 == 0) else (1 if a >= 1 else 0)
        self.cycles += 1
        done = [c >= GOAL for c in self.count]
        rewards = {a: 0.0 for a in self.agents}
        if done[0] != done[1]:
            winner = 0 if done[0] else 1
            rewards[self.agents[winner]], rewards[self.agents[1 - winner]] = 1.0, -1.0
        terminated = {a: any(done) for a in self.agents}
        truncated = {a: self.cycles >= self.max_cycles for a in self.agents}
        obs = self._obs()
        infos = {a: {} for a in self.agents}
        if any(done) or self.cycles >= self.max_cycles:
            self.agents = []
        return obs, rewards, terminated, truncated, infos


def test_the_test_environment_is_a_valid_pettingzoo_parallel_env():
    parallel_api_test(CoinRace(), num_cycles=50)


def test_spec_and_observations():
    venv = PettingZooVecEnv(CoinRace, 4, agent_team=(0, 1))
    assert venv.spec.num_agents == 2 and venv.spec.num_teams == 2 and venv.spec.num_actions == 3
    obs = venv.reset(0)
    venv.spec.check_obs(obs, 4)
    assert (obs["action_mask"][..., 2] == (obs["global"][..., 0] * GOAL % 2 == 0)).all()
    with pytest.raises(ValueError, match="action"):
        venv.step({"action": np.full((4, 2), 3)})


def test_adapter_matches_the_raw_environment_stepped_by_hand():
    n, seed = 3, 9
    venv = PettingZooVecEnv(CoinRace, n, agent_team=(0, 1))
    raw = [CoinRace() for _ in range(n)]
    games = [0] * n
    raw_obs = [r.reset(seed=copy_seed(seed, i, 0))[0] for i, r in enumerate(raw)]
    returns, lengths = np.zeros((n, 2)), np.zeros(n, dtype=int)
    obs = venv.reset(seed)
    bot = RandomBot(1)
    finished = 0
    for _ in range(60):
        for i in range(n):
            for j, agent in enumerate(raw[i].possible_agents):
                assert np.array_equal(obs["global"][i, j], raw_obs[i][agent]["observation"])
                assert np.array_equal(obs["action_mask"][i, j], raw_obs[i][agent]["action_mask"].astype(bool))
        acts = bot.act(obs)
        obs, rewards, dones, infos = venv.step(acts)
        for i, r in enumerate(raw):
            o, rew, term, trunc, _ = r.step({a: int(acts["action"][i, j]) for j, a in enumerate(r.possible_agents)})
            returns[i] += [rew[a] for a in r.possible_agents]
            lengths[i] += 1
            assert np.array_equal(rewards[i, :, 0], [rew[a] for a in r.possible_agents])
            assert dones[i] == (not r.agents)
            if dones[i]:
                expected = -1 if returns[i, 0] == returns[i, 1] else int(np.argmax(returns[i]))
                assert infos["winner"][i] == expected
                assert infos["episode_return"][i] == returns[i].mean() and infos["episode_length"][i] == lengths[i]
                finished += 1
                games[i] += 1
                returns[i], lengths[i] = 0.0, 0
                o = r.reset(seed=copy_seed(seed, i, games[i]))[0]
            raw_obs[i] = o
    assert finished >= 3 * n  # several games per copy, so the auto-reset was exercised


# MPE's simple_spread (mpe2): 3 agents, one shared policy; 25-step episodes, so every copy finishes one per version
# or so. Env ranks report their finished episodes in heartbeats, every 0.2 s here: a row of stats/episode_return
# needs one to reach the controller before a version's metrics.
SPREAD = ["env.name=pettingzoo:mpe2.simple_spread_v3", "topology=local_one_learner", "pipeline.allreduce=mpi",
          "env.num_envs=4", "pipeline.segment_len=32", "pipeline.segments_per_batch=2", "ppo.epochs=2",
          "ppo.num_minibatches=2", "pipeline.heartbeat_s=0.2", "pipeline.max_versions=6",
          "pipeline.final_eval_games=4"]


@pytest.mark.mpi
@pytest.mark.timeout(200)
def test_an_mpe_task_trains_through_the_pipeline_and_its_return_is_recorded(tmp_path):
    cmd = mpirun_command(5, [str(ROOT / "jobs/train.py"), "run_name=spread", f"runs_dir={tmp_path}", *SPREAD])
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=rank_env(), timeout=180)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "pettingzoo:mpe2.simple_spread_v3 training" in out.stdout and " return -" in out.stdout, out.stdout
    metrics = open_run(tmp_path / "spread").metrics
    # Every agent of every copy is a trained row: the batch is 2 segments of 32 steps x 4 copies x 3 agents.
    samples = metrics["perf/samples"]
    assert list(samples["version"]) == [1, 2, 3, 4, 5, 6] and np.all(samples["value"] == 2 * 32 * 4 * 3), samples
    returns = metrics["stats/episode_return"]["value"]  # per agent; a random policy's is about -27
    assert len(returns) >= 1 and np.all((returns < 0) & (returns > -200)), returns
    final = json.loads((tmp_path / "spread/summary.json").read_text())["final_eval"]
    assert final["episodes"] == 4 and -200 < final["mean_return"] < 0, final
