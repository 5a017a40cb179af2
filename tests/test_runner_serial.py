"""The serial runner (the roles in one process): segments with stored LSTM states, the learner's update and its
publication to the inference worker, and lockstep learners."""

import copy
import dataclasses
import threading

import numpy as np
import pytest
import torch

from hpc_rl.algo.bptt import from_chunks, to_chunks
from hpc_rl.algo.config import PPOConfig
from hpc_rl.algo.gae import gae
from hpc_rl.algo.learner import Learner
from hpc_rl.algo.normalizer import NormStats
from hpc_rl.algo.schedules import constant
from hpc_rl.config import EnvConfig, PipelineConfig, TrainConfig
from hpc_rl.data.batch import Batch
from hpc_rl.envs.gym_adapter import GymVecEnv
from hpc_rl.model.config import ModelConfig
from hpc_rl.model.policy import Policy
from hpc_rl.runner import SerialRunner

MODEL = ModelConfig(core="lstm", lstm_size=16, embed_size=16)
PPO = PPOConfig(lr=constant(1e-3), gamma=constant(0.98), lam=0.8, epochs=2, num_minibatches=2)


def cartpole_config(runs_dir, num_envs=4, seed=0, **pipeline) -> TrainConfig:
    return TrainConfig(run_name=f"cartpole-{num_envs}-{seed}", runs_dir=str(runs_dir), seed=seed,
                       env=EnvConfig(name="gym:CartPole-v1", num_envs=num_envs), model=MODEL, ppo=PPO,
                       pipeline=PipelineConfig(**{"segment_len": 64, "segments_per_batch": 1, **pipeline}))


def make_runner(runs_dir, num_envs=4, seed=0):
    return SerialRunner(cartpole_config(runs_dir, num_envs, seed))


def replay(policy: Policy, batch: Batch):
    """The learner's view: every 16-step chunk unrolled from its stored state, with the behaviour's actions."""
    n = batch.chunk_h.shape[0]
    step = policy({k: to_chunks(v, 16) for k, v in batch.obs.items()}, to_chunks(batch.hero, 16),
                  to_chunks(batch.starts, 16),
                  (batch.chunk_h.reshape(-1, MODEL.lstm_size), batch.chunk_c.reshape(-1, MODEL.lstm_size)),
                  actions={k: to_chunks(v, 16) for k, v in batch.actions.items()})
    return from_chunks(step.logp, n), from_chunks(step.value, n)


