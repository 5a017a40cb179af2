"""The serial runner on the MOBA environment: entities, masks and targets end to end, against the scripted bot."""

import numpy as np
import pytest
import torch

from hpc_rl.algo.bptt import from_chunks, to_chunks
from hpc_rl.algo.config import PPOConfig
from hpc_rl.config import EnvConfig, PipelineConfig, TrainConfig
from hpc_rl.envs.moba import MobaConfig
from hpc_rl.model.config import ModelConfig
from hpc_rl.runner import SerialRunner
from hpc_rl.storage import open_run

pytestmark = pytest.mark.slow


def test_runner_trains_on_moba_against_the_scripted_bot(tmp_path):
    config = TrainConfig(run_name="moba", runs_dir=str(tmp_path),
                         env=EnvConfig(num_envs=4, vs_scripted_fraction=1.0, moba=MobaConfig()),
                         model=ModelConfig(core="lstm", lstm_size=32, embed_size=16), ppo=PPOConfig(epochs=1, num_minibatches=2),
                         pipeline=PipelineConfig(segment_len=32, segments_per_batch=1, max_versions=3))
    runner = SerialRunner(config)
    batch = runner.collect()
    # Columns are (copy, agent): the bot plays team 1 in even copies and team 0 in odd ones; only the policy's
    # side is trained on.
    assert batch.weight[0].tolist() == [1, 0, 0, 1, 1, 0, 0, 1]
    assert (batch.weight == batch.weight[0]).all()
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
    metrics = runner.update(batch)
    assert all(np.isfinite(v) for v in metrics.values())
    assert metrics["perf/samples"] == 4 * 32

    # Then the roles on their own, as the MPI job runs them, up to pipeline.max_versions.
    metrics = runner.run()
    assert runner.learner.version == 3 and np.isfinite(metrics["train/value_loss"])
    assert runner.env_steps >= 3 * 4 * 32
    assert 0 < metrics["perf/env_steps"] <= runner.env_steps  # from the env worker's last heartbeat
    run = open_run(tmp_path / "moba")
    assert run.metrics["train/value_loss"]["version"].tolist() == [2, 3]
    assert run.load_checkpoint().version == 3


def test_curriculum_warms_up_then_plays_the_scripted_bot_on_the_runs_map(tmp_path):
    """env.warmup_*: the env rank plays the warm-up bot on the warm-up map until the controller reports
    env.warmup_versions, then the scripted bot on the run's map; the observations keep their shapes."""
    config = TrainConfig(run_name="curriculum", runs_dir=str(tmp_path),
                         env=EnvConfig(num_envs=2, vs_scripted_fraction=0.5, moba=MobaConfig(), warmup_versions=2,
                                       warmup_opponent="random", warmup_map_size=32.0),
                         model=ModelConfig(lstm_size=16, embed_size=8), ppo=PPOConfig(epochs=1, num_minibatches=1),
                         pipeline=PipelineConfig(segment_len=16, segments_per_batch=1, max_versions=4))
    runner = SerialRunner(config)
    stages = {}

    def record(run: SerialRunner, metrics: dict) -> bool:
        stages[run.learner.version] = (run.env_worker.env.config.map_size, type(run.env_worker.bot).__name__)
        return False

    runner.run(record)
    assert stages[1] == (32.0, "RandomBot")
    assert stages[4] == (64.0, "ScriptedBot") and runner.env_worker.bot.config.map_size == 64.0
    assert runner.env_worker.obs["entities/towers"].shape[2] == 4  # two towers a side on either map
