"""Speed of the random-rollout UCT search on Go (``hpc_rl.envs.go``) against OpenSpiel's, on the same positions.

``python -m hpc_rl.bench go --json``. ``--positions`` positions (default 20) of ``--board-size`` (default 9) Go,
each the result of a seeded random opening of ``--opening-moves`` legal stones (uniform in the range, no passes;
komi 7.5), are searched once each by:

- ours: ``RolloutMCTS`` (compiled, one thread) → ``rollout_mcts_sims_per_s``;
- OpenSpiel's C++ ``MCTSBot`` with its C++ ``RandomRolloutEvaluator`` on its C++ game, through pyspiel
  (``pyspiel.MCTSBot``) → ``openspiel_mcts_sims_per_s``, the reference of the goal ``ours_vs_openspiel`` >= 1;
- OpenSpiel's Python ``MCTSBot`` (``open_spiel.python.algorithms.mcts``) with its ``RandomRolloutEvaluator`` over
  the C++ game's states → ``openspiel_python_mcts_sims_per_s``; it is slow, so it searches the first
  ``--python-positions`` positions only, and ``rollout_mcts_sims_per_s_on_python_positions`` is ours on the same ones
  for its ratio ``ours_vs_openspiel_python``.

Equal work: the same ``--simulations`` per search, ``--rollouts`` random playouts per leaf, ``uct_c`` and solving
(MCTS-Solver on, OpenSpiel's default), on the same positions, searched one after the other position by position so
that all see the same load. Simulations are counted as run: ours and the Python bot's from their trees (a solved root
stops a search early); the C++ bot's is ``--simulations`` per search (pyspiel does not expose its tree; a root with
one legal action would stop it after one simulation, and the openings leave many). Each search is timed alone with
``time.perf_counter``; setting up the positions is not timed. The ratios ``ours_vs_*`` divide the rates.

Network-guided search (``hpc_rl.envs.go_search.PUCTSearch`` with ``hpc_rl.model.go_net.GoNet``, one torch thread):
``--guided-games`` games (default 64) of ``--board-size`` Go, searched together from the empty board for
``--guided-moves`` moves (default 2) of ``--guided-simulations`` simulations each (default 32), ELF's settings
otherwise (c_puct 1.5, virtual loss 1, root noise, moves drawn at temperature 1), ``--guided-leaves`` leaves per game
in flight per step (default 1), so that each step's batch holds games x leaves positions, evaluated by a
``--guided-blocks`` x ``--guided-filters`` ResNet (default 6 x 64) with random weights:
``guided_sims_per_s_per_core`` (simulations over the whole search's time, the network's included),
``guided_batch_size`` (positions per evaluation, mean), ``guided_net_share`` (the share of that time in the network).
Then the network alone on batches of that size of the positions reached, timed between the moves so that both see
the same load → ``net_positions_per_s``: the search's overhead is the gap between the two rates. Last, the same moves
searched with uniform priors and zero values in place of the network → ``search_only_sims_per_s``, the search's own
cost.

Evaluation play (a ladder's ``net`` player: one game searched at a time, ``--ladder-leaves`` leaves in flight, default
8): the positions above, each searched by ``--ladder-simulations`` simulations (default 256) with a
``--ladder-blocks`` x ``--ladder-filters`` ResNet (default 4 x 32, go9's) of random weights, evaluated by PyTorch
(``NetEvaluator``, what the inference ranks run) and by ONNX Runtime (``FrozenNetEvaluator``, what a ladder's player
runs), the two one after the other position by position: ``ladder_sims_per_s_torch``, ``ladder_sims_per_s_onnx``
and their ratio ``ladder_onnx_vs_torch``.

``--match-games N`` (default 0) adds a strength check: ours against the C++ bot at equal simulations, N games,
colours alternating, from the empty board (``match``: wins, losses and draws of ours).

``strength`` is read, not played: the record of the latest committed evaluation in ``--evaluation`` (default
``runs/go-ladder``, where ``jobs/go_ladder.py`` commits ``evaluation.json``): ``{agent, opponent, games, wins,
win_rate, ci95}``, or null when none is committed or it rated no agent; ``strength_source`` names the file, or says
why there is none.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"  # one core, before numpy and numba start their pools

import time  # noqa: E402
from dataclasses import replace  # noqa: E402

import numpy as np  # noqa: E402

from hpc_rl.envs.go import GoGames, RolloutMCTS  # noqa: E402
from hpc_rl.league.go_ladder import latest_strength  # noqa: E402

KOMI = 7.5


def add_arguments(parser) -> None:
    parser.add_argument("--board-size", type=int, default=9, help="board size of the positions")
    parser.add_argument("--positions", type=int, default=20, help="positions searched")
    parser.add_argument("--opening-moves", type=int, nargs=2, default=(10, 40), metavar=("LOW", "HIGH"),
                        help="random legal stones before a position, uniform in [LOW, HIGH)")
    parser.add_argument("--simulations", type=int, default=1000, help="simulations per search (max_simulations)")
    parser.add_argument("--rollouts", type=int, default=1, help="random playouts per leaf (n_rollouts)")
    parser.add_argument("--uct-c", type=float, default=2.0, help="UCT exploration constant")
    parser.add_argument("--python-positions", type=int, default=3,
                        help="positions also searched by OpenSpiel's Python MCTSBot (the first ones)")
    parser.add_argument("--match-games", type=int, default=0, help="games of ours against OpenSpiel's C++ bot")
    parser.add_argument("--seed", type=int, default=0, help="seed of the openings and of the searches")
    parser.add_argument("--guided-games", type=int, default=64, help="games searched together by the guided search")
    parser.add_argument("--guided-moves", type=int, default=2, help="moves searched per game")
    parser.add_argument("--guided-simulations", type=int, default=32, help="guided simulations per move")
    parser.add_argument("--guided-leaves", type=int, default=1, help="leaves in flight per game and step")
    parser.add_argument("--guided-blocks", type=int, default=6, help="residual blocks of the network")
    parser.add_argument("--guided-filters", type=int, default=64, help="filters of the network")
    parser.add_argument("--ladder-simulations", type=int, default=256, help="simulations per evaluation search")
    parser.add_argument("--ladder-leaves", type=int, default=8, help="leaves in flight per evaluation search step")
    parser.add_argument("--ladder-blocks", type=int, default=4, help="residual blocks of the evaluated network")
    parser.add_argument("--ladder-filters", type=int, default=32, help="filters of the evaluated network")
    parser.add_argument("--evaluation", default="runs/go-ladder",
                        help="directory of the committed evaluation that `strength` reports (jobs/go_ladder.py --out)")


def check_arguments(args) -> None:
    if not 5 <= args.board_size <= 19:
        raise ValueError(f"--board-size must lie in [5, 19], got {args.board_size}")
    for name in ("positions", "rollouts"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.simulations < 2:
        raise ValueError(f"--simulations must be >= 2, got {args.simulations}")
    low, high = args.opening_moves
    if not 0 <= low < high <= args.board_size ** 2 // 2:
        raise ValueError(f"--opening-moves must satisfy 0 <= LOW < HIGH <= board points / 2, got {low} {high}")
    if not 0 <= args.python_positions <= args.positions:
        raise ValueError(f"--python-positions must lie in [0, --positions], got {args.python_positions}")
    if args.match_games < 0:
        raise ValueError(f"--match-games must be >= 0, got {args.match_games}")
    for name in ("guided_games", "guided_moves", "guided_leaves", "guided_filters", "ladder_leaves",
                 "ladder_filters"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.guided_simulations < 2 or args.guided_blocks < 0:
        raise ValueError(f"--guided-simulations must be >= 2 and --guided-blocks >= 0, got "
                         f"{args.guided_simulations}, {args.guided_blocks}")
    if args.ladder_simulations < 2 or args.ladder_blocks < 0:
        raise ValueError(f"--ladder-simulations must be >= 2 and --ladder-blocks >= 0, got "
                         f"{args.ladder_simulations}, {args.ladder_blocks}")
    if not 0 <= args.seed < 2**31:
        raise ValueError(f"--seed must be in [0, 2**31), got {args.seed}")


def random_openings(size: int, count: int, low: int, high: int, seed: int) -> list[list[int]]:
    """``count`` action lists, each of a uniform number in [low, high) of uniformly random legal stones."""
    rng = np.random.default_rng(seed)
    openings = []
    for _ in range(count):
        games = GoGames(1, size, KOMI)
        actions = []
        for _ in range(int(rng.integers(low, high))):
            legal = np.flatnonzero(games.legal_mask()[0, :-1])
            actions.append(int(rng.choice(legal)))
            games.step(actions[-1:])
        openings.append(actions)
    return openings


def play_match(game, size: int, games: int, simulations: int, rollouts: int, uct_c: float, seed: int) -> dict:
    """Ours against the C++ MCTSBot from the empty board, ours black in even games; ours' wins, losses, draws."""
    import pyspiel

    result = {"games": games, "wins": 0, "losses": 0, "draws": 0, "simulations": simulations, "opponent": "cpp"}
    for i in range(games):
        ours = RolloutMCTS(uct_c, simulations, rollouts, seed=seed + i)
        theirs = pyspiel.MCTSBot(game, pyspiel.RandomRolloutEvaluator(rollouts, seed + i), uct_c, simulations,
                                 1000, True, seed + i, False)
        state, board = game.new_initial_state(), GoGames(1, size, KOMI)
        ours_player = i % 2
        while not state.is_terminal():
            action = ours.step(board) if state.current_player() == ours_player else theirs.step(state)
            state.apply_action(action)
            board.step([action])
        ret = state.returns()[ours_player]
        result["wins" if ret > 0 else "losses" if ret < 0 else "draws"] += 1
    return result


