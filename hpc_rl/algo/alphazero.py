"""AlphaZero's learner for Go (AlphaGo Zero, ELF OpenGo): a FIFO replay buffer of self-play positions and the update
``(z - v)^2 - pi . log p + c ||theta||^2`` on minibatches drawn from it, as a learner rank runs them: uniformly
(AlphaGo Zero), or black's wins and white's evenly (ELF OpenGo, ``sample_even_wins``). KataGo's ownership target
adds ``w_o`` times the ownership head's loss over the positions of games played out. Each drawn position may be seen
in one of the board's 8 symmetries at random (AlphaGo Zero's augmentation, ``in_symmetries``).

With several learners in lockstep, ``allreduce_sum`` sums a tensor over them: gradients are averaged before the
optimiser's step and batch norm's running statistics after it, so every learner holds the same network.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from hpc_rl import metric_names as M
from hpc_rl.algo.config import AlphaZeroConfig
from hpc_rl.algo.reduce import Reduce, identity_reduce
from hpc_rl.envs.go import NUM_SYMMETRIES, symmetry_boards, symmetry_points
from hpc_rl.model.go_net import GoNet, alphazero_loss, ownership_loss
from hpc_rl.model.tree import to_numpy_tree, to_torch_tree


def win_group_shares(winners: np.ndarray) -> tuple[float, float, float]:
    """The shares of a minibatch drawn from positions of games black won, white won, and drawn, under ELF OpenGo's
    remedy for a self-play that drifts to one colour's wins (its value head then calls every position lost for the
    other, and the games collapse into early resignations): draws keep their share of the buffer, the decided
    positions are split evenly between black's wins and white's (all to one colour while the other has none)."""
    winners = np.asarray(winners)
    black, white = int((winners == 0).sum()), int((winners == 1).sum())
    draw = 1.0 - (black + white) / len(winners)
    decided = 1.0 - draw
    if black and white:
        return decided / 2, decided / 2, draw
    return (decided, 0.0, draw) if black else (0.0, decided, draw)


def sample_even_wins(winners: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` rows of ``winners`` (each row's game's winner: 0 black, 1 white, -1 a draw), with replacement: how many
    from each group by ``win_group_shares``, uniformly within the group."""
    counts = rng.multinomial(n, win_group_shares(winners))
    return np.concatenate([rng.choice(np.flatnonzero(winners == w), k) for w, k in zip((0, 1, -1), counts) if k])


def in_symmetries(batch: dict[str, np.ndarray], ks: np.ndarray) -> dict[str, np.ndarray]:
    """``batch`` (``ReplayBuffer.sample``'s arrays) with position i seen in the board's symmetry ``ks[i]``
    (``hpc_rl.envs.go.symmetry_boards``): its planes, its search's visit shares ``pi`` and its ownership target move
    together, the pass's share stays; its outcome z, winner and version are the same position's."""
    out = {**batch, "planes": batch["planes"].copy(), "pi": batch["pi"].copy(), "ownership": batch["ownership"].copy()}
    size = batch["planes"].shape[-1]
    for k in range(1, NUM_SYMMETRIES):
        rows = np.flatnonzero(ks == k)
        if len(rows):
            out["planes"][rows] = symmetry_boards(batch["planes"][rows], k)
            out["pi"][rows] = symmetry_points(batch["pi"][rows], size, k)
            out["ownership"][rows] = symmetry_points(batch["ownership"][rows], size, k)
    return out


