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
