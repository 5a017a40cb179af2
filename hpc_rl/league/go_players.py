"""Go players for evaluation: one interface, built from spec strings, so a ladder names its players on a command line.

    player = make_player("mctsbot:sims=1000", board_size=9, komi=7.5, seed=0)
    action = player.choose(games, row, moves)     # games: GoGames; moves: the actions played so far in that game

Specs are ``kind`` or ``kind:key=value,...``; the kinds (``PLAYER_KINDS``; a new player is one entry):

- ``random``: a uniformly random legal action (pass included), OpenSpiel's uniform random bot;
- ``rollout:sims=N`` / ``rollout:sec=S``: our compiled random-rollout UCT search (``hpc_rl.envs.go.RolloutMCTS``);
- ``mctsbot:sims=N`` / ``mctsbot:sec=S``: OpenSpiel's C++ ``MCTSBot`` with its ``RandomRolloutEvaluator`` through
  pyspiel, its state replayed from the game's moves;
- ``net:run=RUN_DIR,version=V,sims=N`` / ``net:...,sec=S``: a Go training run's network (committed checkpoint ``V``
  of ``RUN_DIR``, read only) playing the most visited move of its PUCT search (``hpc_rl.envs.go_search``) without
  root noise: evaluation play, as AlphaGo Zero's evaluator and ELF OpenGo's ladder play. Its search takes the run's
  ``c_puct`` and virtual loss; ``c_puct=`` overrides it. ``opening=K``: the game's first K moves (both players'),
  where it is to move, drawn from its search's visit counts at temperature 1 from its seeded stream (ELF OpenGo
  samples the opening moves so that games between two deterministic networks differ). ``leaves=K``: K paths in
  flight per search step under virtual loss, their leaves evaluated in one forward pass (default 1; what
  self-play's ``leaves_per_game`` does): at ``sec``, more simulations a move, since a step's Python and the network's pass cost
  little more for K leaves than for one. ``fpu=R``: the first-play urgency reduction of its search
  (``PUCTConfig.fpu_reduction``: an unvisited move valued at the position's value less R times the root of the
  visited moves' prior mass; default the run's). ``reuse=1``: the search tree is kept between moves of a game,
  the subtree of the position reached carrying its visits into the next search (``PUCTSearch.descend``), which adds
  its ``sims`` (or its paced count) to them. The spec names run and version, so a ladder's results tell the
  versions apart.

Both rollout searches take ``uct_c`` (default 2) and ``rollouts`` (random playouts per leaf, default 1); every
search takes either a fixed ``sims`` per move or ``sec``, wall-clock seconds per move (ELF OpenGo compares players at
equal time per move). At ``sec``, each move's search runs a fixed number of simulations set from the player's own
rate on its previous move (simulations per second, measured; ``Pace``), and on its first move from a probe search
(``PROBE_SIMULATIONS``; ``NET_PROBE_SIMULATIONS`` for the network, whose simulations cost a forward pass each) whose
time counts against that move. One rule for both searches, because neither can be stopped by a clock safely:
``RolloutMCTS`` runs in one compiled call that cannot read one, and the C++ ``MCTSBot``'s own deadline (pyspiel's
``max_wall_clock_time``) crashes the process (a segmentation fault in OpenSpiel 2.0.2) when it passes before the
bot's second simulation has expanded the root, which a loaded machine's scheduler makes happen at 0.05 s a move.
The rate follows the machine's load and the game's phase (playouts shorten as the board fills) with one move's lag;
the ladder records the seconds each player actually spent per move, so how equal the times were is measured, not
assumed.

Games at fixed ``sims`` are reproducible from their seeds; games at equal time are not (how many simulations fit
depends on the machine and its load).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np
import yaml

from hpc_rl.envs.go import GoGames, RolloutMCTS
from hpc_rl.envs.go_search import PUCTSearch, evaluation_config

PROBE_SIMULATIONS = 64  # a time-limited rollout search's first search, which measures its rate
NET_PROBE_SIMULATIONS = 8  # the network player's: each simulation is a forward pass of the network
MIN_SIMULATIONS = 2  # RolloutMCTS expands the root on its second simulation


class GoPlayer(Protocol):
    """Chooses a move for one game position. ``name`` is its spec (its identity in a ladder's results);
    ``simulations``: searched so far over all its moves (0 for a player that does not search)."""

    name: str
    simulations: int

    def choose(self, games: GoGames, row: int, moves: Sequence[int]) -> int:
        """A legal action for game ``row`` of ``games`` (unfinished; not changed); ``moves``: every action played
        in that game so far, from the empty board (a player that keeps its own state replays them)."""
        ...


class RandomPlayer:
    def __init__(self, name: str, seed: int):
        self.name, self.simulations = name, 0
        self.rng = np.random.default_rng(seed)

    def choose(self, games: GoGames, row: int, moves: Sequence[int]) -> int:
        return int(self.rng.choice(np.flatnonzero(games.legal_mask()[row])))


class Pace:
    """Searches of ``seconds`` each, as fixed simulation counts: the count from the rate measured on the previous
    search, the first one after a probe of ``probe`` simulations."""

    def __init__(self, seconds: float, probe: int = PROBE_SIMULATIONS):
        self.seconds, self.probe = seconds, probe
        self.rate: float | None = None  # simulations per second

    def _timed(self, search: Callable[[int], tuple[int, int]], sims: int) -> tuple[int, float]:
        start = time.perf_counter()
        action, done = search(sims)
        elapsed = time.perf_counter() - start
        if done == sims or self.rate is None:  # a search stopped early by a solved root says little of the rate
            self.rate = done / max(elapsed, 1e-9)
        return action, elapsed

    def choose(self, search: Callable[[int], tuple[int, int]]) -> int:
        """``search(sims) -> (action, simulations run)`` run within about ``seconds``; its action."""
        left = self.seconds
        if self.rate is None:
            left -= self._timed(search, self.probe)[1]
        return self._timed(search, max(MIN_SIMULATIONS, int(self.rate * left)))[0]


class RolloutPlayer:
    """``RolloutMCTS`` at ``sims`` simulations a move, or paced to ``seconds`` a move."""

    def __init__(self, name: str, seed: int, uct_c: float, rollouts: int, sims: int | None, seconds: float | None):
        self.name = name
        self.search = RolloutMCTS(uct_c, sims or MIN_SIMULATIONS, rollouts, seed=seed)
        self.pace = Pace(seconds) if seconds is not None else None

    @property
    def simulations(self) -> int:
        return self.search.simulations

    def choose(self, games: GoGames, row: int, moves: Sequence[int]) -> int:
        if self.pace is None:
            return self.search.step(games, row)

        def search(sims: int) -> tuple[int, int]:
            self.search.max_simulations = sims
            before = self.search.simulations
            return self.search.step(games, row), self.search.simulations - before

        return self.pace.choose(search)


class MCTSBotPlayer:
    """OpenSpiel's C++ ``MCTSBot`` (random rollouts, solving on) on a pyspiel state replayed from the moves, at
    ``sims`` simulations a move or paced to ``seconds`` a move; simulations are counted at the search's root."""

    def __init__(self, name: str, seed: int, board_size: int, komi: float, uct_c: float, rollouts: int,
                 sims: int | None, seconds: float | None):
        import pyspiel

        self.name, self.simulations = name, 0
        self.game = pyspiel.load_game("go", {"board_size": board_size, "komi": komi})
        self.seed = seed % 2**31  # pyspiel takes a C int
        self.uct_c, self.rollouts = uct_c, rollouts
        self.sims = sims
        self.bot = self._bot(sims, self.seed) if sims is not None else None
        self.pace = Pace(seconds) if seconds is not None else None
        self.state = self.game.new_initial_state()
        self.moves: list[int] = []

    def _bot(self, sims: int, seed: int):
        import pyspiel

        return pyspiel.MCTSBot(self.game, pyspiel.RandomRolloutEvaluator(self.rollouts, seed), self.uct_c, sims,
                               1000, True, seed, False)

    def state_after(self, moves: Sequence[int]):
        """The pyspiel state after ``moves``: the kept state advanced when ``moves`` extends what it has seen (one
        game, move by move), replayed from the empty board otherwise."""
        moves = list(moves)
        if moves[:len(self.moves)] != self.moves:
            self.state, self.moves = self.game.new_initial_state(), []
        for action in moves[len(self.moves):]:
            self.state.apply_action(action)
        self.moves = moves
        return self.state

    def choose(self, games: GoGames, row: int, moves: Sequence[int]) -> int:
        state = self.state_after(moves)
        if state.is_terminal() or state.current_player() != int(games.to_play[row]):
            raise ValueError(f"{self.name}: the {len(moves)} moves given do not lead to game {row}'s position")

        def search(sims: int, bot=None) -> tuple[int, int]:
            # A paced search is a new bot of its count, its stream seeded by the move and the search's count.
            if bot is None:
                bot = self._bot(sims, (self.seed + 1_000_003 * len(moves) + sims) % 2**31)
            # The search's root, not bot.step (which runs the same search and plays its best child): the root's
            # count is the simulations run, fewer than asked when the root was solved early. Counting them as asked
            # made such a search look as fast as it liked, and the next paced count overflowed a C int.
            root = bot.mcts_search(state)
            self.simulations += root.explore_count
            return int(root.best_child().action), root.explore_count

        if self.pace is None:
            return search(self.sims, self.bot)[0]
        return self.pace.choose(search)


@functools.lru_cache(maxsize=32)  # a ladder builds a player per game: each version is read once
def load_go_net(run_dir: str, version: int):
    """``(GoNet in eval mode, GoConfig)`` of checkpoint ``version`` of the Go training run in ``run_dir``, read only
    (nothing of the run is written or locked: a run still training can be rated). ValueError naming the file when
    the run, its config or that checkpoint is missing, or the checkpoint does not verify."""
    from hpc_rl.config import build_config
    from hpc_rl.launch import set_torch_threads
    from hpc_rl.model.go_net import GoNet
    from hpc_rl.model.tree import to_torch_tree
    from hpc_rl.storage.checkpoint import CheckpointError, checkpoint_name, committed_versions, load_checkpoint
    from hpc_rl.storage.layout import RunLayout

    set_torch_threads()  # one core per ladder, as the searches it plays against
    layout = RunLayout(run_dir)
    if not layout.config.is_file():
        raise ValueError(f"{layout.config} does not exist: {run_dir} is not a training run's directory")
    try:
        config = build_config(yaml.safe_load(layout.config.read_text()))
    except (OSError, ValueError, TypeError, yaml.YAMLError) as err:
        raise ValueError(f"{layout.config}: not a readable run config ({err})") from err
    if not config.env.is_go:
        raise ValueError(f"{layout.config}: env.name is {config.env.name!r}, not a Go run")
    path = layout.checkpoints / checkpoint_name(version)
    if not path.is_file():
        committed = committed_versions(layout.checkpoints)
        shown = committed if len(committed) <= 8 else [*committed[:4], "...", *committed[-3:]]
        raise ValueError(f"{path} does not exist: version {version} is not committed (committed: "
                         f"{', '.join(map(str, shown)) or 'none'})")
    try:
        ckpt = load_checkpoint(path)
        go = config.env.go
        net = GoNet(go.net, go.board_size)
        net.load_state_dict(to_torch_tree(ckpt.sections["params"]))
    except CheckpointError as err:  # its message names the file
        raise ValueError(str(err)) from err
    except (KeyError, RuntimeError) as err:  # sections or shapes that are not this run's network
        raise ValueError(f"{path}: not a network of {layout.config}'s shape ({type(err).__name__}: {err})") from err
    return net.eval(), go


class NetPlayer:
    """A trained ``GoNet`` at evaluation play: the most visited move of its PUCT search at ``sims`` simulations a
    move (or paced to ``seconds``), no root noise, never resigning (a ladder plays games out); before move
    ``opening`` of the game, a move drawn from the visit counts (temperature 1) from the ``seed``'s stream; ``leaves``
    paths in flight per search step (virtual loss), evaluated in one batch."""

    def __init__(self, name: str, seed: int, board_size: int, komi: float, run_dir: str, version: int,
                 sims: int | None, seconds: float | None, c_puct: float | None, opening: int = 0, leaves: int = 1,
                 fpu: float | None = None, reuse: bool = False):
        from hpc_rl.model.go_net import FrozenNetEvaluator  # torch: imported by ladders that rate a network only

        net, go = load_go_net(run_dir, version)
        if (board_size, komi) != (go.board_size, go.komi):
            raise ValueError(f"version {version} of {run_dir} was trained on {go.board_size}x{go.board_size} at "
                             f"komi {go.komi}; this ladder plays {board_size}x{board_size} at komi {komi}")
        self.name, self.simulations = name, 0
        self.evaluate = FrozenNetEvaluator(net)
        self.config = replace(evaluation_config(go.search, opening), simulations=sims or MIN_SIMULATIONS,
                              leaves_per_game=leaves, c_puct=go.search.c_puct if c_puct is None else c_puct,
                              fpu_reduction=go.search.fpu_reduction if fpu is None else fpu)
        self.seed, self.reuse = seed, reuse
        self.search: PUCTSearch | None = None
        self.position: GoGames | None = None  # the game being searched, copied: the search owns its games' rows
        self.root_moves: list[int] | None = None  # the moves to the last searched position (reuse)
        self.pace = Pace(seconds, NET_PROBE_SIMULATIONS) if seconds is not None else None

    def choose(self, games: GoGames, row: int, moves: Sequence[int]) -> int:
        if self.position is None:
            self.position = GoGames(1, games.size, games.komi, games.max_game_length)
            self.search = PUCTSearch(self.config, [self.seed], games.size, games.komi, games.max_game_length)
        self.position.copy_from([0], games, [row])
        moves = [int(a) for a in moves]
        keep = False
        if self.reuse and self.root_moves is not None and moves[:len(self.root_moves)] == self.root_moves:
            keep = self.search.descend(moves[len(self.root_moves):]) > 0  # the same game, moves played since
        self.root_moves = moves

        def search(sims: int) -> tuple[int, int]:
            nonlocal keep
            self.search.config = replace(self.config, simulations=sims)
            self.simulations += sims
            action = int(self.search.search(self.position, [0], self.evaluate, keep_tree=keep).actions[0])
            if self.reuse:  # a second search of this position (the pace's probe, then the move's) goes on from it
                keep = self.search.descend([]) > 0
            return action, sims

        if self.pace is None:
            return search(self.config.simulations)[0]
        return self.pace.choose(search)


@dataclass(frozen=True)
class PlayerKind:
    """How to build one kind of player: ``make(name, options, board_size, komi, seed)``; ``options``: the keys its
    spec takes, each with its parser."""

    make: Callable[..., GoPlayer]
    options: dict[str, Callable[[str], object]]


def _search_settings(kind: str, options: dict) -> tuple[float, int, int | None, float | None]:
    if ("sims" in options) == ("sec" in options):
        raise ValueError(f"{kind}: give exactly one of sims=N (simulations a move) and sec=S (seconds a move)")
    sims, seconds = options.get("sims"), options.get("sec")
    if sims is not None and sims < MIN_SIMULATIONS:
        raise ValueError(f"{kind}: sims must be >= {MIN_SIMULATIONS}, got {sims}")
    if seconds is not None and not seconds > 0:
        raise ValueError(f"{kind}: sec must be > 0, got {seconds}")
    if options.get("rollouts", 1) < 1:
        raise ValueError(f"{kind}: rollouts must be >= 1, got {options['rollouts']}")
    return options.get("uct_c", 2.0), options.get("rollouts", 1), sims, seconds


SEARCH_OPTIONS = {"sims": int, "sec": float, "uct_c": float, "rollouts": int}
NET_OPTIONS = {"run": str, "version": int, "sims": int, "sec": float, "c_puct": float, "opening": int, "leaves": int,
               "fpu": float, "reuse": int}


def _make_net_player(name: str, options: dict, size: int, komi: float, seed: int) -> NetPlayer:
    if "run" not in options or "version" not in options:
        raise ValueError("net: give run=RUN_DIR (a Go training run's directory) and version=V (a committed "
                         "checkpoint's version)")
    _, _, sims, seconds = _search_settings("net", {k: v for k, v in options.items() if k in ("sims", "sec")})
    if options.get("c_puct", 0.0) < 0:
        raise ValueError(f"net: c_puct must be >= 0, got {options['c_puct']}")
    if options.get("opening", 0) < 0:
        raise ValueError(f"net: opening must be >= 0 (moves drawn at temperature 1), got {options['opening']}")
    if options.get("leaves", 1) < 1:
        raise ValueError(f"net: leaves must be >= 1 (paths in flight per search step), got {options['leaves']}")
    if not 0 <= options.get("fpu", 0.0) <= 2:
        raise ValueError(f"net: fpu must lie in [0, 2] (the first-play urgency reduction), got {options['fpu']}")
    if options.get("reuse", 0) not in (0, 1):
        raise ValueError(f"net: reuse must be 0 or 1 (keep the search tree between moves), got {options['reuse']}")
    return NetPlayer(name, seed, size, komi, options["run"], options["version"], sims, seconds,
                     options.get("c_puct"), options.get("opening", 0), options.get("leaves", 1), options.get("fpu"),
                     bool(options.get("reuse", 0)))


PLAYER_KINDS: dict[str, PlayerKind] = {
    "random": PlayerKind(lambda name, options, size, komi, seed: RandomPlayer(name, seed), {}),
    "rollout": PlayerKind(lambda name, options, size, komi, seed: RolloutPlayer(
        name, seed, *_search_settings("rollout", options)), SEARCH_OPTIONS),
    "mctsbot": PlayerKind(lambda name, options, size, komi, seed: MCTSBotPlayer(
        name, seed, size, komi, *_search_settings("mctsbot", options)), SEARCH_OPTIONS),
    "net": PlayerKind(_make_net_player, NET_OPTIONS),
}


def net_spec(run_dir: str, version: int, sims: int | None = None, seconds: float | None = None,
             opening: int = 0, leaves: int = 1, fpu: float | None = None, reuse: bool = False) -> str:
    """The spec of version ``version`` of the run in ``run_dir`` at ``sims`` simulations or ``seconds`` a move, its
    first ``opening`` moves sampled, ``leaves`` paths in flight per search step, ``fpu`` its first-play urgency
    reduction (None: the run's), ``reuse`` its search tree kept between moves."""
    if "," in str(run_dir):
        raise ValueError(f"{run_dir}: a run directory named in a player spec cannot hold a comma")
    return (f"net:run={run_dir},version={version}," + (f"sims={sims}" if seconds is None else f"sec={seconds}")
            + (f",opening={opening}" if opening else "") + (f",leaves={leaves}" if leaves != 1 else "")
            + (f",fpu={fpu}" if fpu is not None else "") + (",reuse=1" if reuse else ""))


def parse_spec(spec: str) -> tuple[str, dict]:
    """``kind:key=value,...`` -> (kind, {key: parsed value}); ValueError naming the spec and what is wrong."""
    kind, _, rest = spec.strip().partition(":")
    if kind not in PLAYER_KINDS:
        raise ValueError(f"player {spec!r}: unknown kind {kind!r}; kinds: {', '.join(PLAYER_KINDS)}")
    allowed = PLAYER_KINDS[kind].options
    options: dict = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or key not in allowed:
            raise ValueError(f"player {spec!r}: {item!r} is not key=value with a key among "
                             f"{', '.join(allowed) or '(none)'}")
        try:
            options[key] = allowed[key](value)
        except ValueError as err:
            raise ValueError(f"player {spec!r}: {key}={value!r} is not a {allowed[key].__name__}") from err
    return kind, options


def make_player(spec: str, board_size: int, komi: float, seed: int) -> GoPlayer:
    """The player a spec names, seeded; its ``name`` is the spec as given (stripped)."""
    kind, options = parse_spec(spec)
    try:
        return PLAYER_KINDS[kind].make(spec.strip(), options, board_size, komi, seed)
    except ValueError as err:
        raise ValueError(f"player {spec!r}: {err}") from err