def guided_search(args) -> dict:
    """The network-guided search's simulations per second on one core, and the network's alone at its batch."""
    import torch

    from hpc_rl.envs.go import input_planes
    from hpc_rl.envs.go_search import PUCTConfig, PUCTSearch
    from hpc_rl.model.config import GoNetConfig
    from hpc_rl.model.go_net import GoNet, NetEvaluator

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    size, n = args.board_size, args.guided_games
    net = NetEvaluator(GoNet(GoNetConfig(args.guided_blocks, args.guided_filters), size))
    config = PUCTConfig(simulations=args.guided_simulations, leaves_per_game=args.guided_leaves)
    search = PUCTSearch(config, [args.seed * 100_003 + g for g in range(n)], size, KOMI)
    warm = PUCTSearch(PUCTConfig(simulations=2), [0], size, KOMI)
    warm.search(GoGames(1, size, KOMI), [0], net)  # compiled (or loaded from numba's cache) untimed
    games = GoGames(n, size, KOMI)
    batches, net_seconds = [], [0.0]

    def timed(planes, legal):
        start = time.perf_counter()
        out = net(planes, legal)
        net_seconds[0] += time.perf_counter() - start
        batches.append(len(planes))
        return out

    seconds, alone_seconds, alone_positions, simulations = 0.0, 0.0, 0, 0
    for _ in range(args.guided_moves):
        active = np.flatnonzero(~games.terminal)  # two passes may end a game
        if not active.size:
            break
        start = time.perf_counter()
        choice = search.search(games, active, timed)
        actions = np.full(n, games.pass_action)
        actions[active] = choice.actions
        games.step(actions)
        seconds += time.perf_counter() - start
        simulations += len(active) * args.guided_simulations
        # The network alone, between the moves so that both see the same load: a quarter as many positions, in
        # batches of the search's mean size, of the positions reached.
        batch = int(round(np.mean(batches)))
        rows = np.arange(batch) % n
        planes, legal = input_planes(games, rows), games.legal_mask()[rows]
        reps = max(1, int(np.ceil(n * args.guided_simulations / batch / 4)))
        start = time.perf_counter()
        for _ in range(reps):
            net(planes, legal)
        alone_seconds += time.perf_counter() - start
        alone_positions += reps * batch
    net_rate = alone_positions / alone_seconds
    # The search alone: the same moves with uniform priors and zero values in place of the network.
    games, start, search_simulations = GoGames(n, size, KOMI), time.perf_counter(), 0
    search = PUCTSearch(config, [args.seed * 100_003 + g for g in range(n)], size, KOMI)
    for _ in range(args.guided_moves):
        active = np.flatnonzero(~games.terminal)
        if active.size:
            search_simulations += len(active) * args.guided_simulations
            choice = search.search(games, active, lambda planes, legal: (legal.astype(np.float64),
                                                                          np.zeros(len(planes))))
            actions = np.full(n, games.pass_action)
            actions[active] = choice.actions
            games.step(actions)
    search_rate = search_simulations / (time.perf_counter() - start)
    return {"guided_sims_per_s_per_core": simulations / seconds, "guided_batch_size": batch,
            "guided_net_share": net_seconds[0] / seconds, "net_positions_per_s": net_rate,
            "search_only_sims_per_s": search_rate,
            "guided_games": n, "guided_moves": args.guided_moves, "guided_simulations": args.guided_simulations,
            "guided_leaves_per_game": args.guided_leaves, "guided_simulations_run": simulations,
            "guided_net": f"{args.guided_blocks}x{args.guided_filters}"}


