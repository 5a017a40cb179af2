"""The reference opponents: legal actions, a frozen behaviour and identity, and the strength asked of them."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import yaml

from hpc_rl.envs import moba, scripted
from hpc_rl.envs.moba import MobaConfig, MobaEnv
from hpc_rl.envs.moba_config import EV_DEATH, EV_GOLD, EV_KILL, EV_LAST_HIT
from hpc_rl.envs.scripted import (SCRIPTED_SOURCES, SCRIPTED_VERSION, RandomBot, ScriptedBot, ScriptedParams,
                                  bot_digest, make_bot, play_games, scripted_bot_hash, warm_up)
from hpc_rl.play import play, team_agents

pytestmark = pytest.mark.light  # runs in the base install tier (scripts/light_tier_check.sh)

ENV_PRESETS = Path(__file__).resolve().parent.parent / "conf" / "env"


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


# The behaviour of every SCRIPTED_VERSION: a change on purpose adds a version and its fingerprint here, never edits one
# (docs/envs.md, "Scripted bot versions").
SCRIPTED_FINGERPRINTS = {1: "848a08b9792b2f8db39f1336d72c64497cbde39423704a2f5c4d555428978672"}


def _preset(name: str, **overrides) -> MobaConfig:
    """The MOBA settings of the env preset ``conf/env/<name>.yaml`` (the maps runs are configured with)."""
    return MobaConfig(**{**yaml.safe_load((ENV_PRESETS / f"{name}.yaml").read_text())["moba"], **overrides})


class _Recorder:
    """A ``VecEnv`` around ``env`` that feeds a digest with the observation layout, every step's actions and every
    game's end: copy, winner, length and each team's kills, deaths, last hits and gold. It also sums every
    observation feature over the run (``feature_sums``): an observation the bots do not read changes no action."""

    def __init__(self, env: MobaEnv, digest):
        self.env, self.spec, self.num_envs, self.digest = env, env.spec, env.num_envs, digest
        self.team = np.asarray(env.spec.agent_team)
        self.score = np.zeros((env.num_envs, 2, 4))
        self.feature_sums: dict[str, np.ndarray] = {}
        self.ends: list[tuple[int, ...]] = []

    def reset(self, seed: int):
        obs = self.env.reset(seed)
        self.digest.update(repr([(k, v.shape, v.dtype.str) for k, v in obs.items()]).encode())
        self._sum(obs)
        return obs

    def step(self, actions):
        for head in ("action", "move", "target"):
            self.digest.update(np.ascontiguousarray(actions[head], dtype=np.int64).tobytes())
        obs, events, dones, infos = self.env.step(actions)
        for k, column in enumerate((EV_KILL, EV_DEATH, EV_LAST_HIT, EV_GOLD)):
            for team in (0, 1):
                self.score[:, team, k] += events[:, self.team == team, column].sum(axis=1)
        for e in np.flatnonzero(dones):
            end = (int(e), int(infos["winner"][e]), int(infos["episode_length"][e]),
                   *np.rint(self.score[e]).astype(int).ravel().tolist())
            self.ends.append(end)
            self.digest.update(repr(end).encode())
            self.score[e] = 0.0
        self._sum(obs)
        return obs, events, dones, infos

    def _sum(self, obs) -> None:
        for key, value in obs.items():
            self.feature_sums[key] = self.feature_sums.get(key, 0.0) + value.sum(axis=tuple(range(value.ndim - 1)),
                                                                                  dtype=np.float64)


def test_scripted_fingerprint():
    """Fixed-seed games of the scripted bot against random (on either side) and against itself, on the default maps
    and the small map of conf/env, 1v1 and 5v5, each copy's first game to its end: one SHA-256 of every step's
    actions, every game's outcome and score, and every observation feature's sum (to 6 significant digits, so that
    last-bit differences of floating point between machines do not show). Any change of the bot, the rules, the maps
    or the observations changes it."""
    digest = hashlib.sha256()
    maps = {"default 1v1": _preset("moba_1v1"), "default 5v5": _preset("moba_5v5"),
            "small 1v1": _preset("moba_1v1_small"), "small 5v5": _preset("moba_1v1_small", team_size=5)}
    for name, config in maps.items():
        ends = []
        for opponent in ("random", "scripted"):
            recorder = _Recorder(MobaEnv(config, 2), digest)
            side = team_agents(recorder.spec, np.array([0, 1]))  # the scripted bot is team 0 in copy 0, team 1 in 1
            play(recorder, [(ScriptedBot(config), side), (make_bot(opponent, config, seed=7), ~side)], seed=11)
            digest.update(" ".join(f"{key} {' '.join(f'{v:.6g}' for v in sums)}"
                                   for key, sums in recorder.feature_sums.items()).encode())
            ends += recorder.ends
        # What is pinned includes fighting and ends: on every map heroes kill, creeps and structures fall to heroes,
        # and bases fall. An end is (copy, winner, length, then kills, deaths, last hits, gold of team 0 and team 1).
        ends = np.array(ends)
        assert ends[:, [3, 7]].sum() > 0 and ends[:, [5, 9]].sum() > 0 and (ends[:, 1] >= 0).any(), (name, ends)
    assert digest.hexdigest() == SCRIPTED_FINGERPRINTS[SCRIPTED_VERSION]


def test_scripted_identity_covers_the_rules_it_plays_under():
    # The hash recorded with every win rate names the bot's sources, its rules, map layout and observations.
    assert {path.name for path in SCRIPTED_SOURCES} == {"scripted.py", "moba.py", "moba_config.py", "api.py"}
    sources = {path.name: path.read_bytes() for path in SCRIPTED_SOURCES}
    assert scripted_bot_hash() == bot_digest(sources) and len(scripted_bot_hash()) == 64
    for name in sources:  # one byte more in any of them is another bot
        assert bot_digest({**sources, name: sources[name] + b" "}) != scripted_bot_hash(), name
    assert scripted_bot_hash(ScriptedParams(retreat_hp=0.3)) != scripted_bot_hash()
    assert ScriptedBot(MobaConfig()).hash == scripted_bot_hash()
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
