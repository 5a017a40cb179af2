"""Horovod on a learner sub-communicator (run with 4 ranks).

Ranks 0-1 are learners: ``hvd.init(comm=...)`` on a split of COMM_WORLD, then 3 steps of an LSTM trained with
``hvd.DistributedOptimizer`` on their half of a batch. Ranks 2-3 meanwhile do other work on their own
sub-communicator. Rank 0 then trains the same LSTM in one process on the whole batch and prints one JSON line with
the largest parameter difference between the learners and between learner and single process.
"""

import json

import torch
from mpi4py import MPI

from hpc_rl.launch import set_torch_threads

set_torch_threads()
torch.set_default_dtype(torch.float64)
world = MPI.COMM_WORLD
assert world.Get_size() == 4, "run with 4 ranks"
is_learner = world.Get_rank() < 2
role_comm = world.Split(color=0 if is_learner else 1, key=world.Get_rank())

B, T, IN, H, STEPS = 8, 5, 3, 6, 3


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(IN, H, batch_first=True)
        self.head = torch.nn.Linear(H, 1)

    def forward(self, x):
        return self.head(self.lstm(x)[0]).squeeze(-1)


def data():
    g = torch.Generator().manual_seed(123)
    return torch.randn(2 * B, T, IN, generator=g), torch.randn(2 * B, T, generator=g)


def train(net, opt, x, y):
    for _ in range(STEPS):
        opt.zero_grad()
        loss = ((net(x) - y) ** 2).mean()
        loss.backward()
        opt.step()


result = {}
if is_learner:
    import horovod.torch as hvd

    hvd.init(comm=role_comm)
    assert hvd.size() == 2 and hvd.rank() == world.Get_rank()
    torch.manual_seed(1000 + hvd.rank())  # different inits: broadcast must make them equal
    net = Net()
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    init = {k: v.clone() for k, v in net.state_dict().items()}
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1),
                                   named_parameters=net.named_parameters())
    x, y = data()
    half = slice(hvd.rank() * B, (hvd.rank() + 1) * B)
    train(net, opt, x[half], y[half])
    flat = torch.cat([p.detach().flatten() for p in net.parameters()]).numpy()
    other = role_comm.sendrecv(flat, dest=1 - hvd.rank(), source=1 - hvd.rank())
    result["learner_max_diff"] = float(abs(flat - other).max())
    result["moved"] = float(abs(flat - torch.cat([v.flatten() for v in init.values()]).numpy()).max())
    if hvd.rank() == 0:
        single = Net()
        single.load_state_dict(init)
        train(single, torch.optim.SGD(single.parameters(), lr=0.1), x, y)
        ref = torch.cat([p.detach().flatten() for p in single.parameters()]).numpy()
        result["single_max_diff"] = float(abs(flat - ref).max())
    hvd.shutdown()
else:
    # The other roles keep working meanwhile, on their own communicator.
    total = role_comm.allreduce(sum(i * i for i in range(100_000)))
    result["other_work"] = total

results = world.gather(result, root=0)
if world.Get_rank() == 0:
    print(json.dumps(results))