def ladder_search(args, openings: list[list[int]]) -> dict:
    """Evaluation play's simulations per second, the network in PyTorch and in ONNX Runtime, on the same positions."""
    import torch

    from hpc_rl.envs.go_search import PUCTConfig, PUCTSearch, evaluation_config
    from hpc_rl.model.config import GoNetConfig
    from hpc_rl.model.go_net import FrozenNetEvaluator, GoNet, NetEvaluator

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    size = args.board_size
    net = GoNet(GoNetConfig(args.ladder_blocks, args.ladder_filters), size)
    evaluators = {"torch": NetEvaluator(net), "onnx": FrozenNetEvaluator(net)}
    config = replace(evaluation_config(PUCTConfig()), simulations=args.ladder_simulations,
                     leaves_per_game=args.ladder_leaves)
    searches = {name: PUCTSearch(config, [args.seed], size, KOMI) for name in evaluators}
    for name, search in searches.items():  # compiled (or loaded from numba's cache) and warmed untimed
        search.search(GoGames(1, size, KOMI), [0], evaluators[name])
    seconds = dict.fromkeys(evaluators, 0.0)
    for actions in openings:
        games = GoGames(1, size, KOMI)
        for a in actions:
            games.step([a])
        for name, search in searches.items():
            start = time.perf_counter()
            search.search(games, [0], evaluators[name])
            seconds[name] += time.perf_counter() - start
    rates = {name: len(openings) * args.ladder_simulations / seconds[name] for name in evaluators}
    return {"ladder_sims_per_s_torch": rates["torch"], "ladder_sims_per_s_onnx": rates["onnx"],
            "ladder_onnx_vs_torch": rates["onnx"] / rates["torch"], "ladder_simulations": args.ladder_simulations,
            "ladder_leaves": args.ladder_leaves, "ladder_net": f"{args.ladder_blocks}x{args.ladder_filters}"}


