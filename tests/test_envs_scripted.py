"""The reference opponents: legal actions, a frozen identity, and the strength the issue asks of them."""

from __future__ import annotations

import numpy as np
import pytest

from hpc_rl.envs.moba import MobaConfig, MobaEnv
from hpc_rl.envs import moba, scripted
from hpc_rl.envs.scripted import (SCRIPTED_VERSION, RandomBot, ScriptedBot, ScriptedParams, make_bot, play_games,
                                  scripted_bot_hash, warm_up)


def _legal(obs, acts) -> bool:
    E, A = acts["action"].shape
    e, a = np.meshgrid(np.arange(E), np.arange(A), indexing="ij")
    return bool(obs["action_mask"][e, a, acts["action"]].all())


@pytest.mark.parametrize("name", ["random", "scripted"])
def test_bots_choose_legal_actions(name):
    config = MobaConfig()
    env = MobaEnv(config, 16)
    bot = make_bot(name, config, seed=1)
    obs = env.reset(1)
    for _ in range(400):
        acts = bot.act(obs)
        assert _legal(obs, acts)
        uses_target = np.isin(acts["action"], [2, 3])
        e, a = np.nonzero(uses_target)
        assert obs["target_mask"][e, a, acts["target"][e, a]].all()
        uses_move = acts["action"] == 1
        e, a = np.nonzero(uses_move)
        assert obs["move_mask"][e, a, acts["move"][e, a]].all()
        obs = env.step(acts)[0]


def test_random_bot_is_uniform_over_legal_actions():
    mask = np.zeros((20000, 1, 4), dtype=bool)
    mask[:, :, [0, 2, 3]] = True
    obs = {"action_mask": mask, "move_mask": np.ones((20000, 1, 8), bool), "target_mask": np.ones((20000, 1, 5), bool)}
    counts = np.bincount(RandomBot(0).act(obs)["action"].ravel(), minlength=4) / 20000
    assert counts[1] == 0.0
    assert counts[[0, 2, 3]] == pytest.approx([1 / 3] * 3, abs=0.02)


def test_scripted_identity_is_frozen():
    assert SCRIPTED_VERSION == 1
    assert scripted_bot_hash() == scripted_bot_hash(ScriptedParams())
    assert scripted_bot_hash() != scripted_bot_hash(ScriptedParams(retreat_hp=0.3))
    assert ScriptedBot(MobaConfig()).hash == scripted_bot_hash()
    assert len(scripted_bot_hash()) == 64
    tally = play_games(MobaConfig(time_limit=5), ("scripted", "random"), 2, seed=0)
    assert tally["scripted_hash"] == scripted_bot_hash() and tally["scripted_version"] == SCRIPTED_VERSION
    with pytest.raises(ValueError, match="retreat_hp"):
        ScriptedParams(retreat_hp=1.5)
    with pytest.raises(ValueError, match="bot"):
        make_bot("smart", MobaConfig())


def test_warm_up_compiles_every_kernel():
    warm_up()
    for kernel in (moba._step_all, moba._observe_all, moba._reset_all, moba._copy_seeds, scripted._scripted):
        assert kernel.signatures, kernel


@pytest.mark.slow
def test_scripted_beats_random_by_destroying_the_base():
    """200 1v1 games of the default configuration (100 on each side); draws count as losses."""
    config = MobaConfig()
    as_team0 = play_games(config, ("scripted", "random"), 100, seed=100)
    as_team1 = play_games(config, ("random", "scripted"), 100, seed=200)
    wins = as_team0["wins_team0"] + as_team1["wins_team1"]
    assert wins >= 190, (as_team0, as_team1)


@pytest.mark.slow
def test_scripted_against_itself_with_sides_swapped_is_even():
    """200 games in mirrored pairs (each draw of lineups played once from each side): either side wins 50 +- 7% of
    all games, draws counting for neither."""
    tally = play_games(MobaConfig(mirrored_pairs=True), ("scripted", "scripted"), 200, seed=300)
    assert abs(tally["wins_team0"] / 200 - 0.5) <= 0.07, tally
    assert abs(tally["wins_team1"] / 200 - 0.5) <= 0.07, tally
