"""The Go network of AlphaGo Zero and ELF OpenGo: a residual tower with a policy head and a value head.

Input: ``hpc_rl.envs.go.input_planes`` (``NUM_PLANES`` planes of the board seen by the player to move). A 3x3
convolution stem, ``blocks`` residual blocks (two 3x3 convolutions of ``filters`` channels with batch norm, the input
added before the second ReLU), then
- the policy head: a 1x1 convolution to 2 channels, batch norm, ReLU, a linear layer to the size^2 + 1 move logits
  (pass last, as the engine's actions);
- the value head: a 1x1 convolution to 1 channel, batch norm, ReLU, a hidden linear layer of ``filters`` units (256
  in AlphaGo Zero, where filters are 256), ReLU, a linear layer to one output, tanh: the expected outcome for the
  player to move;
- the ownership head (KataGo, Wu 2019): a 1x1 convolution to 1 channel, per point the logit y of tanh(y), who will
  own the point at the end of the game from the player to move's view (+1 theirs, -1 the opponent's). It is an
  auxiliary target: the search never reads it, its loss gives the tower a signal per point where z gives one per
  game.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hpc_rl.envs.go import NUM_PLANES
from hpc_rl.model.config import GoNetConfig


def _conv_bn(c_in: int, c_out: int, kernel: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, kernel, padding=kernel // 2, bias=False), nn.BatchNorm2d(c_out))


class ResidualBlock(nn.Module):
    def __init__(self, filters: int):
        super().__init__()
        self.a, self.b = _conv_bn(filters, filters, 3), _conv_bn(filters, filters, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x + self.b(F.relu(self.a(x))))


class GoNet(nn.Module):
    """(B, NUM_PLANES, size, size) planes → (move logits (B, size^2 + 1), value (B,) in [-1, 1]);
    ``with_ownership`` adds the ownership logits (B, size^2)."""

    def __init__(self, config: GoNetConfig, board_size: int):
        super().__init__()
        self.config, self.board_size = config, board_size
        points, f = board_size * board_size, config.filters
        self.stem = _conv_bn(NUM_PLANES, f, 3)
        self.tower = nn.Sequential(*(ResidualBlock(f) for _ in range(config.blocks)))
        self.policy_conv = _conv_bn(f, 2, 1)
        self.policy_fc = nn.Linear(2 * points, points + 1)
        self.value_conv = _conv_bn(f, 1, 1)
        self.value_fc = nn.Sequential(nn.Linear(points, f), nn.ReLU(), nn.Linear(f, 1))
        self.ownership_conv = nn.Conv2d(f, 1, 1)

    def forward(self, planes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._heads(self._trunk(planes))

    def with_ownership(self, planes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self._trunk(planes)
        return *self._heads(x), self.ownership_conv(x).flatten(1)

    def _trunk(self, planes: torch.Tensor) -> torch.Tensor:
        return self.tower(F.relu(self.stem(planes)))

    def _heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.policy_fc(F.relu(self.policy_conv(x)).flatten(1))
        value = torch.tanh(self.value_fc(F.relu(self.value_conv(x)).flatten(1))).squeeze(1)
        return logits, value


def alphazero_loss(logits: torch.Tensor, value: torch.Tensor, pi: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """AlphaGo Zero's loss without its L2 term (the optimiser's weight decay): (z - v)^2 - pi . log p, batch mean."""
    return ((z - value) ** 2).mean() - (pi * F.log_softmax(logits, dim=1)).sum(1).mean()


def ownership_loss(ownership_logits: torch.Tensor, target: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
    """KataGo's ownership loss without its weight: per point the cross-entropy between the target's owner
    distribution ((1 + o*) / 2 the player to move's, o* in {-1, 0, 1}) and the prediction's ((1 + tanh y) / 2 =
    sigmoid(2y)), the mean over the points, then over the rows that are ``scored`` (games played out; 0 if none)."""
    per_point = F.binary_cross_entropy_with_logits(2 * ownership_logits, (1 + target) / 2, reduction="none")
    per_row = per_point.mean(1)
    weight = scored.to(per_row.dtype)
    return (per_row * weight).sum() / weight.sum().clamp(min=1.0)


class NetEvaluator:
    """``evaluate(planes, legal) -> (priors, values)`` for ``PUCTSearch``: the network in eval mode (batch norm's
    running statistics, so a position's evaluation does not depend on its batch), softmax over the legal moves. What
    the inference ranks run: it reads the network's current weights at every call, on its device."""

    def __init__(self, net: GoNet, device: torch.device | str = "cpu"):
        self.net, self.device = net.eval(), torch.device(device)

    def __call__(self, planes: np.ndarray, legal: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with torch.inference_mode():
            logits, value = self.net(torch.from_numpy(planes).to(self.device))
            legal_t = torch.from_numpy(legal).to(self.device)
            priors = torch.softmax(logits.masked_fill(~legal_t, -torch.inf), dim=1)
        return priors.cpu().numpy(), value.cpu().numpy()


def legal_softmax(logits: np.ndarray, legal: np.ndarray) -> np.ndarray:
    """Softmax of each row's ``logits`` over its ``legal`` entries (every row has one: pass), 0 elsewhere."""
    masked = np.where(legal, logits, -np.inf)
    e = np.exp(masked - masked.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


class FrozenNetEvaluator:
    """``NetEvaluator``'s answers for weights that never change (a ladder's player) on one CPU thread, from ONNX
    Runtime: the network is exported once to ONNX (``torch.onnx.export``), whose optimiser folds batch norm into the
    convolutions. A search's batches are small (1 to 8 leaves), where a PyTorch call's fixed cost is most of its
    time: a 4x32 network's batch of 8 took 0.70 of TorchScript's time (frozen, batch norm folded, oneDNN), a batch
    of one 0.2, and the search at 8 leaves ran 1.4x the simulations a second (docs/go.md, "Strength")."""

    def __init__(self, net: GoNet):
        import logging

        import onnxruntime

        exporter_log = logging.getLogger("torch.onnx")
        level = exporter_log.level
        exporter_log.setLevel(logging.ERROR)  # it lists the torchvision ops it skips registering: none are used
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                program = torch.onnx.export(
                    net.eval(), (torch.zeros(2, NUM_PLANES, net.board_size, net.board_size),), dynamo=True,
                    input_names=["planes"], output_names=["logits", "value"],
                    dynamic_shapes=({0: torch.export.Dim("batch")},), verbose=False)
        finally:
            exporter_log.setLevel(level)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1  # one core per player, as its opponents
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = onnxruntime.InferenceSession(program.model_proto.SerializeToString(), options,
                                                    providers=["CPUExecutionProvider"])

    def __call__(self, planes: np.ndarray, legal: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        logits, value = self.session.run(None, {"planes": np.ascontiguousarray(planes, dtype=np.float32)})
        # The runtime's tanh is an approximation that reaches 1.0000001 where it saturates; the search takes values
        # in [-1, 1] only.
        return legal_softmax(logits, legal), np.clip(value, -1.0, 1.0)