def test_chunks_from_stored_states_recompute_the_behaviour_policy_exactly(tmp_path):
    runner = make_runner(tmp_path)
    runner.collect()  # a second segment starts from a carried, non-zero LSTM state
    batch = runner.collect()
    assert batch.starts.any() and batch.done.any()
    assert batch.chunk_h[0].abs().sum() > 0
    with torch.no_grad():
        logp, value = replay(runner.policy, batch)
    torch.testing.assert_close(logp, batch.logp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(value, batch.value, rtol=1e-5, atol=1e-5)
    # starts[t] is done[t−1] inside the segment: the state is reset exactly where a game ended.
    assert torch.equal(batch.starts[1:], batch.done[:-1])
    # Zeroing the stored states changes the replay where no reset happened before the chunk's first steps.
    with torch.no_grad():
        zero = batch.replace(chunk_h=torch.zeros_like(batch.chunk_h), chunk_c=torch.zeros_like(batch.chunk_c))
        assert not torch.allclose(replay(runner.policy, zero)[1], batch.value, atol=1e-5)


def test_update_trains_and_ships_the_normaliser(tmp_path):
    runner = make_runner(tmp_path)
    batch = runner.collect()
    before = [p.detach().clone() for p in runner.policy.parameters()]
    metrics = runner.update(batch)
    assert runner.learner.version == 1
    assert all(np.isfinite(v) for v in metrics.values())
    assert metrics["train/approx_kl"] >= 0 and metrics["train/nonfinite_skipped"] == 0
    assert metrics["perf/samples"] == 4 * 64
    assert any(not torch.equal(a, b) for a, b in zip(before, runner.policy.parameters()))
    stats = NormStats.of(batch.obs["global"].numpy())
    norm = runner.learner.normalizers["global"]
    assert norm.stats.count == 256
    np.testing.assert_allclose(norm.stats.mean, stats.mean, rtol=1e-6)
    np.testing.assert_allclose(runner.policy.obs_mean_0.numpy(), stats.mean, rtol=1e-5)
    # Value normalisation: the statistics of the update's value targets ship inside the policy as well.
    _, returns = gae(batch.reward, batch.value, batch.done.float(), batch.bootstrap_value, 0.98, 0.8)
    assert runner.learner.value_normalizer.stats.count == 256
    assert runner.policy.value_mean.item() == pytest.approx(returns.mean().item(), rel=1e-4)
    assert runner.policy.value_std.item() == pytest.approx(returns.std(unbiased=False).item(), rel=1e-2)
    # The next segment is played with the published parameters and normaliser: behaviour = learner's view again.
    # Its first step was acted on in the pass that shipped the previous segment, before the update (version 0), so
    # the first chunk's LSTM states carry version 0's step; from the second chunk's stored state on, replay is exact.
    batch = runner.collect()
    assert (batch.version[0] == 0).all() and (batch.version[1:] == 1).all()
    with torch.no_grad():
        torch.testing.assert_close(replay(runner.policy, batch)[0][16:], batch.logp[16:], rtol=1e-5, atol=1e-5)


class ThreadAllreduce:
    """An allreduce (sum) among threads, standing in for the learners' communicator."""

    def __init__(self, size: int):
        self.barrier = threading.Barrier(size)
        self.slots = [None] * size

    def for_rank(self, rank: int):
        def allreduce_sum(x: torch.Tensor) -> torch.Tensor:
            self.slots[rank] = x.clone()
            self.barrier.wait()
            total = sum(self.slots[1:], self.slots[0].clone())
            self.barrier.wait()
            return total
        return allreduce_sum


def split(batch: Batch, half: int) -> Batch:
    cols = slice(0, 4) if half == 0 else slice(4, 8)
    return Batch({k: v[cols] if k == "bootstrap_value" else v[:, cols] for k, v in batch.fields.items()})


def test_two_lockstep_learners_stay_identical_and_share_statistics(tmp_path):
    runner = make_runner(tmp_path, num_envs=8, seed=3)
    batch = runner.collect()
    comm = ThreadAllreduce(2)
    learners = []
    for rank in range(2):
        torch.manual_seed(11)
        learners.append(Learner(Policy(runner.spec, MODEL), PPO, comm.for_rank(rank), world_size=2,
                                seed=rank))
    threads = [threading.Thread(target=learners[r].update, args=(split(batch, r),)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert all(learner.version == 1 for learner in learners)
    for a, b in zip(learners[0].policy.parameters(), learners[1].policy.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # Both normalisers hold the statistics of the whole batch, not of their half.
    whole = NormStats.of(batch.obs["global"].numpy())
    for learner in learners:
        assert learner.normalizers["global"].stats.count == whole.count
        np.testing.assert_allclose(learner.normalizers["global"].stats.mean, whole.mean, rtol=1e-6)


def test_a_time_limit_travels_to_the_learner_which_bootstraps_it(tmp_path):
    """Gymnasium's time limit reaches the batch as info/truncated, on the steps it ended, and only those; the update
    bootstraps them with ppo.time_limit_bootstrap and treats them as terminal states without it (the default)."""
    runner = SerialRunner(cartpole_config(tmp_path), env=GymVecEnv("CartPole-v1", 4, max_episode_steps=10))
    batch = runner.collect()
    truncated = batch["info/truncated"]
    assert truncated.dtype == torch.bool and truncated.shape == batch.done.shape
    assert truncated.sum() >= 4 and bool(batch.done[truncated].all())  # 64 steps of 10-step games: at least 6 limits

    def updated(ppo: PPOConfig, batch: Batch) -> list[torch.Tensor]:
        torch.manual_seed(5)
        learner = Learner(Policy(runner.spec, MODEL), ppo, seed=1)
        learner.update(batch)
        return [p.detach().clone() for p in learner.policy.parameters()]

    bootstrapping = dataclasses.replace(PPO, time_limit_bootstrap=True)
    bootstrapped, as_terminal = updated(bootstrapping, batch), updated(PPO, batch)
    assert any(not torch.equal(a, b) for a, b in zip(bootstrapped, as_terminal))
    unlimited = batch.replace(**{"info/truncated": torch.zeros_like(truncated)})
    for a, b in zip(updated(bootstrapping, unlimited), as_terminal):  # no limit flagged: the update without the option
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_config_errors(tmp_path):
    with pytest.raises(ValueError, match="multiple"):
        cartpole_config(tmp_path, segment_len=40)
    with pytest.raises(ValueError, match="num_envs"):
        SerialRunner(cartpole_config(tmp_path, num_envs=3), env=GymVecEnv("CartPole-v1", 2))
    with pytest.raises(ValueError, match="epochs"):
        PPOConfig(epochs=0)


def test_learner_state_round_trip_continues_identically(tmp_path):
    runner = make_runner(tmp_path)
    runner.update(runner.collect())
    batch = runner.collect()
    saved = copy.deepcopy(runner.learner.state_dict())
    torch.manual_seed(99)
    restored = Learner(Policy(runner.spec, MODEL), PPO, seed=12345)
    restored.load_state_dict(saved)
    assert restored.version == 1 and restored.clip.step == runner.learner.clip.step
    runner.learner.update(batch)
    restored.update(batch)
    for a, b in zip(runner.policy.parameters(), restored.policy.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    np.testing.assert_array_equal(restored.normalizers["global"].stats.mean,
                                  runner.learner.normalizers["global"].stats.mean)


def test_a_mixed_precision_update_steps_the_float32_way(tmp_path):
    """ppo.precision=bfloat16 autocasts the forward pass (on the CPU here; on the GPU in tests/test_gpu.py): the
    parameters, gradients and Adam stay float32, and one update's parameter step points where the float32 one's does,
    while differing from it (the bf16 arithmetic did run)."""
    runner = make_runner(tmp_path, num_envs=8, seed=4)
    batch = runner.collect()
    steps = []
    for precision in ("float32", "bfloat16"):
        torch.manual_seed(5)
        learner = Learner(Policy(runner.spec, MODEL), dataclasses.replace(PPO, precision=precision), seed=1)
        before = torch.cat([p.detach().flatten() for p in learner.policy.parameters()])
        metrics = learner.update(batch)
        assert all(np.isfinite(v) for v in metrics.values())
        assert all(p.dtype == torch.float32 for p in learner.policy.parameters())
        steps.append(torch.cat([p.detach().flatten() for p in learner.policy.parameters()]) - before)
    assert not torch.equal(steps[0], steps[1])
    assert torch.nn.functional.cosine_similarity(steps[0], steps[1], dim=0) > 0.9
