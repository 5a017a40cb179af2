"""Offline evaluation of a policy against the reference bots."""

import dataclasses

import pytest

from hpc_rl.config import EnvConfig, TrainConfig
from hpc_rl.envs.moba import MobaConfig
from hpc_rl.envs.scripted import scripted_bot_hash
from hpc_rl.evaluation import play_vs_bot
from hpc_rl.model.config import ModelConfig
from hpc_rl.model.policy import Policy


def _config(time_limit: int) -> TrainConfig:
    return TrainConfig(env=EnvConfig(moba=MobaConfig(time_limit=time_limit)),
                       model=ModelConfig(lstm_size=16, embed_size=8))


def test_games_that_reach_the_time_limit_are_draws_and_the_tally_adds_up():
    config = _config(time_limit=5)
    policy = Policy(config.env.make(num_envs=1).spec, config.model)
    result = play_vs_bot(policy, config, "scripted", games=6, seed=0)
    assert result["games"] == 6 and result["draws"] == 6 and result["wins"] == result["losses"] == 0
    assert result["win_rate"] == 0.0 and result["win_rate_ci95"][0] == 0.0 and result["win_rate_ci95"][1] < 0.5
    assert result["bot_hash"] == scripted_bot_hash()


def test_only_moba_runs_play_against_the_bots():
    config = dataclasses.replace(_config(5), env=EnvConfig(name="gym:CartPole-v1", vs_scripted_fraction=0.0))
    policy = Policy(config.env.make(num_envs=1).spec, config.model)
    with pytest.raises(ValueError, match="needs a MOBA run"):
        play_vs_bot(policy, config, "scripted", games=2, seed=0)
