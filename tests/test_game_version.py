"""Game version 2 of the MOBA (hpc_rl.envs.moba_v2): version 1 untouched, the new hero attribute and the heal action,
the share of games played under the new rules, the configuration that selects them; and a run moved to version 2 by
jobs/surgery.py, then resumed under mpirun with old and new games mixed at a rising share."""

import dataclasses
import importlib.util
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from hpc_rl import metric_names as M
from hpc_rl.algo.config import PPOConfig
from hpc_rl.algo.schedules import Schedule
from hpc_rl.config import EnvConfig, LeagueConfig, PipelineConfig, TrainConfig, build_config
from hpc_rl.envs.moba import GGAME, UHP, UMAXHP, UPERIOD, UTIMER, MobaEnv
from hpc_rl.envs.moba_config import A_NOOP, EV_HP, HERO_FEATURES, MobaConfig
from hpc_rl.envs.moba_v2 import A_HEAL, HEAL_COOLDOWN, HEAL_FRACTION, MobaV2Env, game_draw, spec_v2
from hpc_rl.envs.scripted import make_bot
from hpc_rl.launch import mpirun_command, rank_env
from hpc_rl.model.config import ModelConfig
from hpc_rl.model.policy import Policy
from hpc_rl.model.surgery import NEW_ACTION_TOLERANCE, new_action_offset
from hpc_rl.runner import SerialRunner
from hpc_rl.storage import open_run, write_pool
from test_surgery import surgery_job

ROOT = Path(__file__).resolve().parent.parent
SHORT = MobaConfig(time_limit=40)  # short games: many start within a few hundred steps


