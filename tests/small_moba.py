"""What the evaluation, tournament and replay tests share: one torch thread, a small MOBA config, seeded small
policies, a finished run of them."""

import json
from pathlib import Path

import pytest
import torch

from hpc_rl.config import EnvConfig, TrainConfig, to_yaml
from hpc_rl.envs.moba import MobaConfig
from hpc_rl.model.config import ModelConfig
from hpc_rl.model.policy import Policy
from hpc_rl.storage import MetricsWriter, commit_checkpoint, write_meta


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Small policies on a shared machine: intra-op threads only contend (several times slower on 2 cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def small_config(time_limit: int) -> TrainConfig:
    return TrainConfig(env=EnvConfig(moba=MobaConfig(time_limit=time_limit)),
                       model=ModelConfig(core="lstm", lstm_size=16, embed_size=8))


def seeded_policy(config: TrainConfig, seed: int) -> Policy:
    torch.manual_seed(seed)
    return Policy(config.env.make(num_envs=1).spec, config.model).eval()


def tiny_run(path: Path, versions=(2, 4), time_limit: int = 2500) -> Path:
    """A finished pipeline-like run: config.yaml, meta.json then status.json, training metrics, and checkpoints
    of freshly initialised policies (what jobs/tournament.py and the replays read)."""
    config = small_config(time_limit)
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(to_yaml(config))
    write_meta(path, world_size=6, roles={0: "controller[0]"})
    with MetricsWriter(path / "metrics.h5") as metrics:
        for v in range(1, max(versions) + 1):
            metrics.log("train/policy_loss", v, 1000 * v, 0.1, wall_time=100.0 * v)
    for v in versions:
        params = {k: t.numpy() for k, t in seeded_policy(config, v).state_dict().items()}
        commit_checkpoint(path / "checkpoints", v, {"params": params}, config.config_hash())
    (path / "status.json").write_text(json.dumps({"state": "finished", "version": max(versions)}))
    return path
