"""OpenAI Five's per-parameter gradient clip (Berner et al. 2019, appendix C).

Gradients are averaged across the learners, then every scalar parameter's gradient is clipped to
[−k√v, +k√v] (k = 5), where v is a running estimate of the second moment of the *unclipped averaged* gradient:

    v_t = β v_{t−1} + (1 − β) g_t²,      v̂_t = v_t / (1 − β^t)     (bias-corrected, as Adam does)
    g_t ← clip(g_t, −k √v̂_t, +k √v̂_t)

This v is kept apart from Adam's: Adam then sees the clipped gradient and keeps its own moments of it. A sudden
gradient spike is thereby cut to a few standard deviations of the recent gradients of that same parameter.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch


def second_moment_clip(grad: torch.Tensor, v: torch.Tensor, step: int, beta: float = 0.999,
                       k: float = 5.0) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of the clip for one parameter: returns ``(clipped_grad, new_v)``; ``step`` counts from 1."""
    clipped, new_v = grad.clone(), v.clone()
    second_moment_clip_(clipped, new_v, step, beta, k)
    return clipped, new_v


def second_moment_clip_(grad: torch.Tensor, v: torch.Tensor, step: int, beta: float = 0.999, k: float = 5.0) -> int:
    """``second_moment_clip`` in place on ``grad`` and ``v``; returns how many entries were clipped."""
    if step < 1:
        raise ValueError(f"step counts from 1, got {step}")
    if not 0.0 <= beta < 1.0:
        raise ValueError(f"beta must lie in [0, 1), got {beta}")
    v.mul_(beta).addcmul_(grad, grad, value=1.0 - beta)
    bound = v.sqrt().mul_(k / math.sqrt(1.0 - beta ** step))
    clipped = int(torch.count_nonzero(grad.abs() > bound))
    torch.clamp(grad, -bound, bound, out=grad)
    return clipped


class SecondMomentClip:
    """The clip's state (v per parameter, the step count) over a fixed list of parameters.

    ``allreduce_mean`` averages a gradient over the learners (identity for one learner); it is applied before the
    clip so that every learner clips the same averaged gradient with the same v and the parameters stay identical.
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], beta: float = 0.999, k: float = 5.0,
                 allreduce_mean: Callable[[torch.Tensor], torch.Tensor] | None = None):
        if k <= 0.0:
            raise ValueError(f"k must be > 0, got {k}")
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"beta must lie in [0, 1), got {beta}")
        self.params = [p for p in params if p.requires_grad]
        self.beta = beta
        self.k = k
        self.step = 0
        # v and the gradients' flat buffer live where the parameters do: a gradient must be on its parameter's device
        device = self.params[0].device if self.params else torch.device("cpu")
        self.v = torch.zeros(sum(p.numel() for p in self.params), device=device)  # flat, in parameter order
        self.flat = torch.zeros_like(self.v)
        self.views = []
        offset = 0
        for p in self.params:
            self.views.append(self.flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        self.allreduce_mean = allreduce_mean

    @torch.no_grad()
    def __call__(self) -> float:
        """Average and clip every ``p.grad`` in place; returns the fraction of gradient entries that were clipped.

        The gradients live as views of one flat buffer (autograd accumulates into them in place), so the average is
        one allreduce of one buffer, as Horovod fuses them, and the clip is one vectorised pass.
        """
        self.step += 1
        for p, view in zip(self.params, self.views):
            if p.grad is not view:  # set to None or replaced since the last call: move it back into the buffer
                if p.grad is None:
                    view.zero_()
                else:
                    view.copy_(p.grad)
                p.grad = view
        if self.allreduce_mean is not None:
            self.flat.copy_(self.allreduce_mean(self.flat))
        clipped = second_moment_clip_(self.flat, self.v, self.step, self.beta, self.k)
        return clipped / max(self.flat.numel(), 1)

    def state_dict(self) -> dict:
        return {"step": self.step, "v": self.v.clone()}

    def load_state_dict(self, state: dict) -> None:
        if state["v"].shape != self.v.shape:
            raise ValueError(f"state holds v of {tuple(state['v'].shape)} entries, this clip has {tuple(self.v.shape)}")
        self.step = int(state["step"])
        self.v = state["v"].to(self.v.device, copy=True)  # a checkpoint's v is on the CPU, whichever device wrote it