def load_job(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "jobs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def scripted_steps(env, steps: int, seed: int = 0):
    """The scripted bot playing both sides of every copy: each step's observation, events, dones."""
    bot = make_bot("scripted", env.config)
    obs = env.reset(seed)
    for _ in range(steps):
        actions = bot.act(obs)
        obs, events, dones, _ = env.step(actions)
        yield obs, events, dones


def test_version_1_games_in_version_2_layout_are_version_1():
    """Version 1 is the game of moba.py; version 2's layout at share 0 plays it bit for bit, with the new attribute
    held at 0 and heal never legal."""
    assert type(EnvConfig().make(num_envs=1)) is MobaEnv and EnvConfig().make(num_envs=1).spec == MobaConfig().spec()
    old, new = MobaEnv(SHORT, 2), MobaV2Env(SHORT, 2, new_version_share=0.0)
    assert new.spec == spec_v2(SHORT) and new.spec.num_actions == 5 and new.spec.entities[0].num_features == 20
    for (o1, e1, d1), (o2, e2, d2) in zip(scripted_steps(old, 90), scripted_steps(new, 90)):
        for key in o1:
            if key not in ("entities/heroes", "action_mask"):
                assert np.array_equal(o1[key], o2[key]), key
        assert np.array_equal(o1["entities/heroes"], o2["entities/heroes"][..., :HERO_FEATURES])
        assert not o2["entities/heroes"][..., HERO_FEATURES].any() and not o2["action_mask"][..., A_HEAL].any()
        assert np.array_equal(o1["action_mask"], o2["action_mask"][..., :A_HEAL])
        assert np.array_equal(e1, e2) and np.array_equal(d1, d2)


def test_the_attack_timer_is_the_state_s_and_heal_restores_hp_on_a_cooldown():
    env = MobaV2Env(MobaConfig(map_size=24.0, time_limit=400), 2)
    ran = False
    for obs, _, _ in scripted_steps(env, 150):
        timer = np.maximum(env.uf[:, :2, UTIMER], 0.0) / env.uf[:, :2, UPERIOD]  # (copies, heroes)
        seen = obs["entities/heroes/mask"]
        expected = np.where(seen, timer[:, None, :], 0.0).astype(np.float32)
        assert np.array_equal(obs["entities/heroes"][..., HERO_FEATURES], expected)
        assert obs["entities/heroes"][..., HERO_FEATURES].max() <= 1.0
        ran |= bool((obs["entities/heroes"][..., HERO_FEATURES] > 0).any())
    assert ran  # the heroes attacked: the timers ran

    env, same = MobaV2Env(MobaConfig(), 1), MobaV2Env(MobaConfig(), 1)
    noop = {head: np.zeros((1, 2), np.int64) for head in ("action", "move", "target")}
    for e in (env, same):
        e.reset(7)
    top = env.uf[0, 0, UMAXHP]
    assert not env.observe()["action_mask"][0, :, A_HEAL].any()  # unhurt: nothing to heal
    for e in (env, same):
        e.uf[0, 0, UHP] = 0.4 * top
    assert env.observe()["action_mask"][0, :, A_HEAL].tolist() == [True, False]
    heal = {**noop, "action": np.array([[A_HEAL, A_HEAL]])}  # hero 1's heal is illegal (unhurt): a noop
    obs, events, _, _ = env.step(heal)
    _, idle, _, _ = same.step(noop)
    assert env.uf[0, 0, UHP] - same.uf[0, 0, UHP] == pytest.approx(HEAL_FRACTION * top)
    assert events[0, 0, EV_HP] - idle[0, 0, EV_HP] == pytest.approx(HEAL_FRACTION, abs=1e-6)
    assert np.array_equal(env.uf[0, 1:], same.uf[0, 1:]) and np.array_equal(events[0, 1], idle[0, 1])
    assert env.heal_cooldown[0].tolist() == [HEAL_COOLDOWN - 1, 0]
    for _ in range(HEAL_COOLDOWN - 1):
        assert not obs["action_mask"][0, 0, A_HEAL]
        env.uf[0, 0, UHP] = 0.4 * top  # still hurt
        obs, _, _, _ = env.step(noop)
    env.uf[0, 0, UHP] = 0.4 * top
    assert env.observe()["action_mask"][0, 0, A_HEAL]  # the cooldown is over
    with pytest.raises(ValueError, match=r"must lie in \[0, 5\)"):
        env.step({**noop, "action": np.array([[5, 0]])})


def test_the_share_of_version_2_games():
    """Each game draws its version as it starts, from its copy's seed and game index: the share of version 2 games
    is the set share, a copy draws alike alone or among others, and a higher share keeps the games a lower one had."""
    copies, games = 48, 4
    played = {}
    for share in (0.3, 0.6):
        env = MobaV2Env(MobaConfig(time_limit=5), copies, new_version_share=share)
        versions = []
        env.reset(11)
        versions.append(env.new_version.copy())
        idle = {head: np.zeros((copies, 2), np.int64) for head in ("action", "move", "target")}
        for step in range(5 * (games - 1)):
            obs, _, dones, _ = env.step(idle)
            if dones.any():
                assert dones.all() and np.array_equal(env.gi[:, GGAME], np.full(copies, len(versions)))
                versions.append(env.new_version.copy())
                # Version 1 games show it: the attribute 0, heal never legal.
                old = ~env.new_version
                assert not obs["entities/heroes"][old][..., HERO_FEATURES].any()
                assert not obs["action_mask"][old][..., A_HEAL].any()
        played[share] = np.array(versions)
        draws = np.array([[game_draw(env.seeds[e], g) for e in range(copies)] for g in range(games)])
        assert np.array_equal(played[share], draws < share)
        # Binomial: 192 games, 4 standard deviations
        assert abs(played[share].mean() - share) < 4 * np.sqrt(share * (1 - share) / played[share].size)
    assert np.all(played[0.6] | ~played[0.3])  # rising: every version 2 game at 0.3 is one at 0.6
    alone = MobaV2Env(MobaConfig(time_limit=5), 1, first_copy=17, new_version_share=0.6)
    alone.reset(11)
    assert alone.new_version[0] == played[0.6][0, 17]
    with pytest.raises(ValueError, match="share"):
        alone.set_new_version_share(1.5)


def test_heal_use_counts_the_policy_s_heals():
    """jobs/heal_use.py's tally: a policy that heals whenever it may heals on every step where heal is legal (a small
    map, where the scripted bot hurts the hero within a few hundred steps); a version 1 run is refused."""
    torch.set_num_threads(1)
    config = TrainConfig(env=EnvConfig(game_version=2, moba=MobaConfig(time_limit=300, map_size=24)),
                         model=ModelConfig(lstm_size=16, embed_size=8))
    torch.manual_seed(0)
    policy = Policy(spec_v2(config.env.moba), config.model).eval()
    with torch.no_grad():
        policy.action_head.bias[A_HEAL] = 50.0
    heal_use = load_job("heal_use").heal_use
    got = heal_use(policy, config, 4, 1)
    assert got["heals"] > 0 and got["hero_steps"] == 4 * 300  # draws: every game ran to the time limit
    assert got["heal_share_when_legal"] == 1.0 and got["actions_when_legal"]["heal"] == 1.0
    assert got["heal_share"] == got["heal_legal_share"] == got["heals"] / got["hero_steps"]
    assert got["wins"] + got["draws"] <= 4 and got["heals_per_game"] == got["heals"] / 4
    with pytest.raises(ValueError, match="game version 2"):
        heal_use(policy, dataclasses.replace(config, env=EnvConfig()), 4, 1)


def test_the_settings_of_game_versions():
    rising = Schedule(0.0, 1.0, 10, "linear")
    env = EnvConfig(game_version=2, new_version_share=rising, num_envs=2)
    assert env.share_moves_until() == 10 and EnvConfig(game_version=2).share_moves_until() == 0
    assert env.make(version=4).new_version_share == 0.4 and env.make().new_version_share == 1.0  # evaluations: all 2
    assert isinstance(env.make(version=4), MobaV2Env)
    since = EnvConfig(game_version=2, new_version_share=rising, new_version_since=100)  # counted from a surgery
    assert [since.new_version_share_at(v) for v in (0, 100, 104, 110, 500)] == [0.0, 0.0, 0.4, 1.0, 1.0]
    assert since.share_moves_until() == 110
    cfg = build_config({"env": {"game_version": 2, "new_version_share": {"start": 0.2, "end": 1.0, "versions": 50,
                                                                         "kind": "linear"}}})
    assert cfg.env.new_version_share(25) == pytest.approx(0.6)
    for bad, says in (({"game_version": 3}, "env.game_version must be one of"),
                      ({"game_version": 2, "name": "gym:CartPole-v1"}, "env.game_version"),
                      ({"new_version_share": 0.5}, "needs env.game_version=2"),
                      ({"game_version": 2, "new_version_share": {"start": 0.0, "end": 2.0, "versions": 5,
                                                                 "kind": "linear"}}, "stay in"),
                      ({"game_version": 2, "new_version_since": -1}, "new_version_since must be >= 0")):
        with pytest.raises(ValueError, match=says):
            build_config({"env": bad})


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_run_moves_to_version_2_by_surgery_and_trains_on_both_versions(tmp_path, capsys):
    """A version 1 run (the serial runner; a past version in its pool), moved to version 2 by jobs/surgery.py, then
    resumed under mpirun with the printed overrides and the share of version 2 games rising from 1/2 at the
    surgery's version (2, where the share's schedule starts) to 1 at version 4: every rank plays version 2's layout,
    the pool's past version plays, the env rank takes each version's share, and both versions are played."""
    torch.set_num_threads(1)
    source = TrainConfig(run_name="v1", runs_dir=str(tmp_path), seed=3,
                         env=EnvConfig(num_envs=4, vs_scripted_fraction=0.5, moba=MobaConfig(time_limit=12)),
                         model=ModelConfig(core="lstm", lstm_size=16, embed_size=8),
                         ppo=PPOConfig(epochs=1, num_minibatches=2), league=LeagueConfig(past_fraction=0.5),
                         pipeline=PipelineConfig(segment_len=16, segments_per_batch=1, max_versions=2,
                                                 checkpoint_every=1, keep_every=1, final_eval_games=0))
    SerialRunner(source).run()
    write_pool(tmp_path / "v1" / "pool.h5", [1], [0.5], eta=0.01, latest_fraction=0.5)
    out = tmp_path / "v2"
    assert surgery_job().main([str(tmp_path / "v1"), "--out", str(out), "env.game_version=2",
                               "--warmup-versions", "1"]) == 0
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert report["surgery_from"]["changes"] == {"env.game_version": 2}
    assert report["surgery_from"]["past_versions"] == [1]
    new = build_config(open_run(out).config)
    assert (new.env.game_version, new.env.new_version_since) == (2, 2) and "env.game_version=2" in report["resume"]
    spec = spec_v2(new.env.moba)
    for version in (1, 2):  # the latest checkpoint and the pool's past version, both for version 2's spaces
        params = open_run(out).load_checkpoint(version).sections["params"]
        assert params["entity_nets.0.0.weight"].shape[1] == spec.entities[0].num_features
        assert params["action_head.bias"].shape == (spec.num_actions,)
        offset = params["action_head.bias"][A_HEAL] - params["action_head.bias"][A_NOOP]  # heal: noop's, within τ
        assert offset == pytest.approx(new_action_offset(NEW_ACTION_TOLERANCE), abs=1e-5)
    assert report["surgery_from"]["new_action_tolerance"] == NEW_ACTION_TOLERANCE

    mixing = ["env.new_version_share.kind=linear", "env.new_version_share.start=0.5", "env.new_version_share.end=1",
              "env.new_version_share.versions=2",
              # Six versions at a share of 1 after the schedule's end: every scripted copy ends games (12 steps
              # each) under version 2 then, where five versions' ~50 steps a copy could all end under version 1.
              "pipeline.max_versions=10",
              "transport.backend=auto",  # the source's serial runner used the in-process transport
              # Env ranks report their steps (and so the share of version 2 played) every heartbeat: the default
              # second is longer than these versions last on a quiet machine, where no report falls between two.
              "pipeline.heartbeat_s=0.05"]
    ranks = 1 + sum(getattr(new.topology, role) for role in ("env", "inference", "learner", "evaluator"))
    cmd = mpirun_command(ranks, [str(ROOT / "jobs/train.py"), *report["resume"], *mixing])  # the serial runner's 4
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=rank_env(), timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = open_run(out)
    assert run.load_checkpoint().version == 10
    assert "env.new_version_share" in {c["key"] for c in run.config_changes}  # the surgery's config, mixed
    m = run.metrics
    target = dict(zip(m[M.NEW_VERSION_SHARE_TARGET]["version"], m[M.NEW_VERSION_SHARE_TARGET]["value"]))
    assert target == pytest.approx({3: 0.75, **{v: 1.0 for v in range(4, 11)}})
    # The env rank started at version 2's share and took each next one from the controller, up to the schedule's end.
    env_log = (out / "logs" / "rank_1.log").read_text()
    assert "version 4: games start under game version 2 with probability 1.000" in env_log, env_log
    assert "version 5: games start" not in env_log
    played = m[M.NEW_VERSION_SHARE]["value"]  # copy-steps under version 2's rules, per version the env reported in
    # Both versions were played in the first games, which drew at 1/2 (seeded: the same draws in every run).
    assert 0.0 < played[0] < 1.0 and np.all((0.0 <= played) & (played <= 1.0))
    assert m[M.GAMES_VS_SCRIPTED_NEW_VERSION]["value"].max() > 0
    assert m[M.GAMES_VS_PAST]["value"].sum() > 0  # the transformed past version played
    lr = dict(zip(m[M.LR]["version"], m[M.LR]["value"]))
    assert lr[3] == 0.0 and lr[4] > 0  # the surgery's warm-up version
