"""The learner's hyperparameters, importable without torch (a sweep is composed on a login node)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hpc_rl.algo.schedules import Schedule, constant

PRECISIONS = ("float32", "bfloat16")


@dataclass(frozen=True)
class PPOConfig:
    """The learner's hyperparameters; schedules are functions of the policy version."""

    # The defaults are one configuration for every task (docs/LEARNING.md measures each choice): CleanRL's and
    # Stable-Baselines3's PPO conventions, with 10 epochs at 1e-3 for sample efficiency on small batches.
    lr: Schedule = field(default_factory=lambda: constant(1e-3))  # Adam learning rate
    entropy_coef: Schedule = field(default_factory=lambda: constant(0.0))  # weight of the entropy bonus
    gamma: Schedule = field(default_factory=lambda: constant(0.99))  # discount
    team_spirit: Schedule = field(default_factory=lambda: constant(0.0))  # τ: share of the team's mean reward
    # Kickstarting (Schmitt et al. 2018): weight of the cross-entropy −log π(a_teacher | s) of the teacher's action
    # (env.teacher's labels); anneal it to 0 so that RL takes over from the teacher. 0: off.
    kickstart_coef: Schedule = field(default_factory=lambda: constant(0.0))
    lam: float = 0.95  # GAE λ
    # Bootstrap a game that a time limit ended (the env's step info ``truncated``: Gymnasium's TimeLimit) with its
    # last state's value rather than take it as a terminal state (hpc_rl.algo.gae; Pardo et al. 2018). Off by
    # default: on held-out seeds it cost MountainCar two of five solves, whose exploration the terminal reading of
    # its 200-step limit helps (docs/LEARNING.md).
    time_limit_bootstrap: bool = False
    clip_eps: float = 0.2  # PPO ratio clip ε
    dual_clip: float | None = 3.0  # Honor of Kings' lower bound c for negative advantages; None: plain PPO
    value_coef: float = 0.5  # weight of the value loss
    value_clip: float | None = None  # PPO2's value clip around the behaviour value; None: unclipped
    # The value head learns returns standardised by their running mean and std (the learners' statistics of every
    # return they trained on): the value loss has the same scale whatever the rewards' scale, so value_coef needs no
    # per-task tuning (without it CartPole's returns near 1/(1 − γ) swamp the policy gradient).
    value_norm: bool = True
    epochs: int = 10  # passes over each batch
    num_minibatches: int = 4  # minibatches per pass, split along BPTT chunks
    normalize_advantages: bool = True  # z-score advantages over the whole batch (of every learner)
    clip_k: float = 5.0  # OpenAI Five's per-parameter clip to ±k√v
    clip_beta: float = 0.999  # decay of the clip's running second moment v
    max_grad_norm: float | None = None  # an optional global-norm clip after the per-parameter one
    adam_eps: float = 1e-5
    # The learner's forward pass and losses: "float32", or "bfloat16" (mixed precision: autocast to bf16 where
    # PyTorch deems it safe; parameters, gradients, Adam and the clip stay float32). docs/GPU.md measures both.
    precision: str = "float32"
    # The learning rate is 0 before this version (0: never). A run made by model surgery (jobs/surgery.py) sets it a
    # few versions past the surgery's: the learner then steps with lr 0, so that the Adam moments and clip statistics
    # it reset for the changed parameters re-form from fresh gradients before they move any parameter (OpenAI Five
    # held the learning rate at 0 for hours after each surgery).
    lr_zero_until: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"lam must lie in [0, 1], got {self.lam}")
        if self.epochs < 1 or self.num_minibatches < 1:
            raise ValueError(f"epochs ({self.epochs}) and num_minibatches ({self.num_minibatches}) must be >= 1")
        if self.value_coef < 0:
            raise ValueError(f"value_coef must be >= 0, got {self.value_coef}")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm must be > 0 or None, got {self.max_grad_norm}")
        if self.clip_k <= 0:
            raise ValueError(f"clip_k must be > 0, got {self.clip_k}")
        if self.lr_zero_until < 0:
            raise ValueError(f"lr_zero_until must be >= 0, got {self.lr_zero_until}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")

    def learning_rate(self, version: int) -> float:
        """The Adam learning rate of the update that makes ``version + 1``: the schedule, or 0 before
        ``lr_zero_until``."""
        return 0.0 if version < self.lr_zero_until else self.lr(version)


