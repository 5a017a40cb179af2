"""The rules of ``nmmo``: each test sets up a situation in the state arrays and asserts its outcome."""

from __future__ import annotations

import numpy as np
import pytest

from hpc_rl.envs.nmmo import (GALIVE, IALIVE, IFOOD, IFREEZE, IHP, IIMMUNE, IWATER, IX, IY, LEVEL, XP_TABLE, NmmoEnv)
from hpc_rl.envs.nmmo_bots import Forager
from hpc_rl.envs.nmmo_config import (CROP_CHANNELS, CROP_MATERIALS, EV_ALIVE, EV_DEATH, EV_FOOD, EV_WATER, FOREST,
                                     GRASS, LAVA,
                                     MATERIALS, S_MAGE, S_MELEE, S_NONE, S_RANGE, SCRUB, SELF_FEATURES,
                                     SK_DEFENSE, STONE, WATER, NmmoConfig)

pytestmark = pytest.mark.light  # runs in the base install tier (scripts/light_tier_check.sh)

SMALL = dict(map_size=24, border=2)


def heads(env: NmmoEnv, action=S_NONE, move=0, target=0) -> dict[str, np.ndarray]:
    shape = (env.num_envs, env.spec.num_agents)
    return {"action": np.full(shape, action, np.int64), "move": np.full(shape, move, np.int64),
            "target": np.full(shape, target, np.int64)}


def clear_world(env: NmmoEnv, material: int = GRASS) -> None:
    """Every playable tile of every copy ``material``, every slot empty."""
    b, S = env.config.border, env.config.map_size
    env.tiles[:, b:S - b, b:S - b] = material
    env.ai[:, :, IALIVE] = 0
    env.gi[:, GALIVE] = 0


def put(env: NmmoEnv, slot: int, y: int, x: int, immune: int = 0) -> None:
    """A living agent in ``slot`` of every copy at (y, x), with the state a spawn gives."""
    env.ai[:, slot, :] = 0
    start = env.config.start_resources
    env.ai[:, slot, IALIVE] = 1
    env.ai[:, slot, IY], env.ai[:, slot, IX] = y, x
    env.ai[:, slot, IHP] = env.ai[:, slot, IFOOD] = env.ai[:, slot, IWATER] = start
    env.ai[:, slot, IFREEZE] = 0
    env.ai[:, slot, IIMMUNE] = immune
    env.ai[:, slot, LEVEL:] = (start, 1, 1, 1, 1, start, start)
    env.xp[:, slot, :] = XP_TABLE[env.ai[0, slot, LEVEL:]]
    env.gi[:, GALIVE] = env.ai[:, :, IALIVE].sum(axis=1)


def crop(obs, config: NmmoConfig) -> np.ndarray:
    side = config.crop_side
    return obs["global"][..., SELF_FEATURES:].reshape(obs["global"].shape[:2] + (side, side, CROP_CHANNELS))


def test_observations_follow_the_spec_and_the_world_goes_on():
    config = NmmoConfig(num_agents=16)
    env = NmmoEnv(config, 3)
    spec = env.spec
    assert [e.name for e in spec.entities] == ["agents"] and spec.num_targets == config.max_seen
    assert spec.global_features == SELF_FEATURES + 15 * 15 * CROP_CHANNELS  # the paper's 15x15 crop
    assert spec.action_uses_move == (True,) * 4 and spec.action_uses_target == (False, True, True, True)
    obs = env.reset(0)
    spec.check_obs(obs, 3)
    assert env.alive.sum(axis=1).tolist() == [1, 1, 1]  # the first agent; the others spawn one per tick
    bot = Forager(config, 0)
    resources = np.zeros((3, 16, 2))  # the food and water events summed over each agent's life so far
    lives = []
    for _ in range(60):
        obs, events, dones, infos = env.step(bot.act(obs))
        spec.check_obs(obs, 3)
        assert not dones.any() and infos["agent_done"].shape == (3, 16) and infos["winner"].shape == (3,)
        # The reward events: death where an agent's episode ended, alive for every living agent.
        np.testing.assert_array_equal(events[..., EV_DEATH] == 1, infos["agent_done"])
        assert (env.alive[events[..., EV_ALIVE] == 1]).all() and (events[..., :EV_FOOD].sum(axis=-1) <= 1).all()
        assert events[..., EV_ALIVE].sum() >= env.alive.sum() - 3  # all but this tick's spawns
        assert (infos["lifetime"][infos["agent_done"]] > 0).all()
        # Food and water: the change of food (water) / maximum, which is 0 once dead, so a life sums to -1.
        resources += events[..., [EV_FOOD, EV_WATER]]
        lives += resources[infos["agent_done"]].tolist()
        resources[infos["agent_done"]] = 0
    assert len(lives) > 3 and np.allclose(lives, -1.0, atol=1e-5)
    # Empty slots observe zeros and may only stay and not attack.
    empty = ~env.alive
    assert (obs["global"][empty] == 0).all() and not obs["target_mask"][empty].any()
    assert (obs["action_mask"][empty] == [True, False, False, False]).all()
    assert (obs["move_mask"][empty] == [True, False, False, False, False]).all()