def run(args) -> dict:
    check_arguments(args)
    import pyspiel
    from open_spiel.python.algorithms import mcts

    size = args.board_size
    game = pyspiel.load_game("go", {"board_size": size, "komi": KOMI})
    openings = random_openings(size, args.positions, *args.opening_moves, args.seed)
    ours = RolloutMCTS(args.uct_c, args.simulations, args.rollouts, seed=args.seed)
    ours.step(GoGames(1, size, KOMI))  # compiled (or loaded from numba's cache) before any timing
    cpp = pyspiel.MCTSBot(game, pyspiel.RandomRolloutEvaluator(args.rollouts, args.seed), args.uct_c,
                          args.simulations, 1000, True, args.seed, False)
    python = mcts.MCTSBot(game, args.uct_c, args.simulations,
                          mcts.RandomRolloutEvaluator(args.rollouts, np.random.RandomState(args.seed)),
                          solve=True, random_state=np.random.RandomState(args.seed))
    seconds = {"ours": [], "cpp": [], "python": []}
    sims = {"ours": [], "python": []}
    for k, actions in enumerate(openings):
        games, state = GoGames(1, size, KOMI), game.new_initial_state()
        for a in actions:
            games.step([a])
            state.apply_action(a)
        before = ours.simulations
        start = time.perf_counter()
        ours.step(games)
        seconds["ours"].append(time.perf_counter() - start)
        sims["ours"].append(ours.simulations - before)
        start = time.perf_counter()
        cpp.step(state)
        seconds["cpp"].append(time.perf_counter() - start)
        if k < args.python_positions:
            start = time.perf_counter()
            root = python.mcts_search(state)
            seconds["python"].append(time.perf_counter() - start)
            sims["python"].append(root.explore_count)
    ours_rate = sum(sims["ours"]) / sum(seconds["ours"])
    cpp_rate = args.simulations * len(openings) / sum(seconds["cpp"])
    result = {"board_size": size, "komi": KOMI, "positions": len(openings),
              "opening_moves": [len(a) for a in openings], "simulations_per_search": args.simulations,
              "rollouts_per_leaf": args.rollouts, "uct_c": args.uct_c, "solve": True,
              "rollout_mcts_sims_per_s": ours_rate, "openspiel_mcts_sims_per_s": cpp_rate,
              "ours_vs_openspiel": ours_rate / cpp_rate,
              "ours_simulations": int(sum(sims["ours"])), "python_positions": args.python_positions}
    if args.python_positions:
        n = args.python_positions
        ours_subset = sum(sims["ours"][:n]) / sum(seconds["ours"][:n])
        python_rate = sum(sims["python"]) / sum(seconds["python"])
        result.update({"openspiel_python_mcts_sims_per_s": python_rate,
                       "rollout_mcts_sims_per_s_on_python_positions": ours_subset,
                       "ours_vs_openspiel_python": ours_subset / python_rate})
    result.update(guided_search(args))
    result.update(ladder_search(args, openings))
    result["strength"], result["strength_source"] = latest_strength(args.evaluation)
    if args.match_games:
        result["match"] = play_match(game, size, args.match_games, args.simulations, args.rollouts, args.uct_c,
                                     args.seed)
    return result
