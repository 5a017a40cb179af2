"""The learning maths as pure functions of tensors: advantages, losses, gradient clipping, normalisation, rewards.

Nothing here knows of MPI. Where several learners must agree (advantage statistics, gradient averages, normaliser
statistics), a function takes a ``reduce`` callable that sums a tensor over the learners; the default (identity) is
the single-process case, and a distributed learner passes its allreduce.
"""

from collections.abc import Callable

import torch

Reduce = Callable[[torch.Tensor], torch.Tensor]


def identity_reduce(x: torch.Tensor) -> torch.Tensor:
    """The sum over one process: the tensor itself."""
    return x