def test_an_agent_starves_without_food_and_water_and_later_with_water_alone():
    config = NmmoConfig(num_agents=1, **SMALL)
    env = NmmoEnv(config, 2)
    env.reset(0)
    clear_world(env)
    put(env, 0, 10, 10, immune=100)
    env.tiles[1, 10, 11] = WATER  # copy 1 drinks every tick
    first_death = {}
    for tick in range(1, 31):
        _, events, _, infos = env.step(heads(env))
        for e in np.flatnonzero(infos["agent_done"][:, 0]):
            first_death.setdefault(int(e), (tick, int(infos["lifetime"][e, 0]), float(events[e, 0, EV_DEATH])))
    # 10 food and water, one of each lost per tick: at zero both cost a health each (10 ticks), then 10 health
    # last 5 ticks; with water, food alone costs one health a tick, and health does not come back below half food.
    assert first_death == {0: (14, 14, 1.0), 1: (19, 19, 1.0)}


def test_eating_a_forest_refills_food_and_the_forest_grows_back():
    for chance, regrown in ((1.0, True), (0.0, False)):
        config = NmmoConfig(num_agents=1, forest_regrow=chance, **SMALL)
        env = NmmoEnv(config, 1)
        env.reset(0)
        clear_world(env)
        put(env, 0, 10, 10, immune=100)
        env.ai[0, 0, IFOOD] = 2
        env.tiles[0, 10, 11] = FOREST
        _, events, _, _ = env.step(heads(env, move=2))  # east, onto the forest
        assert env.ai[0, 0, IX] == 11 and env.ai[0, 0, IFOOD] == config.start_resources
        assert events[0, 0, EV_FOOD] == pytest.approx(0.8) and events[0, 0, EV_WATER] == pytest.approx(-0.1)
        assert env.tiles[0, 10, 11] == SCRUB
        assert env.xp[0, 0, 5] > XP_TABLE[config.start_resources]  # hunting experience
        env.step(heads(env, move=4))  # west, off it
        for _ in range(30):
            env.step(heads(env))
        assert env.tiles[0, 10, 11] == (FOREST if regrown else SCRUB)
    # With chance p per tick, the mean regrowth time is 1/p ticks.
    config = NmmoConfig(num_agents=1, forest_regrow=0.1, drain=0, **SMALL)
    env = NmmoEnv(config, 300)
    env.reset(1)
    clear_world(env)
    put(env, 0, 10, 10, immune=100)
    env.tiles[:, 10, 11] = FOREST
    env.step(heads(env, move=2))  # eat
    env.step(heads(env, move=4))  # and leave
    regrown = np.full(300, -1)
    for tick in range(2, 200):
        regrown[(regrown < 0) & (env.tiles[:, 10, 11] == FOREST)] = tick - 1  # ticks after the eating one
        env.step(heads(env))
    assert (regrown > 0).all() and 8.5 < regrown.mean() < 11.5


def fight(style: int, distance: int, copies: int = 200, immune: int = 0) -> tuple[NmmoEnv, dict]:
    """Agent 0 attacks agent 1 ``distance`` tiles east of it, once, in ``copies`` copies (different rolls)."""
    config = NmmoConfig(num_agents=2, **SMALL)
    env = NmmoEnv(config, copies)
    env.reset(7)
    clear_world(env)
    put(env, 0, 10, 10)
    put(env, 1, 10, 10 + distance, immune=immune)
    obs = env.observe()
    a = heads(env)
    a["action"][:, 0] = style
    _, _, _, infos = env.step(a)
    return env, obs


