"""The serial runner on the MOBA environment: entities, masks and targets end to end, against the scripted bot."""

import numpy as np
import pytest
import torch

from hpc_rl.algo.bptt import from_chunks, to_chunks
from hpc_rl.bench.learner import moba_reward_config
from hpc_rl.envs.moba import MobaConfig, MobaEnv
from hpc_rl.envs.scripted import ScriptedBot
from hpc_rl.model import ModelConfig
from hpc_rl.algo.config import PPOConfig
from hpc_rl.runner import RunnerConfig, SerialRunner

pytestmark = pytest.mark.slow


def test_runner_trains_on_moba_against_the_scripted_bot():
    config = MobaConfig()
    model = ModelConfig(lstm_size=32, embed_size=16)
    runner = SerialRunner(MobaEnv(config, 2), RunnerConfig(num_envs=2, segment_len=32, log_every=0, device="cpu"),
                          PPOConfig(epochs=1, num_minibatches=2), model, moba_reward_config(config),
                          opponent=ScriptedBot(config), learning_agents=(0,))
    batch = runner.collect()
    # Only agent 0 of each copy (columns 0 and 2) is trained on; agent 1 is the bot.
    assert batch.weight[:, 0::2].eq(1).all() and batch.weight[:, 1::2].eq(0).all()
    learner_rows = batch.weight > 0
    chosen = batch.actions["action"]
    assert batch.obs["action_mask"].gather(2, chosen.unsqueeze(-1)).squeeze(-1)[learner_rows].all()
    uses_target = torch.tensor(runner.spec.action_uses_target)[chosen] & batch.obs["target_mask"].any(-1)
    target_legal = batch.obs["target_mask"].gather(2, batch.actions["target"].unsqueeze(-1)).squeeze(-1)
    assert target_legal[uses_target & learner_rows].all()
    # The learner's chunked replay from stored states gives back the behaviour log-probabilities.
    with torch.no_grad():
        step = runner.policy({k: to_chunks(v, 16) for k, v in batch.obs.items()}, to_chunks(batch.hero, 16),
                             to_chunks(batch.starts, 16), (batch.chunk_h.reshape(-1, 32), batch.chunk_c.reshape(-1, 32)),
                             actions={k: to_chunks(v, 16) for k, v in batch.actions.items()})
    torch.testing.assert_close(from_chunks(step.logp, 2)[learner_rows], batch.logp[learner_rows], rtol=1e-4, atol=1e-4)
    metrics = runner.learner.update(batch)
    assert all(np.isfinite(v) for v in metrics.values())
    assert metrics["perf/samples"] == 2 * 32
    metrics = runner.run(total_steps=3 * 2 * 32)
    assert runner.env_steps == 3 * 2 * 32 and runner.learner.version == 3
    assert np.isfinite(metrics["train/value_loss"])


def test_alternate_sides_puts_the_policy_on_team_1_in_odd_copies():
    config = MobaConfig()
    model = ModelConfig(lstm_size=32, embed_size=16)
    runner = SerialRunner(MobaEnv(config, 4), RunnerConfig(num_envs=4, segment_len=16, log_every=0, device="cpu"),
                          PPOConfig(epochs=1, num_minibatches=2), model, moba_reward_config(config),
                          opponent=ScriptedBot(config), learning_agents=(0,), alternate_sides=True)
    batch = runner.collect()
    # Columns are (copy, agent): the policy is agent 0 (team 0) in copies 0 and 2, agent 1 (team 1) in 1 and 3.
    assert batch.weight[0].tolist() == [1, 0, 0, 1, 1, 0, 0, 1]
    assert runner.controlled.tolist() == [[True, False], [False, True], [True, False], [False, True]]
    with pytest.raises(ValueError, match="alternate_sides needs an opponent"):
        SerialRunner(MobaEnv(config, 2), RunnerConfig(num_envs=2, segment_len=16, log_every=0, device="cpu"),
                     PPOConfig(epochs=1, num_minibatches=2), model, moba_reward_config(config), alternate_sides=True)
