"""What the roles say to each other: control message tags, the step messages' layouts, the parameter payload.

Data travels as byte buffers through the transport's channels; this module is the one place that says what the
bytes mean (the segment's layout is derived from the batch schema, ``hpc_rl.data.batch``). Control messages are
small pickled objects on a communicator of their own, tagged as below.
"""

from __future__ import annotations

import numpy as np
import torch

from hpc_rl.envs.api import EnvSpec
from hpc_rl.model.policy import HEADS
from hpc_rl.transport.layout import ArrayLayout

CONTROLLER = 0  # the controller's rank

# Control message tags.
TAG_RESUME = 1  # controller -> learners at start-up: the checkpoint sections to resume from
TAG_HEARTBEAT = 11  # any rank -> controller: {"stats": {...}} (throughput counters ride along)
TAG_METRICS = 12  # learner 0 -> controller: one published version's metrics
TAG_CHECKPOINT = 13  # learner 0 -> controller: (version, sections) to commit
TAG_STOP = 14  # controller -> learner 0: stop at this version; controller -> env ranks: stop now
TAG_DONE = 15  # learner 0 -> controller: the learners stopped at this version
TAG_ACCOUNTING = 16  # every inference and learner rank -> controller at the end: segment ids produced/consumed
TAG_POOL = 17  # controller -> inference ranks: the opponent pool {"versions": [...], "qualities": [...]}
TAG_POOL_RESULT = 18  # inference rank -> controller: [(past version, score of the learning side), ...]
TAG_EVALUATION = 19  # evaluator rank -> controller: one version's games against the reference agents
TAG_HALT = 20  # learner 0 -> controller: the learners halted on non-finite losses (the message says why)
TAG_STAGE = 21  # controller -> env ranks: the policy reached this version, which ends the curriculum's warm-up
#                or sets the share of games under the new game version (env.new_version_share)


def request_layout(spec: EnvSpec, num_envs: int, fp16: bool) -> ArrayLayout:
    """env -> inference, every step: the observations, then what the previous step produced (reward events, dones,
    winners, game time and the spec's ``step_infos``), and a stop flag (the env's last message)."""
    observations = spec.observation_shapes(num_envs)
    fields = dict(observations)
    fields["events"] = ((num_envs, spec.num_agents, len(spec.reward_events)), np.dtype(np.float32))
    fields["done"] = ((num_envs,), np.dtype(bool))
    fields["winner"] = ((num_envs,), np.dtype(np.int64))
    fields["game_time"] = ((num_envs,), np.dtype(np.float32))
    for info in spec.step_infos:
        fields[f"info/{info.name}"] = ((num_envs, spec.num_agents) + info.shape, np.dtype(info.dtype))
    fields["stop"] = ((1,), np.dtype(bool))
    half = [k for k, (_, dt) in observations.items() if np.dtype(dt) == np.float32]
    return ArrayLayout(fields, half=half if fp16 else ())


def reply_layout(spec: EnvSpec, num_envs: int) -> ArrayLayout:
    """inference -> env, every step: one int64 array (E, A) per action head."""
    return ArrayLayout({head: ((num_envs, spec.num_agents), np.dtype(np.int64)) for head in HEADS})


def go_request_layout(num_leaves: int, board_size: int) -> ArrayLayout:
    """env -> inference, every search step of Go's self-play (``env.name=go``): the input planes and legal moves of
    the step's leaves (at most ``num_leaves``: the env rank's games x ``leaves_per_game``), the first ``count`` rows
    used, and a stop flag (the env's last message)."""
    from hpc_rl.envs.go import NUM_PLANES

    actions = board_size * board_size + 1
    return ArrayLayout({"planes": ((num_leaves, NUM_PLANES, board_size, board_size), np.dtype(np.float32)),
                        "legal": ((num_leaves, actions), np.dtype(bool)), "count": ((1,), np.dtype(np.int64)),
                        "stop": ((1,), np.dtype(bool))})


def go_reply_layout(num_leaves: int, board_size: int) -> ArrayLayout:
    """inference -> env, every Go search step: each leaf's priors (softmax over its legal moves) and value for its
    player to move (the request's first ``count`` rows), and the network version that computed them."""
    return ArrayLayout({"priors": ((num_leaves, board_size * board_size + 1), np.dtype(np.float32)),
                        "values": ((num_leaves,), np.dtype(np.float32)), "version": ((1,), np.dtype(np.int64))})


# The parameter payload: the version as one int64, then the policy's (or Go network's) parameters and buffers (the
# observation normaliser; batch norm's statistics) as float32, in state_dict order.
_VERSION_BYTES = 8


def parameter_bytes(module: torch.nn.Module) -> int:
    return _VERSION_BYTES + 4 * sum(t.numel() for t in module.state_dict().values())


def encode_parameters(version: int, module: torch.nn.Module) -> np.ndarray:
    vector = torch.cat([t.detach().reshape(-1).float().cpu() for t in module.state_dict().values()]).numpy()
    payload = np.empty(_VERSION_BYTES + vector.nbytes, np.uint8)
    payload[:_VERSION_BYTES].view(np.int64)[0] = version
    payload[_VERSION_BYTES:].view(np.float32)[:] = vector
    return payload


def decode_parameters(payload: np.ndarray, module: torch.nn.Module) -> int:
    """Load the payload's parameters into ``module``; returns their version."""
    tensors = list(module.state_dict().values())
    vector = payload[_VERSION_BYTES:].view(np.float32)
    sizes = [t.numel() for t in tensors]
    if vector.size != sum(sizes):
        raise ValueError(f"parameter payload of {vector.size} values, the policy has {sum(sizes)}")
    # One tensor over the whole vector, split into views: the inference rank loads every version, and a conversion
    # per parameter took half of the load's time. ``copy_`` casts to each tensor's dtype.
    for t, part in zip(tensors, torch.from_numpy(vector).split(sizes)):
        t.copy_(part.view(t.shape))
    return int(payload[:_VERSION_BYTES].view(np.int64)[0])
