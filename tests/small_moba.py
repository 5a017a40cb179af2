"""What the evaluation and tournament tests share: one torch thread, a small MOBA config, seeded small policies."""

import pytest
import torch

from hpc_rl.config import EnvConfig, TrainConfig
from hpc_rl.envs.moba import MobaConfig
from hpc_rl.model.config import ModelConfig
from hpc_rl.model.policy import Policy


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Small policies on a shared machine: intra-op threads only contend (several times slower on 2 cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def small_config(time_limit: int) -> TrainConfig:
    return TrainConfig(env=EnvConfig(moba=MobaConfig(time_limit=time_limit)),
                       model=ModelConfig(lstm_size=16, embed_size=8))


def seeded_policy(config: TrainConfig, seed: int) -> Policy:
    torch.manual_seed(seed)
    return Policy(config.env.make(num_envs=1).spec, config.model).eval()
