"""A Go ladder as ELF OpenGo evaluated: fixed opponents play every pair, then Elo, self-play Elo and Nash averaging.

    python jobs/go_ladder.py random rollout:sims=200 rollout:sims=1000 mctsbot:sims=200 mctsbot:sims=1000
    python jobs/go_ladder.py random rollout:sec=0.05 mctsbot:sec=0.05 --games 100 \
        --strength rollout:sec=0.05 mctsbot:sec=0.05 --out runs/go-ladder
    python jobs/go_ladder.py random mctsbot:sims=200 --run runs/g9 --versions 200 400 800 --net-sims 64

Players are specs of ``hpc_rl.league.go_players`` (``random``, ``rollout:sims=N``, ``rollout:sec=S``,
``mctsbot:sims=N``, ``mctsbot:sec=S``, with ``uct_c=`` and ``rollouts=``; ``net:run=RUN_DIR,version=V,sims=N`` or
``sec=S``), in the order the self-play Elo chains them (put the weakest first). ``--run RUN_DIR`` adds the network
players of that Go training run after them, oldest version first (so the self-play Elo chains consecutive
versions): ``--versions V ...`` or ``--every K`` (every K-th committed version counted back from the newest, which
is always in), each at ``--net-sims N`` simulations a move or ``--net-sec S`` seconds, with ``--net-opening K``
its first K moves of a game sampled (``opening=K``), ``--net-leaves K`` paths in flight per search step
(``leaves=K``), ``--net-fpu R`` its first-play urgency reduction (``fpu=R``) and ``--net-reuse`` its search tree
kept between moves (``reuse=1``). Every pair plays ``--games`` games on ``--board-size`` (komi ``--komi``), colours
alternating, seeded from ``--seed`` and the pair. ``--out`` (default ``runs/go-ladder``) keeps ``results.json``, saved
after every game: the same command resumes where it stopped, and a ladder with a player added plays only the new
pairs. When every game is played it commits ``evaluation.json`` (ratings and, with ``--strength AGENT OPPONENT``,
the agent's record against the opponent: what ``python -m hpc_rl.bench go`` reports as ``strength``), and writes
``ratings.md`` and ``ratings.png``.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one core per ladder, before numpy and numba start their pools

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

DEFAULT_OUT = Path("runs") / "go-ladder"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("players", nargs="*", help="player specs, weakest first")
    parser.add_argument("--games", type=int, default=20, help="games per pair, even (default 20)")
    parser.add_argument("--board-size", type=int, default=9, help="board size (default 9)")
    parser.add_argument("--komi", type=float, default=7.5, help="komi (default 7.5)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the games (default 0)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    parser.add_argument("--strength", nargs=2, metavar=("AGENT", "OPPONENT"),
                        help="record AGENT's wins against OPPONENT in evaluation.json (both among the players)")
    parser.add_argument("--run", type=Path, help="a Go training run whose versions join the ladder")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--versions", type=int, nargs="+", metavar="V", help="the run's versions to add")
    which.add_argument("--every", type=int, metavar="K", help="every K-th committed version, the newest included")
    pace = parser.add_mutually_exclusive_group()
    pace.add_argument("--net-sims", type=int, metavar="N", help="the networks' simulations a move (default 64)")
    pace.add_argument("--net-sec", type=float, metavar="S", help="the networks' seconds a move")
    parser.add_argument("--net-opening", type=int, default=0, metavar="K",
                        help="the networks draw a game's first K moves from their visit counts (default 0)")
    parser.add_argument("--net-leaves", type=int, default=1, metavar="K",
                        help="the networks' paths in flight per search step, one batch (default 1)")
    parser.add_argument("--net-fpu", type=float, metavar="R",
                        help="the networks' first-play urgency reduction (default: each run's setting)")
    parser.add_argument("--net-reuse", action="store_true", help="the networks keep their search trees between moves")
    args = parser.parse_args(argv)
    if (args.run is None) != (args.versions is None and args.every is None):
        parser.error("--run needs --versions or --every, and they need --run")
    if args.every is not None and args.every < 1:
        parser.error(f"--every must be >= 1, got {args.every}")
    if args.run is not None:
        from hpc_rl.league.go_players import net_spec
        from hpc_rl.storage.checkpoint import committed_versions
        from hpc_rl.storage.layout import RunLayout

        committed = committed_versions(RunLayout(args.run).checkpoints)
        versions = args.versions or committed[::-1][::args.every][::-1]
        if not versions:
            parser.error(f"{RunLayout(args.run).checkpoints} holds no committed checkpoint")
        try:
            args.players += [net_spec(str(args.run), v, args.net_sims or 64, args.net_sec, args.net_opening,
                                     args.net_leaves, args.net_fpu, args.net_reuse)
                             for v in sorted(set(versions))]
        except ValueError as err:
            parser.error(str(err))
    elif (args.net_sims or args.net_sec or args.net_opening or args.net_leaves != 1 or args.net_fpu is not None
          or args.net_reuse):
        parser.error("--net-sims, --net-sec, --net-opening, --net-leaves, --net-fpu and --net-reuse set the networks "
                     "of --run")
    if args.net_opening < 0:
        parser.error(f"--net-opening must be >= 0, got {args.net_opening}")
    if args.net_leaves < 1:
        parser.error(f"--net-leaves must be >= 1, got {args.net_leaves}")
    if args.games < 2 or args.games % 2:
        parser.error(f"--games must be even and >= 2 (each player black in half of a pair's games), got {args.games}")
    if not 0 <= args.seed < 2**31:
        parser.error(f"--seed must lie in [0, 2**31), got {args.seed}")
    if not 5 <= args.board_size <= 19:
        parser.error(f"--board-size must lie in [5, 19], got {args.board_size}")
    if args.strength and not set(args.strength) <= set(args.players) or args.strength and len(set(args.strength)) < 2:
        parser.error(f"--strength needs two different players of the ladder, got {args.strength}")
    return args


def main(argv: list[str]) -> int:
    args = parse(argv)
    from hpc_rl.league.go_ladder import RESULTS_FILE, commit_evaluation, play_ladder

    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        results = play_ladder(args.players, args.out / RESULTS_FILE, args.board_size, args.komi, args.games,
                              args.seed, progress=lambda line: print(line, flush=True))
    except ValueError as err:
        raise SystemExit(str(err)) from err
    evaluation = commit_evaluation(args.out, results, args.players, args.games,
                                   tuple(args.strength) if args.strength else None)
    print((args.out / "ratings.md").read_text())
    if evaluation["strength"]:
        s = evaluation["strength"]
        print(f"strength: {s['agent']} won {s['wins']} of {s['games']} against {s['opponent']} "
              f"({s['win_rate']:.2f} [{s['ci95'][0]:.2f}, {s['ci95'][1]:.2f}])")
    print(f"committed {args.out / 'evaluation.json'} ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
