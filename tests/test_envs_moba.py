"""The rules of ``moba``: each test sets up a situation and asserts its outcome."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from hpc_rl.envs import moba, moba_config
from hpc_rl.envs.moba import HERO_STATS, HRESPAWN, HS_VISION, IALIVE, UHP, UMAXHP, UX, UY, MobaEnv
from hpc_rl.envs.moba_config import (A_ATTACK, A_NOOP, EV_DEATH, EV_GOLD, EV_HP, EV_KILL, EV_LAST_HIT, EV_LOSS, EV_MANA,
                                     EV_TOWER_HP, EV_WIN, EV_XP, REWARD_EVENTS, MobaConfig)
from hpc_rl.envs.scripted import RandomBot

pytestmark = pytest.mark.light  # runs in the base install tier (scripts/light_tier_check.sh)

QUIET = dict(creep_wave_period=100_000, randomize_lineup=False, lineup=("marksman", "warrior"),
             random_start_level=0, random_start_gold=0.0)


def noop(env: MobaEnv) -> dict[str, np.ndarray]:
    shape = (env.num_envs, env.spec.num_agents)
    return {"action": np.full(shape, A_NOOP), "move": np.zeros(shape, np.int64), "target": np.zeros(shape, np.int64)}


def place(env: MobaEnv, unit: int, x: float, y: float) -> None:
    env.uf[:, unit, UX] = x
    env.uf[:, unit, UY] = y


@pytest.mark.parametrize("config", [MobaConfig(), MobaConfig.five_v_five()], ids=["1v1", "5v5"])
def test_observations_follow_the_spec(config):
    env = MobaEnv(config, 3)
    spec = env.spec
    assert spec.num_agents == 2 * config.team_size
    assert spec.learning_agents == tuple(range(spec.num_agents))
    assert spec.agent_team == (0,) * config.team_size + (1,) * config.team_size
    assert [e.name for e in spec.entities] == ["heroes", "creeps", "towers", "bases"]
    spec.check_obs(env.reset(0), 3)
    obs, events, dones, infos = env.step(RandomBot(0).act(env.observe()))
    spec.check_obs(obs, 3)
    assert events.shape == (3, spec.num_agents, len(spec.reward_events)) and events.dtype == np.float32
    assert dones.shape == (3,) and infos["winner"].shape == (3,)
    # Every agent sees itself, its own base and towers from the first step; no enemy is in sight of the base.
    heroes = obs["entities/heroes/mask"]
    assert heroes[:, np.arange(spec.num_agents), np.arange(spec.num_agents)].all()
    assert not obs["target_mask"].any()


def test_reward_weights_default_to_honor_of_kings_table_6():
    w = dict(zip(REWARD_EVENTS, MobaConfig().reward_weight_vector()))
    assert w == pytest.approx({"hp": 2.0, "tower_hp": 10.0, "gold": 0.008, "mana": 0.8, "death": -1.0, "kill": -0.5,
                               "xp": 0.008, "last_hit": 0.5, "win": 5.0, "loss": -5.0})
    assert MobaConfig().time_limit == 9000  # 20 minutes at 7.5 decisions per second


def test_every_reward_event_has_the_named_column_of_its_index():
    named = {name[3:].lower(): getattr(moba_config, name) for name in vars(moba_config) if name.startswith("EV_")}
    assert named == {event: k for k, event in enumerate(REWARD_EVENTS)}


def test_the_config_imports_without_numba_or_torch():
    code = ("import sys, hpc_rl.envs.moba_config; "
            "print(sorted(m for m in ('numba', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_kernels_compiled_with_other_shared_constants_are_refused(monkeypatch):
    compiled = moba._compiled_shared_constants()  # compiled (or loaded from the cache) with the true values first
    monkeypatch.setattr(moba, "_SHARED_CONSTANTS", compiled[1:] + compiled[:1])  # as after an edit of moba_config
    with pytest.raises(RuntimeError, match="moba_config.py"):
        MobaEnv(MobaConfig(), 1)


@pytest.mark.parametrize("bad, field", [(dict(lanes=2), "lanes"), (dict(team_size=0), "team_size"),
                                        (dict(hero_pool=("wizard",)), "hero_pool"),
                                        (dict(lineup=("mage",)), "lineup"),
                                        (dict(reward_weights={"hp": 1.0}), "reward_weights"),
                                        (dict(time_limit=0), "time_limit")])
def test_bad_config_is_refused_naming_the_field(bad, field):
    with pytest.raises(ValueError, match=field):
        MobaConfig(**bad)


def test_bad_actions_are_refused_naming_the_head():
    env = MobaEnv(MobaConfig(), 2)
    env.reset(0)
    acts = noop(env)
    acts["target"][0, 0] = 10_000
    with pytest.raises(ValueError, match="target"):
        env.step(acts)
    with pytest.raises(ValueError, match="move"):
        env.step({"action": acts["action"], "target": acts["action"]})


def test_undisturbed_creep_wave_reaches_and_damages_the_enemy_tower():
    config = MobaConfig(randomize_lineup=False, random_start_level=0, random_start_gold=0.0)
    env = MobaEnv(config, 2)
    env.reset(0)
    enemy_creeps = list(env.creep_slots)[len(env.creep_slots) // 2:]
    outer_enemy_tower = env.tower_slots[len(env.tower_slots) // 2]
    hit_at = None
    for t in range(1, 400):
        env.uf[:, enemy_creeps, UHP] = 0.0  # no enemy wave: ours walks the lane alone
        env.ui[:, enemy_creeps, IALIVE] = 0
        _, events, _, _ = env.step(noop(env))
        if (env.uf[:, outer_enemy_tower, UHP] < env.uf[:, outer_enemy_tower, UMAXHP]).all():
            hit_at = t
            break
    assert hit_at is not None, "the wave never damaged the enemy's outer tower"
    # It took the creeps' march (about 25 map units at 0.32 per step), not a hero: heroes stayed at their fountain.
    assert hit_at > 60
    assert np.allclose(env.uf[:, env.hero_slots, UX], env.layout.hero_spawn[:, 0])
    assert (events[:, 1, EV_TOWER_HP] <= 0).all()


def test_tower_kills_a_lone_hero_standing_in_its_range():
    env = MobaEnv(MobaConfig(**QUIET), 2)
    env.reset(0)
    tower = env.tower_slots[len(env.tower_slots) // 2]  # team 1's outer tower
    tx, ty = env.uf[0, tower, UX], env.uf[0, tower, UY]
    hp0 = env.uf[0, 0, UHP]
    died_at = None
    for t in range(1, 300):
        if t == 1:
            place(env, 0, tx - 4.0, ty - 3.0)  # 5 units away, inside its range of 7
        _, events, _, _ = env.step(noop(env))
        if events[0, 0, EV_DEATH] == 1.0:
            died_at = t
            break
    assert died_at is not None, "the tower did not kill the hero"
    assert env.ui[0, 0, IALIVE] == 0
    # 470 hp at 70 damage per 7 steps: 7 shots, the first at step 1.
    assert died_at == 1 + 7 * (int(np.ceil(hp0 / 70.0)) - 1)
    assert events[0, 0, EV_KILL] == 0 and events[0, 1, EV_KILL] == 0  # a tower's kill credits no hero


def _enemy_in_sight(env: MobaEnv, dx: float) -> tuple[np.ndarray, dict]:
    """Put hero 1 at distance ``dx`` east of hero 0 in mid-map, step once with noops, return (obs, events)."""
    place(env, 0, 20.0, 40.0)
    place(env, 1, 20.0 + dx, 40.0)
    obs, events, _, _ = env.step(noop(env))
    return obs, events


def test_fog_hides_units_beyond_vision():
    env = MobaEnv(MobaConfig(**QUIET), 1)
    env.reset(0)
    vision = HERO_STATS[1, HS_VISION]  # hero 0 is a marksman, hero 1 a warrior
    far, _ = _enemy_in_sight(env, vision + 1.0)
    assert not far["entities/heroes/mask"][0, 0, 1]
    assert not far["entities/heroes"][0, 0, 1].any()  # no trace of the hidden unit in its slot
    assert far["entities/heroes/mask"][0, 1, 0] == (vision + 1.0 <= HERO_STATS[0, HS_VISION])
    near, _ = _enemy_in_sight(env, vision - 1.0)
    assert near["entities/heroes/mask"][0, 0, 1]
    assert near["entities/heroes"][0, 0, 1, 2] == 1.0  # is_enemy
    assert near["entities/heroes"][0, 0, 1, 7] == pytest.approx((vision - 1.0) / 64.0)  # dist / map_size


def test_masks_forbid_invisible_dead_and_out_of_range_targets():
    env = MobaEnv(MobaConfig(target_range=5.0, **QUIET), 1)
    env.reset(0)
    obs, _ = _enemy_in_sight(env, 4.0)
    assert obs["target_mask"][0, 0, 1] and obs["action_mask"][0, 0, A_ATTACK]
    obs, _ = _enemy_in_sight(env, 7.0)  # seen (vision 10) but beyond target_range
    assert obs["entities/heroes/mask"][0, 0, 1] and not obs["target_mask"][0, 0, 1]
    assert not obs["action_mask"][0, 0, A_ATTACK]
    obs, _ = _enemy_in_sight(env, 12.0)  # invisible
    assert not obs["entities/heroes/mask"][0, 0, 1] and not obs["target_mask"][0, 0, 1]
    # An attack on the invisible hero is ignored: no damage, no approach.
    acts = noop(env)
    acts["action"][0, 0], acts["target"][0, 0] = A_ATTACK, 1
    x0, hp1 = env.uf[0, 0, UX], env.uf[0, 1, UHP]
    env.step(acts)
    assert env.uf[0, 0, UX] == x0 and env.uf[0, 1, UHP] == hp1
    # Dead: in range and in sight, but dead.
    obs, _ = _enemy_in_sight(env, 3.0)
    assert obs["target_mask"][0, 0, 1]
    env.ui[0, 1, IALIVE] = 0
    env.hf[0, 1, HRESPAWN] = 50.0  # so it stays dead through the step
    obs, _ = env.step(noop(env))[:2]
    assert not obs["target_mask"][0, 0, 1] and not obs["entities/heroes/mask"][0, 0, 1]
    assert not obs["action_mask"][0, 1, 1:].any()  # a dead hero may only noop
    # The inner tower is invulnerable, hence no target, while the outer one stands.
    inner = env.tower_slots[len(env.tower_slots) // 2 + 1]
    place(env, 0, env.uf[0, inner, UX] - 2.0, env.uf[0, inner, UY])
    obs = env.step(noop(env))[0]
    assert obs["entities/towers/mask"][0, 0, inner - env.tower_slots.start]
    assert not obs["target_mask"][0, 0, inner]
    assert obs["entities/towers"][0, 0, inner - env.tower_slots.start, 9] == 1.0


def test_last_hit_gives_gold_and_a_last_hit_event():
    env = MobaEnv(MobaConfig(**{**QUIET, "creep_wave_period": 225}), 1)
    env.reset(0)
    env.step(noop(env))  # the first wave spawns
    creep = env.creep_slots[0]  # a melee creep of team 0
    assert env.ui[0, creep, IALIVE] == 1
    place(env, 1, env.uf[0, creep, UX] + 1.0, env.uf[0, creep, UY])  # hero 1 (warrior, range 1.6) beside it
    env.uf[0, creep, UHP] = 5.0
    acts = noop(env)
    acts["action"][0, 1], acts["target"][0, 1] = A_ATTACK, creep
    obs = env.step(noop(env))[0]
    assert obs["target_mask"][0, 1, creep]
    _, events, _, _ = env.step(acts)
    assert env.ui[0, creep, IALIVE] == 0
    assert events[0, 1, EV_LAST_HIT] == 1.0 and events[0, 1, EV_GOLD] == 22.0
    assert events[0, 0, EV_LAST_HIT] == 0.0


def test_time_limit_is_a_draw_and_the_copy_restarts():
    env = MobaEnv(MobaConfig(time_limit=50), 2)
    env.reset(5)
    for t in range(1, 51):
        obs, events, dones, infos = env.step(noop(env))
        assert dones.all() == (t == 50)
    assert (infos["winner"] == -1).all() and (infos["episode_length"] == 50).all()
    assert not events[..., EV_WIN].any() and not events[..., EV_LOSS].any()
    assert (obs["global"][..., 0] == 0.0).all()  # the observation is the first of the next game
    assert (env.gi[:, 1] == 1).all()  # game index


def test_destroying_the_base_wins():
    env = MobaEnv(MobaConfig(**QUIET), 1)
    env.reset(0)
    env.ui[0, list(env.tower_slots)[len(env.tower_slots) // 2:], IALIVE] = 0  # team 1 has lost its towers
    base = env.base_slots[1]
    place(env, 0, env.uf[0, base, UX] - 3.0, env.uf[0, base, UY])
    env.uf[0, base, UHP] = 10.0
    obs = env.step(noop(env))[0]
    assert obs["target_mask"][0, 0, base]
    acts = noop(env)
    acts["action"][0, 0], acts["target"][0, 0] = A_ATTACK, base
    _, events, dones, infos = env.step(acts)
    assert dones[0] and infos["winner"][0] == 0
    assert events[0, 0, EV_WIN] == 1.0 and events[0, 1, EV_LOSS] == 1.0
    assert events[0, 0, EV_LAST_HIT] == 1.0


def test_a_hero_kill_writes_each_event_into_its_named_column():
    env = MobaEnv(MobaConfig(**QUIET), 1)  # hero 0: marksman (range 6, 48 damage), hero 1: warrior, both level 1
    env.reset(0)
    _enemy_in_sight(env, 3.0)
    env.uf[0, 1, UHP] = 10.0
    hp1 = 10.0 / env.uf[0, 1, UMAXHP]
    acts = noop(env)
    acts["action"][0, 0], acts["target"][0, 0] = A_ATTACK, 1
    _, events, _, _ = env.step(acts)
    expected = np.zeros((2, len(REWARD_EVENTS)))
    expected[0, EV_KILL] = 1.0
    expected[0, EV_GOLD] = 120.0 + 10.0 * 1  # HERO_GOLD + HERO_GOLD_LVL * the victim's level
    expected[0, EV_XP] = 70.0 + 25.0 * 1  # HERO_XP + HERO_XP_LVL * level, all of it to the only enemy near
    expected[1, EV_DEATH] = 1.0
    expected[1, EV_HP] = -hp1  # the drop to 0
    expected[1, EV_MANA] = -1.0  # from full mana to 0
    assert events[0] == pytest.approx(expected)


def _play(env: MobaEnv, seed: int, steps: int, actions: list[dict]) -> list:
    trace = [env.reset(seed)]
    for acts in actions[:steps]:
        obs, events, dones, infos = env.step(acts)
        trace.append((obs, events, dones, infos["winner"]))
    return trace


def _random_actions(config: MobaConfig, num_envs: int, steps: int, seed: int) -> list[dict]:
    """Legal random actions recorded from one game, replayed in others (illegal ones are ignored by the env)."""
    env = MobaEnv(config, num_envs)
    bot = RandomBot(seed)
    obs = env.reset(seed)
    out = []
    for _ in range(steps):
        acts = bot.act(obs)
        out.append(acts)
        obs = env.step(acts)[0]
    return out


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    if isinstance(a, tuple):
        return all(_same(x, y) for x, y in zip(a, b))
    return np.array_equal(a, b)


def test_same_seed_same_game():
    config = MobaConfig(time_limit=150)
    actions = _random_actions(config, 3, 300, seed=11)
    first = _play(MobaEnv(config, 3), 7, 300, actions)
    second = _play(MobaEnv(config, 3), 7, 300, actions)
    assert all(_same(x, y) for x, y in zip(first, second))
    other = _play(MobaEnv(config, 3), 8, 1, actions)
    assert not _same(first[0], other[0])  # another seed draws other lineups


def test_copies_stepped_together_equal_copies_stepped_one_by_one():
    config = MobaConfig(time_limit=120, creep_wave_period=40)
    n, steps = 4, 260  # two auto-resets per copy
    actions = _random_actions(config, n, steps, seed=3)
    together = _play(MobaEnv(config, n), 21, steps, actions)
    for i in range(n):
        alone = _play(MobaEnv(config, 1, first_copy=i), 21, steps,
                      [{k: v[i:i + 1] for k, v in a.items()} for a in actions])
        assert _same({k: v[i:i + 1] for k, v in together[0].items()}, alone[0])
        for (obs, ev, done, win), (obs1, ev1, done1, win1) in zip(together[1:], alone[1:]):
            assert _same({k: v[i:i + 1] for k, v in obs.items()}, obs1)
            assert np.array_equal(ev[i:i + 1], ev1) and done[i] == done1[0] and win[i] == win1[0]
    assert sum(int(t[2].sum()) for t in together[1:]) == 2 * n


def test_assassin_dash_damages_and_stuns_its_target():
    env = MobaEnv(MobaConfig(**{**QUIET, "lineup": ("assassin", "mage")}), 1)
    env.reset(0)
    obs, _ = _enemy_in_sight(env, 5.0)  # within the dash range of 6
    assert obs["action_mask"][0, 0, 3] and obs["target_mask"][0, 0, 1]
    hp1 = env.uf[0, 1, UHP]
    acts = noop(env)
    acts["action"][0, 0], acts["target"][0, 0] = 3, 1
    obs, events, _, _ = env.step(acts)
    assert env.uf[0, 1, UHP] == pytest.approx(hp1 - 90.0 + 0.08)  # skill damage at level 1, then hp regeneration
    gap = np.hypot(env.uf[0, 0, UX] - env.uf[0, 1, UX], env.uf[0, 0, UY] - env.uf[0, 1, UY])
    assert gap == pytest.approx(1.0)  # dashed beside the target
    assert obs["global"][0, 1, 10] == 1.0 and obs["action_mask"][0, 1].tolist() == [True, False, False, False]
    assert not obs["action_mask"][0, 0, 3]  # the skill is on cooldown
    assert events[0, 1, EV_HP] == pytest.approx((-90.0 + 0.08) / env.uf[0, 1, UMAXHP])
    for _ in range(7):  # the stun lasts 8 steps
        obs = env.step(noop(env))[0]
    assert not obs["action_mask"][0, 1, 1]
    obs = env.step(noop(env))[0]
    assert obs["action_mask"][0, 1, 1]
