"""Go's settings, importable without numba or torch (``hpc_rl.config`` composes them): the game, the search of
every move (``PUCTConfig``, run by ``hpc_rl.envs.go_search``), the network (``GoNetConfig``) and the gating of new
networks (``GatingConfig``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hpc_rl.model.config import GoNetConfig

BOARD_SIZES = (5, 19)  # the engine's smallest and largest boards


@dataclass(frozen=True)
class PUCTConfig:
    """The search's and the self-play move choice's settings; the defaults are ELF OpenGo's training workers'."""

    simulations: int = 1600  # per move, the root's expansion included (AlphaGo Zero's and ELF's 1,600)
    c_puct: float = 1.5  # ELF's (section 5.1); AlphaGo Zero and AlphaZero leave it unstated
    # The Q of an unvisited child: None, 0 (AlphaGo Zero); r >= 0, the parent's mean value for the player to move
    # less r * sqrt(prior mass of the visited children) (Leela Zero's first-play urgency reduction; KataGo's 0.2).
    fpu_reduction: float | None = None
    virtual_loss: float = 1.0  # ELF's: an in-flight path counts as a lost visit (section 5.2)
    leaves_per_game: int = 1  # paths in flight per game and step; the batch is games x this
    dirichlet_alpha: float = 0.03  # root noise Dir(alpha) (AlphaGo Zero, 19x19; AlphaZero scales it ~ 10 / moves)
    dirichlet_weight: float = 0.25  # epsilon: P = (1 - epsilon) p + epsilon eta at the root; 0: no noise
    temperature: float = 1.0  # moves drawn from N^(1 / temperature); 0: the most visited (ELF: 1 for all moves)
    greedy_after: int | None = None  # from this move on, the most visited (AlphaGo Zero, AlphaZero: 30); None: never
    # A player resigns when the search's value for it is below the threshold. None: nobody ever resigns. With
    # resign_false_positives None, this fixed threshold; with a target, the calibrated one, never above this cap.
    resign_threshold: float | None = -0.9
    resign_playout_share: float = 0.1  # games that never resign, to measure the threshold's false positives (AGZ)
    # AlphaGo Zero's calibration: the threshold is the highest at which at most this share of the last
    # resign_calibration_games calibration games (played out) would have seen the player who did not lose resign;
    # nobody resigns before that many are in (every game is played out until then). None: the fixed threshold.
    resign_false_positives: float | None = 0.05
    resign_calibration_games: int = 100
    # KataGo's playout cap randomisation (Wu 2019, section 3.1): with fast_simulations set, each move of self-play is
    # searched at full ``simulations`` with probability full_search_share, with root noise, and its position is
    # recorded for training; the other moves are searched at fast_simulations without noise and only played. Games
    # then cost fewer simulations, so more of them (more independent value targets) come from the same compute,
    # while every policy target still comes from a full search. None: every move full and recorded (AlphaZero).
    fast_simulations: int | None = None
    full_search_share: float = 0.25
    # The search considers a pass only after the opponent's pass or when every legal stone would fill one of the
    # player's own one-point eyes (hpc_rl.envs.go.passes_held_back). False: a pass is searched as any move (ELF).
    restrict_passes: bool = False

    def __post_init__(self) -> None:
        if self.simulations < 2:
            raise ValueError(f"simulations must be >= 2 (the first expands the root), got {self.simulations}")
        if self.leaves_per_game < 1:
            raise ValueError(f"leaves_per_game must be >= 1, got {self.leaves_per_game}")
        for name in ("c_puct", "virtual_loss", "temperature"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.fpu_reduction is not None and not 0 <= self.fpu_reduction <= 2:
            raise ValueError(f"fpu_reduction must lie in [0, 2] or be None, got {self.fpu_reduction}")
        if not self.dirichlet_alpha > 0:
            raise ValueError(f"dirichlet_alpha must be > 0, got {self.dirichlet_alpha}")
        for name in ("dirichlet_weight", "resign_playout_share"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must lie in [0, 1], got {getattr(self, name)}")
        if self.greedy_after is not None and self.greedy_after < 0:
            raise ValueError(f"greedy_after must be >= 0 or None, got {self.greedy_after}")
        if self.resign_threshold is not None and not -1 <= self.resign_threshold <= 1:
            raise ValueError(f"resign_threshold must lie in [-1, 1] or be None, got {self.resign_threshold}")
        if self.resign_false_positives is not None and not 0 <= self.resign_false_positives < 1:
            raise ValueError(f"resign_false_positives must lie in [0, 1) or be None, got {self.resign_false_positives}")
        if self.resign_calibration_games < 1:
            raise ValueError(f"resign_calibration_games must be >= 1, got {self.resign_calibration_games}")
        if self.fast_simulations is not None and not 2 <= self.fast_simulations <= self.simulations:
            raise ValueError(f"fast_simulations must lie in [2, simulations ({self.simulations})] or be None, got "
                             f"{self.fast_simulations}")
        if not 0 < self.full_search_share <= 1:
            raise ValueError(f"full_search_share must lie in (0, 1], got {self.full_search_share}")



@dataclass(frozen=True)
class GatingConfig:
    """AlphaGo Zero's gating: a candidate network (each newly published version, while no match is under way) plays
    ``games`` games against the self-play network, colours alternating, and replaces it only if it scores at least
    ``win_rate``. Off by default (``games`` 0: self-play always uses the newest network), as in ELF OpenGo and
    AlphaZero. The matches search as self-play does, without root noise, the most visited move after the first
    ``opening`` moves of a game, which are drawn from the visit counts at temperature 1 (so that the games between
    two deterministic networks differ)."""

    games: int = 0
    win_rate: float = 0.55  # AlphaGo Zero's margin
    opening: int = 6

    def __post_init__(self) -> None:
        if self.games < 0 or self.games % 2:
            raise ValueError(f"games must be even (each network black in half) and >= 0 (0: no gating), got "
                             f"{self.games}")
        if not 0 < self.win_rate <= 1:
            raise ValueError(f"win_rate must lie in (0, 1], got {self.win_rate}")
        if self.opening < 0:
            raise ValueError(f"opening must be >= 0, got {self.opening}")


@dataclass(frozen=True)
class GoConfig:
    """The Go of a training run (``env.name=go``): every env rank plays ``env.num_envs`` games at once, each move
    searched by ``search``, the leaves evaluated by ``net`` on the inference ranks."""

    board_size: int = 9
    komi: float = 7.5
    max_game_length: int = 0  # moves, passes included; 0: the engine's 2 * size^2
    search: PUCTConfig = field(default_factory=PUCTConfig)
    net: GoNetConfig = field(default_factory=GoNetConfig)
    gating: GatingConfig = field(default_factory=GatingConfig)

    def __post_init__(self) -> None:
        if not BOARD_SIZES[0] <= self.board_size <= BOARD_SIZES[1]:
            raise ValueError(f"board_size must lie in [{BOARD_SIZES[0]}, {BOARD_SIZES[1]}], got {self.board_size}")
        if self.max_game_length < 0:
            raise ValueError(f"max_game_length must be >= 0 (0: 2 * size^2), got {self.max_game_length}")

    @property
    def num_actions(self) -> int:
        return self.board_size ** 2 + 1

    @property
    def game_length(self) -> int:
        """The longest game in moves: what one game's record must hold."""
        return self.max_game_length or 2 * self.board_size ** 2