@pytest.mark.parametrize("style, damage", [(S_MELEE, 7), (S_RANGE, 3), (S_MAGE, 1)])
def test_combat_damage_by_style_and_the_mage_freeze(style, damage):
    env, obs = fight(style, 1)
    assert obs["target_mask"][:, 0, 0].all() and obs["action_mask"][:, 0].all()
    hp = env.ai[:, 1, IHP]
    start = env.config.start_resources
    hit = hp == start - damage
    assert set(hp.tolist()) <= {start, start - damage}  # a hit does the style's damage at level 1, a miss nothing
    assert 0.35 < hit.mean() < 0.65  # accuracy 0.5 + (level - defense) / 200 = 0.5 at equal levels
    assert (env.xp[hit, 0, style] > XP_TABLE[1]).all() and (env.xp[hit, 1, SK_DEFENSE] > XP_TABLE[1]).all()
    # Pilfering: the hit took as much food and water as its damage (the attacker is full, so it keeps none).
    assert (env.ai[hit, 1, IFOOD] == start - 1 - damage).all()
    frozen = env.ai[:, 1, IFREEZE] > 0
    np.testing.assert_array_equal(frozen, hit if style == S_MAGE else np.zeros_like(hit))
    if style == S_MAGE:
        assert (env.ai[hit, 1, IFREEZE] == env.config.freeze_ticks).all()
        obs = env.observe()
        assert (obs["move_mask"][hit, 1] == [True, False, False, False, False]).all()
        x0 = env.ai[:, 1, IX].copy()
        env.step(heads(env, move=2))  # everybody walks east; the frozen stay
        np.testing.assert_array_equal(env.ai[:, 1, IX], np.where(hit, x0, x0 + 1))


def test_reach_and_immunity_limit_attacks():
    env, obs = fight(S_MELEE, 3)  # melee reaches 1: the target is legal (mage's reach) but melee misses
    assert obs["target_mask"][:, 0, 0].all()
    assert (obs["action_mask"][:, 0] == [True, False, True, True]).all()
    assert (env.ai[:, 1, IHP] == env.config.start_resources).all()
    env, obs = fight(S_RANGE, 1, immune=5)  # newly spawned agents can not be attacked
    assert not obs["target_mask"][:, 0].any() and (obs["action_mask"][:, 0] == [True, False, False, False]).all()
    assert (env.ai[:, 1, IHP] == env.config.start_resources).all()
    env, obs = fight(S_MAGE, 5)  # out of view of no style: mage reaches 4
    assert obs["entities/agents/mask"][:, 0, 0].all() and not obs["target_mask"][:, 0].any()


def test_lava_kills_and_stone_and_water_block():
    config = NmmoConfig(num_agents=3, **SMALL)
    env = NmmoEnv(config, 1)
    env.reset(0)
    clear_world(env)
    b = config.border
    put(env, 0, b, 10, immune=100)  # on the spawn ring, lava to the north
    put(env, 1, 10, 10, immune=100)
    put(env, 2, 12, 10, immune=100)
    env.tiles[0, 9, 10] = STONE
    env.tiles[0, 11, 10] = WATER
    obs = env.observe()
    assert (obs["move_mask"][0, :, 1] == [True, False, False]).all()  # lava is legal (and lethal)
    a = heads(env, move=1)
    a["move"][0, 2] = 1  # north into water
    _, events, _, infos = env.step(a)
    assert infos["agent_done"][0].tolist() == [True, False, False] and events[0, 0, EV_DEATH] == 1
    assert env.ai[0, 1, IY] == 10 and env.ai[0, 2, IY] == 12


def test_spawn_one_per_tick_up_to_the_cap():
    config = NmmoConfig(num_agents=6, drain=0, **SMALL)
    env = NmmoEnv(config, 2)
    env.reset(3)
    counts = []
    for _ in range(12):
        env.step(heads(env))  # everyone stays on the spawn ring: nobody dies
        counts.append(env.alive.sum(axis=1).tolist())
    assert counts == [[min(t + 2, 6)] * 2 for t in range(12)]
    ring = {(config.border, x) for x in range(24)} | {(y, config.border) for y in range(24)}
    ring |= {(23 - config.border, x) for x in range(24)} | {(y, 23 - config.border) for y in range(24)}
    assert {(int(y), int(x)) for y, x in env.ai[:, :, [IY, IX]].reshape(-1, 2)} <= ring
    assert (env.tiles[:, config.border, config.border:24 - config.border] == GRASS).all()
    # A death frees its slot, which the next spawn takes.
    env.ai[0, 2, IHP] = 0
    env.ai[0, 2, IFOOD] = env.ai[0, 2, IWATER] = 0
    _, _, _, infos = env.step(heads(env))
    assert infos["agent_done"][0].tolist() == [False, False, True, False, False, False] and env.alive[0].all()
    assert env.ai[0, 2, IHP] == config.start_resources


