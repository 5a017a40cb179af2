"""Segments on the wire: one inference rank's ``Batch`` for the agents of one env rank, as one ring payload.

A segment holds ``segment_len`` steps of every agent of one env rank (time-major, as ``hpc_rl.data.batch.Batch``):
observations, actions, behaviour log-probability and value, shaped rewards, dones, the training weight (0 for steps
not to train on: scripted or past-version opponents), the behaviour policy version per step, the LSTM state at every
BPTT chunk start, the bootstrap value, and the accounting ids (env rank, that env rank's segment number).

Learners check every segment before training on it (``validate``): a malformed one is rejected and counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from hpc_rl.envs.api import EnvSpec
from hpc_rl.model.policy import HEADS
from hpc_rl.data.batch import Batch
from hpc_rl.transport.layout import ArrayLayout


class SegmentError(ValueError):
    """A segment that must not be trained on."""


@dataclass(frozen=True)
class SegmentShape:
    spec: EnvSpec
    num_agents: int  # agents of one env rank: copies × agents per copy
    segment_len: int
    chunk_len: int
    lstm_size: int
    fp16_observations: bool = False

    def layout(self) -> ArrayLayout:
        T, B = self.segment_len, self.num_agents
        fields = {}
        for key, (shape, dtype) in self.spec.observation_shapes(1).items():
            fields[f"obs/{key}"] = ((T, B) + shape[2:], dtype)
        fields["hero"] = ((T, B), np.int64)
        fields["starts"] = ((T, B), bool)
        for head in HEADS:
            fields[f"actions/{head}"] = ((T, B), np.int64)
        for name in ("logp", "value", "reward", "weight"):
            fields[name] = ((T, B), np.float32)
        fields["done"] = ((T, B), bool)
        fields["version"] = ((T, B), np.int64)
        chunks = T // self.chunk_len
        fields["chunk_h"] = ((chunks, B, self.lstm_size), np.float32)
        fields["chunk_c"] = ((chunks, B, self.lstm_size), np.float32)
        fields["bootstrap_value"] = ((B,), np.float32)
        fields["ids"] = ((2,), np.int64)  # env rank, segment number of that env rank
        half = [k for k, (_, dt) in fields.items() if k.startswith("obs/") and np.dtype(dt) == np.float32]
        return ArrayLayout(fields, half=half if self.fp16_observations else ())


def pack_segment(layout: ArrayLayout, batch: Batch, env_rank: int, seq: int, out: np.ndarray | None = None) -> np.ndarray:
    arrays = {f"obs/{k}": v.numpy() for k, v in batch.obs.items()}
    arrays.update({f"actions/{k}": v.numpy() for k, v in batch.actions.items()})
    arrays.update(hero=batch.hero.numpy(), starts=batch.starts.numpy(), logp=batch.logp.numpy(),
                  value=batch.value.numpy(), reward=batch.reward.numpy(), weight=batch.weight.numpy(),
                  done=batch.done.numpy(), version=batch.version.numpy(), chunk_h=batch.chunk_h.numpy(),
                  chunk_c=batch.chunk_c.numpy(), bootstrap_value=batch.bootstrap_value.numpy(),
                  ids=np.array([env_rank, seq], dtype=np.int64))
    return layout.pack(arrays, out)


def unpack_segment(layout: ArrayLayout, payload: np.ndarray) -> tuple[Batch, int, int]:
    """``(batch, env_rank, seq)``; the batch owns its memory (the payload may be reused)."""
    if payload.size < layout.nbytes:
        raise SegmentError(f"segment of {payload.size} bytes, the layout needs {layout.nbytes}")
    a = {k: torch.from_numpy(np.array(v)) for k, v in layout.unpack(payload).items()}
    obs = {k[4:]: v for k, v in a.items() if k.startswith("obs/")}
    actions = {k[8:]: v for k, v in a.items() if k.startswith("actions/")}
    batch = Batch(obs, a["hero"], a["starts"], actions, a["logp"], a["value"], a["reward"], a["done"], a["weight"],
                  a["version"], a["chunk_h"], a["chunk_c"], a["bootstrap_value"])
    env_rank, seq = (int(x) for x in a["ids"])
    return batch, env_rank, seq


def validate(batch: Batch, spec: EnvSpec, max_version: int) -> None:
    """Raise SegmentError if the segment cannot be trained on: non-finite numbers, actions out of range or illegal
    under the stored masks, weights outside [0, 1], or a behaviour version from the future."""
    for name in ("logp", "value", "reward", "weight", "chunk_h", "chunk_c", "bootstrap_value"):
        if not torch.isfinite(getattr(batch, name)).all():
            raise SegmentError(f"non-finite values in {name}")
    for key, value in batch.obs.items():
        if value.is_floating_point() and not torch.isfinite(value).all():
            raise SegmentError(f"non-finite values in observation {key}")
    if ((batch.weight < 0) | (batch.weight > 1)).any():
        raise SegmentError("training weights outside [0, 1]")
    trained = batch.weight > 0
    action = batch.actions["action"]
    if ((action < 0) | (action >= spec.num_actions)).any():
        raise SegmentError("primary action out of range")
    legal = torch.gather(batch.obs["action_mask"], -1, action.clamp(0, spec.num_actions - 1).unsqueeze(-1)).squeeze(-1)
    if (trained & ~legal).any():
        raise SegmentError("an action illegal under its action mask")
    if (batch.version[trained] > max_version).any():
        raise SegmentError(f"behaviour version beyond the learner's {max_version}")
    if trained.any() and not (batch.logp[trained] <= 1e-4).all():
        raise SegmentError("behaviour log-probabilities above 0")


def concat(batches: list[Batch]) -> Batch:
    """Join segments along the agent axis into one learner batch."""
    if not batches:
        raise ValueError("no segments to join")
    cat = lambda xs, dim=1: torch.cat(xs, dim=dim)  # noqa: E731 - a local shorthand
    b0 = batches[0]
    return Batch(
        {k: cat([b.obs[k] for b in batches]) for k in b0.obs},
        cat([b.hero for b in batches]), cat([b.starts for b in batches]),
        {k: cat([b.actions[k] for b in batches]) for k in b0.actions},
        cat([b.logp for b in batches]), cat([b.value for b in batches]), cat([b.reward for b in batches]),
        cat([b.done for b in batches]), cat([b.weight for b in batches]), cat([b.version for b in batches]),
        cat([b.chunk_h for b in batches]), cat([b.chunk_c for b in batches]),
        cat([b.bootstrap_value for b in batches], dim=0),
    )
