"""Sums over learners: the seam through which the maths of one learner becomes the maths of several."""

from collections.abc import Callable

import torch

Reduce = Callable[[torch.Tensor], torch.Tensor]


def identity_reduce(x: torch.Tensor) -> torch.Tensor:
    """The sum over one process: the tensor itself."""
    return x