class ReplayBuffer:
    """The positions of recent games, first in first out: ``capacity`` positions; a new one replaces the oldest.
    ``sample`` draws uniformly over those held (with replacement, as AlphaGo Zero's "sampled uniformly"), or with
    ``even_wins`` black's wins and white's evenly (``sample_even_wins``), with ``symmetries`` each in one of the
    board's 8 symmetries drawn uniformly (``in_symmetries``). Each position keeps its ownership target
    (``hpc_rl.envs.go_search.ownership_targets``) and whether its game was ``scored`` (played out, not resigned:
    only then is the final board's ownership a target)."""

    ARRAYS = ("planes", "pi", "z", "version", "winner", "ownership", "scored")  # one row per position

    def __init__(self, capacity: int, board_size: int, num_planes: int):
        self.capacity = capacity
        points = board_size * board_size
        self.planes = np.zeros((capacity, num_planes, board_size, board_size), np.float32)
        self.pi = np.zeros((capacity, points + 1), np.float32)
        self.z = np.zeros(capacity, np.float32)
        self.version = np.zeros(capacity, np.int64)  # the network version that played the position
        self.winner = np.zeros(capacity, np.int64)  # its game's winner: 0 black, 1 white, -1 a draw
        self.ownership = np.zeros((capacity, points), np.int8)  # the final owners, the player to move's view
        self.scored = np.zeros(capacity, bool)  # its game was played out to a scored end
        self.size = 0
        self.next = 0  # the slot the next position goes to: the oldest once the buffer is full
        self.added = 0  # positions ever added

    def add(self, planes: np.ndarray, pi: np.ndarray, z: np.ndarray, version: np.ndarray, winner: int, *,
            ownership: np.ndarray, scored: bool) -> None:
        """Append one game's positions in order; ``winner``: the game's (0 black, 1 white, -1 a draw);
        ``ownership`` (T, size^2) its positions' ownership targets; ``scored``: the game was played out."""
        n = len(z)
        if n > self.capacity:  # only the newest fit
            planes, pi, z, version, ownership = (a[-self.capacity:] for a in (planes, pi, z, version, ownership))
            self.added += n - self.capacity
            n = self.capacity
        rows = (self.next + np.arange(n)) % self.capacity
        self.planes[rows], self.pi[rows], self.z[rows], self.version[rows] = planes, pi, z, version
        self.winner[rows], self.ownership[rows], self.scored[rows] = winner, ownership, scored
        self.next = (self.next + n) % self.capacity
        self.size = min(self.size + n, self.capacity)
        self.added += n

    def order(self) -> np.ndarray:
        """The rows held, oldest first."""
        start = self.next if self.size == self.capacity else 0
        return (start + np.arange(self.size)) % self.capacity

    def state(self) -> dict[str, np.ndarray]:
        """The positions held, oldest first (what ``restore`` takes back)."""
        rows = self.order()
        return self._rows(rows)

    def restore(self, state: dict[str, np.ndarray], up_to_version: int) -> int:
        """Fill an empty buffer with ``state``'s positions played by versions up to ``up_to_version`` (a run resumed
        from an earlier checkpoint than the buffer's holds no games of later networks), the newest ``capacity`` of
        them. Returns how many it holds."""
        if self.size:
            raise ValueError("restoring into a buffer that holds positions")
        shapes = {name: getattr(self, name).shape[1:] for name in self.ARRAYS}
        for name, shape in shapes.items():
            if name not in state or state[name].shape[1:] != shape:
                got = state[name].shape[1:] if name in state else "missing"
                raise ValueError(f"replay buffer {name!r}: rows of shape {got}, this buffer holds {shape}")
        keep = np.flatnonzero(state["version"] <= up_to_version)[-self.capacity:]
        n = len(keep)
        for name in shapes:
            getattr(self, name)[:n] = state[name][keep]
        self.size, self.next, self.added = n, n % self.capacity, n
        return n

    def black_win_share(self) -> float:
        """The share of the positions held that come from games black won."""
        return float((self.winner[:self.size] == 0).mean()) if self.size else 0.0

    def sample(self, n: int, rng: np.random.Generator, even_wins: bool = False,
               symmetries: bool = False) -> dict[str, np.ndarray]:
        if self.size == 0:
            raise ValueError("sampling an empty replay buffer")
        rows = sample_even_wins(self.winner[:self.size], n, rng) if even_wins else rng.integers(0, self.size, n)
        batch = self._rows(rows)
        return in_symmetries(batch, rng.integers(0, NUM_SYMMETRIES, n)) if symmetries else batch

    def _rows(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        return {name: getattr(self, name)[rows] for name in self.ARRAYS}


class AlphaZeroLearner:
    """``update(planes, pi, z, ownership, scored) -> metrics``: one gradient step, one network version per call."""

    def __init__(self, net: GoNet, config: AlphaZeroConfig, allreduce_sum: Reduce = identity_reduce,
                 world_size: int = 1, device: torch.device | str = "cpu"):
        self.net, self.config = net, config
        self.allreduce_sum, self.world_size = allreduce_sum, world_size
        self.device = torch.device(device)
        params = list(net.parameters())
        if config.optimizer == "sgd":
            self.optimizer = torch.optim.SGD(params, lr=config.lr, momentum=config.momentum,
                                             weight_decay=config.weight_decay)
        else:
            self.optimizer = torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay)
        self.version = 0

    def update(self, planes: np.ndarray, pi: np.ndarray, z: np.ndarray, ownership: np.ndarray,
               scored: np.ndarray) -> dict[str, float]:
        started = time.perf_counter()
        lr = self.config.learning_rate(self.version)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.net.train()
        logits, value, owner_logits = self.net.with_ownership(torch.from_numpy(planes).to(self.device))
        pi_t, z_t = torch.from_numpy(pi).to(self.device), torch.from_numpy(z).to(self.device)
        value_loss = ((z_t - value) ** 2).mean()
        owner_loss = ownership_loss(owner_logits, torch.from_numpy(ownership).to(self.device, torch.float32),
                                    torch.from_numpy(scored).to(self.device))
        az_loss = alphazero_loss(logits, value, pi_t, z_t)
        loss = az_loss + self.config.ownership_weight * owner_loss
        self.optimizer.zero_grad(set_to_none=False)
        loss.backward()
        finite = self.allreduce_sum(torch.tensor([0.0 if torch.isfinite(loss) else 1.0])).item() == 0
        if finite:
            if self.world_size > 1:
                self._average([p.grad for p in self.net.parameters()])
            self.optimizer.step()
        if self.world_size > 1:  # batch norm's running statistics saw this learner's batch only
            self._average([b for b in self.net.buffers() if b.is_floating_point()])
        self.version += 1
        return {M.LOSS: float(loss.detach()), M.VALUE_LOSS: float(value_loss.detach()),
                M.POLICY_LOSS: float((az_loss - value_loss).detach()), M.OWNERSHIP_LOSS: float(owner_loss.detach()),
                M.LR: lr,
                M.NONFINITE_SKIPPED: 0.0 if finite else 1.0, M.UPDATE_SECONDS: time.perf_counter() - started}

    def _average(self, tensors: list[torch.Tensor]) -> None:
        """Every learner's mean of ``tensors``, in place, in one allreduce."""
        flat = torch.cat([t.reshape(-1) for t in tensors])
        flat = self.allreduce_sum(flat) / self.world_size
        offset = 0
        for t in tensors:
            t.copy_(flat[offset:offset + t.numel()].reshape(t.shape))
            offset += t.numel()

    def checkpoint_sections(self) -> dict:
        """The state as a checkpoint's sections: the network (parameters and batch norm's statistics, under
        ``params``), the optimiser's momenta, the version."""
        return {"params": to_numpy_tree(self.net.state_dict()), "optimizer": to_numpy_tree(self.optimizer.state_dict()),
                "learner": {"version": self.version}}

    def load_checkpoint_sections(self, sections: dict) -> None:
        self.net.load_state_dict(to_torch_tree(sections["params"]))
        self.optimizer.load_state_dict(to_torch_tree(sections["optimizer"]))
        self.version = int(sections["learner"]["version"])
