"""A non-finite loss on one learner makes every learner skip the update (run with 2 ranks).

Both learners hold the same policy and train on real CartPole experience; learner 1's rewards are poisoned with
NaN before its second update. Rank 0 prints one JSON line: per learner, the skipped-step counts of the three
updates, whether its parameters changed in the poisoned update, and whether they are finite and equal.
"""

import copy
import json
import tempfile

import torch
from mpi4py import MPI

from hpc_rl.algo.config import PPOConfig
from hpc_rl.algo.learner import Learner
from hpc_rl.algo.schedules import Schedule
from hpc_rl.config import EnvConfig, PipelineConfig, TrainConfig
from hpc_rl.launch import set_torch_threads
from hpc_rl.model.config import ModelConfig
from hpc_rl.roles.allreduce import MpiAllreduce
from hpc_rl.runner import SerialRunner

set_torch_threads()
comm = MPI.COMM_WORLD
model = ModelConfig(core="lstm", lstm_size=16, embed_size=16)
ppo = PPOConfig(lr=Schedule(1e-3, kind="constant"), epochs=2, num_minibatches=2)
torch.manual_seed(0)
runner = SerialRunner(TrainConfig(runs_dir=tempfile.mkdtemp(), env=EnvConfig(name="gym:CartPole-v1", num_envs=4),
                                  model=model, ppo=ppo, pipeline=PipelineConfig(segment_len=32)))
batch = comm.bcast(runner.collect() if comm.Get_rank() == 0 else None, root=0)
learner = Learner(runner.policy, ppo, allreduce_sum=MpiAllreduce(comm).sum, world_size=2)
params = lambda: torch.cat([p.detach().flatten() for p in runner.policy.parameters()])  # noqa: E731

skipped, changed = [], []
for update in range(3):
    poisoned = copy.deepcopy(batch)
    if update == 1 and comm.Get_rank() == 1:
        poisoned.reward[5, 0] = float("nan")
    before = params()
    metrics = learner.update(poisoned)
    skipped.append(metrics["train/nonfinite_skipped"])
    changed.append(bool((params() != before).any()))
final = params()
other = torch.from_numpy(comm.sendrecv(final.numpy(), dest=1 - comm.Get_rank(), source=1 - comm.Get_rank()))
report = {"skipped": skipped, "changed": changed, "finite": bool(torch.isfinite(final).all()),
          "equal": bool(torch.equal(final, other))}
reports = comm.gather(report, root=0)
if comm.Get_rank() == 0:
    print(json.dumps(reports), flush=True)
