"""The learners' allreduce behind one interface: Horovod (default) or a plain mpi4py ``Allreduce`` between learner
ranks, or the one learner of a run in one process.

Horovod's last release is from 2023; a site where it does not build still runs, with ``pipeline.allreduce=mpi``.
Both sum a tensor over the learner sub-communicator and broadcast parameters from learner 0; the tests check that
they give the same update. Learners on GPUs reduce through host memory with mpi4py, and with a Horovod built without
CUDA; a Horovod built with CUDA (and NCCL) reduces GPU tensors in place.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch


class Allreduce(Protocol):
    """Sums over the learners and broadcasts from one of them; ``size`` learners, this one is ``rank``."""

    name: str
    size: int
    rank: int

    def sum(self, tensor: torch.Tensor) -> torch.Tensor: ...

    def broadcast_(self, tensors: list[torch.Tensor], root: int = 0) -> None: ...

    def shutdown(self) -> None: ...


class SingleAllreduce:
    """One learner: the sum over it is the tensor itself (the serial runner's learner)."""

    name = "single"
    size = 1
    rank = 0

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def broadcast_(self, tensors: list[torch.Tensor], root: int = 0) -> None:
        """Nothing to do: learner 0 is the only learner."""

    def shutdown(self) -> None:
        """Nothing to release."""


class MpiAllreduce:
    """Sums with ``MPI.Allreduce`` on the learner communicator."""

    name = "mpi"

    def __init__(self, comm):
        from mpi4py import MPI

        self.comm = comm
        self.size = comm.Get_size()
        self.rank = comm.Get_rank()
        self._sum = MPI.SUM

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        local = np.ascontiguousarray(tensor.detach().cpu().numpy())
        out = np.empty_like(local)
        self.comm.Allreduce(local, out, op=self._sum)
        return torch.from_numpy(out).reshape(tensor.shape).to(tensor.device)  # ascontiguousarray makes 0-d 1-d

    def broadcast_(self, tensors: list[torch.Tensor], root: int = 0) -> None:
        for t in tensors:
            buf = np.ascontiguousarray(t.detach().cpu().numpy())
            self.comm.Bcast(buf, root=root)
            t.data.copy_(torch.from_numpy(buf).reshape(t.shape))  # a 0-d tensor (a scalar buffer) came back 1-d

    def shutdown(self) -> None:
        """Nothing to release: the communicator belongs to the caller."""


class HorovodAllreduce:
    """Sums with ``hvd.allreduce`` on a Horovod instance initialised on the learner communicator."""

    name = "horovod"

    def __init__(self, comm):
        import horovod.torch as hvd

        hvd.init(comm=comm)
        self.hvd = hvd
        self.size = hvd.size()
        self.rank = hvd.rank()
        # A Horovod built without CUDA (as `make setup` builds it) refuses GPU tensors: those go through host memory.
        self.through_host = not hvd.cuda_built()

    def _host(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.detach().cpu() if tensor.is_cuda and self.through_host else tensor.detach()

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        # Calls are synchronous and in the same order on every learner, so a name per shape and dtype is unique
        # among those in flight and keeps Horovod's response cache small.
        name = f"sum.{tensor.dtype}.{'x'.join(map(str, tensor.shape))}"
        return self.hvd.allreduce(self._host(tensor), op=self.hvd.Sum, name=name).to(tensor.device)

    def broadcast_(self, tensors: list[torch.Tensor], root: int = 0) -> None:
        for i, t in enumerate(tensors):
            t.data.copy_(self.hvd.broadcast(self._host(t), root_rank=root, name=f"bcast.{i}"))

    def shutdown(self) -> None:
        self.hvd.shutdown()


def make_allreduce(name: str, comm) -> MpiAllreduce | HorovodAllreduce:
    if name == "horovod":
        return HorovodAllreduce(comm)
    if name == "mpi":
        return MpiAllreduce(comm)
    raise ValueError(f"unknown allreduce {name!r}; choose 'horovod' or 'mpi'")