def test_the_crop_at_the_map_border_and_the_agents_in_view():
    config = NmmoConfig(num_agents=4, map_size=12, border=1, max_seen=2)
    env = NmmoEnv(config, 1)
    env.reset(5)
    clear_world(env)
    put(env, 0, 1, 2)  # one tile inside the lava's north-west corner: most of the crop lies beyond the map
    put(env, 1, 1, 2)  # on the same tile
    put(env, 2, 4, 3)  # three rows south, one column east
    put(env, 3, 9, 9)  # out of view (7 rows, 7 columns away)
    env.tiles[0, 3, 3] = FOREST
    env.tiles[0, 2, 5] = STONE
    obs = env.observe()
    got = crop(obs, config)[0, 0]
    V, S = config.vision, config.map_size
    padded = np.full((S + 2 * V, S + 2 * V), LAVA)
    padded[V:V + S, V:V + S] = env.tiles[0]
    window = padded[1:1 + 2 * V + 1, 2:2 + 2 * V + 1]  # centred on (1, 2)
    for channel, material in enumerate(CROP_MATERIALS):
        np.testing.assert_array_equal(got[..., channel], window == material, err_msg=MATERIALS[material])
    assert got[window == GRASS][:, :-1].sum() == 0
    others = np.zeros_like(window)
    others[V, V] = 1  # agent 1 on the own tile
    others[V + 3, V + 1] = 1
    np.testing.assert_array_equal(got[..., -1], others)
    # Nearest first, capped at max_seen; the rows name the offsets.
    assert obs["entities/agents/mask"][0, 0].tolist() == [True, True] and env.seen[0, 0].tolist() == [1, 2]
    rows = obs["entities/agents"][0, 0]
    assert rows[0, :3].tolist() == [0, 0, 0] and rows[1, :3] * V == pytest.approx([1, 3, 3])
    assert obs["global"][0, 0, 18] == 1.0 and obs["global"][0, 0, 19] == pytest.approx(1 / V)
    assert obs["move_mask"][0, 0].tolist() == [True] * 5  # lava to the north is legal


def test_copies_stepped_together_equal_one_by_one_and_seeds_decide():
    config = NmmoConfig(num_agents=12, **SMALL)
    together = NmmoEnv(config, 3)
    alone = [NmmoEnv(config, 1, first_copy=k) for k in range(3)]
    obs = together.reset(11)
    singles = [env.reset(11) for env in alone]
    bot = Forager(config, 0)
    for _ in range(60):
        actions = bot.act(obs)
        obs, events, _, infos = together.step(actions)
        for k, env in enumerate(alone):
            o, ev, _, inf = env.step({h: v[k:k + 1] for h, v in actions.items()})
            for key in obs:
                np.testing.assert_array_equal(o[key][0], obs[key][k], err_msg=key)
            np.testing.assert_array_equal(ev[0], events[k])
            np.testing.assert_array_equal(inf["agent_done"][0], infos["agent_done"][k])
    assert together.xp.max() > XP_TABLE[config.start_resources]  # something happened
    again = NmmoEnv(config, 3)
    np.testing.assert_array_equal(again.reset(11)["global"], together.reset(11)["global"])
    np.testing.assert_array_equal(again.tiles, together.tiles)
    assert not np.array_equal(again.reset(12)["global"], together.reset(11)["global"])
    assert (np.diff(together.tiles.reshape(3, -1), axis=0) != 0).any()  # each copy its own map


