"""2 learners x batch B make the same update as 1 learner x batch 2B (run with 2 ranks; argv[1]: horovod | mpi).

The batch is real MOBA experience collected on rank 0 and shared. After 3 PPO updates in float64 (advantage
normalisation, observation normaliser and OpenAI Five's per-parameter clip included), rank 0 prints one JSON line:
the largest parameter difference between the learners and between learner 0 and one process on the whole batch.
"""

import copy
import json
import sys
import tempfile

import torch
from mpi4py import MPI

from hpc_rl.algo.config import PPOConfig
from hpc_rl.algo.learner import Learner
from hpc_rl.algo.schedules import Schedule
from hpc_rl.config import EnvConfig, PipelineConfig, TrainConfig
from hpc_rl.data.batch import Batch
from hpc_rl.envs.moba import MobaConfig
from hpc_rl.launch import set_torch_threads
from hpc_rl.model.config import ModelConfig
from hpc_rl.model.policy import Policy
from hpc_rl.roles.allreduce import make_allreduce
from hpc_rl.runner import SerialRunner

set_torch_threads()
comm = MPI.COMM_WORLD
assert comm.Get_size() == 2, "run with 2 ranks"
kind = sys.argv[1]
model = ModelConfig(core="lstm", lstm_size=32, embed_size=16)
ppo = PPOConfig(lr=Schedule(1e-3, kind="constant"), entropy_coef=Schedule(0.01, kind="constant"),
                epochs=2, num_minibatches=1, clip_k=5.0)

batch = None
if comm.Get_rank() == 0:
    # Self-play only: every agent is trained on, so both halves of the batch weigh the same.
    runner = SerialRunner(TrainConfig(runs_dir=tempfile.mkdtemp(),
                                      env=EnvConfig(num_envs=4, vs_scripted_fraction=0.0, moba=MobaConfig()),
                                      model=model, ppo=ppo, pipeline=PipelineConfig(segment_len=32)))
    batch = runner.collect()
batch = comm.bcast(batch, root=0)


def float64(b: Batch) -> Batch:
    f = lambda t: t.double() if t.is_floating_point() else t  # noqa: E731
    return Batch({k: f(v) for k, v in b.fields.items()})


def columns(b: Batch, cols: slice) -> Batch:
    return Batch({k: v[cols] if k == "bootstrap_value" else v[:, cols] for k, v in b.fields.items()})


torch.set_default_dtype(torch.float64)
batch = float64(batch)
torch.manual_seed(0)
policy = Policy(MobaConfig().spec(), model)
initial = copy.deepcopy(policy.state_dict())

reduce = make_allreduce(kind, comm)
half = batch.hero.shape[1] // 2
mine = columns(batch, slice(comm.Get_rank() * half, (comm.Get_rank() + 1) * half))
learner = Learner(policy, ppo, allreduce_sum=reduce.sum, world_size=2)
for _ in range(3):
    learner.update(mine)
flat = torch.cat([t.flatten() for t in policy.state_dict().values() if t.is_floating_point()])
other = torch.from_numpy(comm.sendrecv(flat.numpy(), dest=1 - comm.Get_rank(), source=1 - comm.Get_rank()))

result = {"learner_max_diff": float((flat - other).abs().max())}
if comm.Get_rank() == 0:
    single = Policy(MobaConfig().spec(), model)
    single.load_state_dict(initial)
    alone = Learner(single, ppo)
    for _ in range(3):
        alone.update(batch)
    ref = torch.cat([t.flatten() for t in single.state_dict().values() if t.is_floating_point()])
    moved = max(float((p.detach() - initial[name]).abs().max()) for name, p in single.named_parameters())
    normaliser_moved = max(float((b - initial[name]).abs().max()) for name, b in single.named_buffers()
                           if name.startswith("obs_"))
    result.update(single_max_diff=float((flat - ref).abs().max()), moved=moved, normaliser_moved=normaliser_moved)
    print(json.dumps(result), flush=True)
reduce.shutdown()