OPTIMIZERS = ("sgd", "adam")


@dataclass(frozen=True)
class AlphaZeroConfig:
    """The Go learners' hyperparameters (``env.name=go``; hpc_rl.algo.alphazero): AlphaGo Zero's loss
    (z - v)^2 - pi . log p + c ||theta||^2 on minibatches drawn uniformly from a FIFO replay buffer of the positions of
    recent self-play games. ELF OpenGo: SGD with momentum 0.9, c = 1e-4, learning rate 0.01 dropped tenfold twice,
    a buffer of the latest 500,000 games, black's and white's wins sampled evenly; no gating (AlphaZero, ELF). AlphaGo
    Zero's augmentation: each drawn position in one of the board's 8 symmetries. KataGo's ownership target adds w_o
    times the ownership head's loss (``hpc_rl.model.go_net.ownership_loss``)."""

    replay_positions: int = 500_000  # each learner's buffer, in positions (ELF keeps games: ~0.5M games of ~200 moves)
    min_positions: int = 10_000  # no update before every learner holds this many
    batch_size: int = 256  # positions per learner and update (the global batch is this x learners; ELF: 2,048)
    optimizer: str = "sgd"  # "sgd" (with momentum, AlphaGo Zero and ELF) or "adam"
    momentum: float = 0.9
    weight_decay: float = 1e-4  # c, the L2 weight (AlphaGo Zero's 1e-4), as the optimiser's weight decay
    lr: float = 0.01
    lr_drops: tuple[int, ...] = ()  # versions from which the learning rate is multiplied by lr_drop_factor once more
    lr_drop_factor: float = 0.1
    # Positions sampled by the updates / positions received the learners keep to: on few cores the learners would
    # otherwise train each game's positions hundreds of times while the games are played (None: no throttle).
    target_reuse: float | None = 8.0
    # Minibatches draw black's wins and white's evenly (ELF OpenGo), not uniformly over the buffer (AlphaGo Zero).
    even_wins: bool = True
    # Each drawn position is seen in one of the board's 8 symmetries at random (AlphaGo Zero): 8 positions for one
    # played, where self-play is what a small machine has least of.
    symmetries: bool = True
    # The weight of the ownership head's loss (KataGo: 1.5 on the mean over the points); 0: the head is not trained.
    ownership_weight: float = 1.5

    def __post_init__(self) -> None:
        object.__setattr__(self, "lr_drops", tuple(int(v) for v in self.lr_drops))  # Hydra gives a list
        for name in ("replay_positions", "batch_size", "min_positions"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.min_positions > self.replay_positions:
            raise ValueError(f"min_positions ({self.min_positions}) must not exceed replay_positions "
                             f"({self.replay_positions})")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum must lie in [0, 1), got {self.momentum}")
        if self.weight_decay < 0 or not self.lr > 0 or not 0 < self.lr_drop_factor <= 1:
            raise ValueError(f"weight_decay must be >= 0, lr > 0 and lr_drop_factor in (0, 1], got "
                             f"{self.weight_decay}, {self.lr}, {self.lr_drop_factor}")
        if list(self.lr_drops) != sorted(set(self.lr_drops)) or any(v < 1 for v in self.lr_drops):
            raise ValueError(f"lr_drops must be increasing versions >= 1, got {list(self.lr_drops)}")
        if not self.ownership_weight >= 0:
            raise ValueError(f"ownership_weight must be >= 0, got {self.ownership_weight}")
        if self.target_reuse is not None and not self.target_reuse > 0:
            raise ValueError(f"target_reuse must be > 0 or None, got {self.target_reuse}")

    def learning_rate(self, version: int) -> float:
        """The step schedule: ``lr`` times ``lr_drop_factor`` for every drop at or before ``version``."""
        return self.lr * self.lr_drop_factor ** sum(version >= v for v in self.lr_drops)