def test_terrain_shares():
    config = NmmoConfig()
    env = NmmoEnv(config, 2)
    env.reset(0)
    b, S = config.border, config.map_size
    inner = env.tiles[:, b + 1:S - b - 1, b + 1:S - b - 1]
    share = {m: (inner == material).mean() for m, material in (("water", WATER), ("stone", STONE), ("forest", FOREST))}
    assert share["water"] == pytest.approx(0.08, abs=0.01) and share["stone"] == pytest.approx(0.10, abs=0.01)
    assert 0.2 < share["forest"] <= 0.3  # forest goes where neither stone nor water is
    assert (env.tiles[:, :b] == LAVA).all() and (env.tiles[:, :, S - b:] == LAVA).all()


def test_a_world_of_1024_agents_runs():
    config = NmmoConfig(num_agents=1024)
    env = NmmoEnv(config, 1)
    env.reset(0)
    # The world full at once (spawning one per tick would take 1,023 ticks), on random grass tiles.
    ys, xs = np.nonzero(env.tiles[0] == GRASS)
    cells = np.random.default_rng(0).choice(len(ys), 1024)
    for slot in range(1024):
        put(env, slot, ys[cells[slot]], xs[cells[slot]])
    obs = env.observe()
    assert obs["entities/agents/mask"].sum(axis=-1).max() == config.max_seen  # crowds fill the entity rows
    bot = Forager(config, 0)
    deaths = 0
    for _ in range(20):
        obs, events, _, infos = env.step(bot.act(obs))
        env.spec.check_obs(obs, 1)
        deaths += int(infos["agent_done"].sum())
    assert 1024 - deaths <= env.alive.sum() <= 1024 and deaths > 0  # the crowd fights; one spawn a tick refills
    assert (env.xp[0, :, S_MELEE:S_MAGE + 1] > XP_TABLE[1]).any(axis=1).sum() > 100


def test_bad_actions_are_refused_naming_the_head():
    env = NmmoEnv(NmmoConfig(num_agents=2, **SMALL), 1)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(heads(env))
    env.reset(0)
    with pytest.raises(ValueError, match="'target'"):
        env.step(heads(env, target=env.config.max_seen))
    with pytest.raises(ValueError, match="'move'"):
        env.step(heads(env, move=5))
    with pytest.raises(ValueError, match="nmmo.border"):
        NmmoConfig(border=0)


def test_the_policy_consumes_the_observation():
    torch = pytest.importorskip("torch")
    from hpc_rl.model.config import ModelConfig
    from hpc_rl.model.policy import Policy, hero_indices

    config = NmmoConfig(num_agents=8, **SMALL)
    env = NmmoEnv(config, 2)
    obs = env.reset(0)
    for _ in range(10):
        obs, *_ = env.step(heads(env))
    policy = Policy(env.spec, ModelConfig(lstm_size=16, embed_size=8))
    n = 2 * 8
    flat = {k: torch.from_numpy(v.reshape((1, n) + v.shape[2:])) for k, v in obs.items()}
    hero = torch.from_numpy(np.tile(hero_indices(env.spec), 2))[None]
    step = policy(flat, hero, torch.ones(1, n, dtype=torch.bool), policy.initial_state(n))
    actions = {k: v.reshape(2, 8).numpy() for k, v in step.actions.items()}
    assert obs["move_mask"].reshape(n, -1)[np.arange(n), actions["move"].ravel()].all()
    assert torch.isfinite(step.logp).all()
    env.step(actions)


def test_a_replay_gif_of_a_world(tmp_path, capsys):
    from PIL import Image

    from hpc_rl.envs.nmmo_render import POPULATION_COLOURS, main

    out = tmp_path / "world.gif"
    main(["--out", str(out), "--agents", "16", "--map-size", "24", "--steps", "20", "--every", "10",
          "--tile-pixels", "6", "--populations", "2"])
    assert "3 frames" in capsys.readouterr().out
    gif = Image.open(out)
    assert gif.n_frames == 3 and gif.size[0] == 24 * 6
    first = np.asarray(gif.convert("RGB"))
    gif.seek(2)
    last = np.asarray(gif.convert("RGB"))
    assert not np.array_equal(first, last)  # agents spawned and moved
    # Agents in their population's colour (yellow, magenta; the palette may shift them a little): no tile has them.
    for colour in POPULATION_COLOURS[:2]:
        assert (np.abs(last[:144].astype(int) - colour).max(axis=-1) < 40).sum() >= 16
    with pytest.raises(SystemExit, match="steps"):
        main(["--out", str(out), "--steps", "0"])
