"""PPO update throughput of the default MOBA model beside a bare forward + backward of that model on the same batch.

Both run the same minibatches (BPTT chunks from the stored LSTM states, same epochs and minibatch split); the PPO
update adds GAE, advantage normalisation, the dual-clip/value/entropy losses, OpenAI Five's per-parameter clip,
Adam and the normaliser update. ``ratio`` = ppo_samples_per_s / raw_samples_per_s (goal: ≥ 0.8). The two are
timed alternately and the fastest run of each counts, as ``timeit`` does: on a shared machine the slower runs
measure the other processes.

    python -m hpc_rl.bench learner --json
"""

from __future__ import annotations

import time

import torch

from hpc_rl.algo.bptt import to_chunks
from hpc_rl.algo.config import PPOConfig
from hpc_rl.config import EnvConfig, PipelineConfig, TrainConfig
from hpc_rl.data.batch import Batch
from hpc_rl.launch import set_torch_threads
from hpc_rl.runner import SerialRunner


def add_arguments(parser) -> None:
    parser.add_argument("--num-envs", type=int, default=8, help="MOBA copies (2 agents each) per batch")
    parser.add_argument("--segment-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7, help="timed runs of each; the fastest of each is reported")


def raw_pass(runner: SerialRunner, batch: Batch, ppo: PPOConfig) -> None:
    """Forward + backward of the same minibatches as the PPO update, with a trivial loss and no optimiser."""
    policy = runner.policy
    chunk = policy.config.chunk_len
    obs = {k: to_chunks(v, chunk) for k, v in batch.obs.items()}
    actions = {k: to_chunks(v, chunk) for k, v in batch.actions.items()}
    hero, starts = to_chunks(batch.hero, chunk), to_chunks(batch.starts, chunk)
    h0 = batch.chunk_h.reshape(-1, batch.chunk_h.shape[-1])
    c0 = batch.chunk_c.reshape(-1, batch.chunk_c.shape[-1])
    for _ in range(ppo.epochs):
        for idx in torch.randperm(h0.shape[0]).chunk(ppo.num_minibatches):
            out = policy({k: v[:, idx] for k, v in obs.items()}, hero[:, idx], starts[:, idx], (h0[idx], c0[idx]),
                         actions={k: v[:, idx] for k, v in actions.items()})
            policy.zero_grad(set_to_none=False)
            (out.logp.mean() + out.value.mean()).backward()


def run(args) -> dict:
    import tempfile

    set_torch_threads()
    ppo = PPOConfig()
    with tempfile.TemporaryDirectory() as runs:
        runner = SerialRunner(TrainConfig(runs_dir=runs, env=EnvConfig(num_envs=args.num_envs), ppo=ppo,
                                          pipeline=PipelineConfig(segment_len=args.segment_len)))
        batch = runner.collect()
    samples = batch.obs["global"].shape[0] * batch.obs["global"].shape[1] * ppo.epochs
    runner.learner.update(batch)  # warm-up: allocations, optimiser state
    raw_pass(runner, batch, ppo)
    ppo_times, raw_times = [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        runner.learner.update(batch)
        ppo_times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        raw_pass(runner, batch, ppo)
        raw_times.append(time.perf_counter() - t0)
    ppo_rate = samples / min(ppo_times)
    raw_rate = samples / min(raw_times)
    return {"ppo_samples_per_s": round(ppo_rate, 1), "raw_samples_per_s": round(raw_rate, 1),
            "ratio": round(ppo_rate / raw_rate, 3), "batch_samples": samples // ppo.epochs,
            "epochs": ppo.epochs, "num_minibatches": ppo.num_minibatches,
            "lstm_size": runner.policy.config.lstm_size, "embed_size": runner.policy.config.embed_size,
            "parameters": sum(p.numel() for p in runner.policy.parameters())}
