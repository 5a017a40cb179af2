"""Rate a run's committed checkpoints against random, the frozen scripted bot and each other (MOBA runs).

    python jobs/tournament.py runs/my_run                          # every committed version, 16 games per pair
    python jobs/tournament.py runs/my_run --versions 50 100 --games 64 --seed 1
    python jobs/tournament.py runs/my_run --print-only             # rate and print, write nothing

Every pair of players (the chosen versions, random, scripted) plays --games mirrored games with sides alternating,
seeded from --seed and the pair: the same arguments give the same games and the same figures. From that tournament:
TrueSkill with random anchored at 0 (OpenAI Five), Elo (maximum likelihood, random = 0) and Nash averaging (ELF
OpenGo; an LP solve). The table is printed, and the figures go into the run's metrics.h5 as eval/trueskill/policy,
eval/elo/policy, eval/nash/policy, ... at each rated version, with eval/games/* (games behind each figure) and the
references' figures beside them; a rerun replaces the series a previous run of this script wrote. A run still being
written by its job is refused (its controller owns metrics.h5); so are ratings written by evaluator ranks during
training, unless --replace.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from hpc_rl.launch import set_torch_threads


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="the run directory (runs/<run_name>)")
    parser.add_argument("--versions", type=int, nargs="+", metavar="V",
                        help="versions to rate (default: every committed checkpoint)")
    parser.add_argument("--games", type=int, default=16, help="games per pair of players, even (default 16)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the games (default 0)")
    parser.add_argument("--deterministic", action="store_true", help="policies play greedily instead of sampling")
    parser.add_argument("--print-only", action="store_true", help="print the table, write nothing")
    parser.add_argument("--replace", action="store_true",
                        help="replace eval/* ratings that evaluator ranks wrote during training")
    parser.add_argument("--allow-unfinished", action="store_true",
                        help="rate a pipeline run that ended without writing status.json (a crash); never use it "
                             "while the run's job is running")
    args = parser.parse_args(argv)
    if args.games < 2 or args.games % 2:
        parser.error(f"--games must be even and >= 2 (each draw is played from both sides), got {args.games}")
    if args.seed < 0:
        parser.error(f"--seed must be >= 0, got {args.seed}")
    return args


def main(argv: list[str]) -> int:
    args = parse(argv)
    set_torch_threads()  # one thread: deterministic results, and no oversubscription beside running jobs
    from hpc_rl.envs.scripted import scripted_bot_hash
    from hpc_rl.evaluation import load_policy
    from hpc_rl.league.tournament import (REFERENCES, foreign_series, format_table, metrics_writable, play_tournament,
                                          rate_tournament, run_in_progress, version_name, write_ratings)
    from hpc_rl.storage import CheckpointError, open_run

    def being_written() -> str | None:
        return (None if args.allow_unfinished else run_in_progress(args.run_dir)) or metrics_writable(args.run_dir)

    run = open_run(args.run_dir)
    if not args.print_only:
        if reason := being_written():
            raise SystemExit(f"refusing to write into a run that is being written: {reason}. Rate it with "
                             "--print-only, or once its job has ended.")
        foreign = foreign_series(args.run_dir)
        if foreign and not args.replace:
            raise SystemExit(f"{args.run_dir}/metrics.h5 holds ratings written during training ({', '.join(foreign[:4])}"
                             f"{', ...' if len(foreign) > 4 else ''}); pass --replace to replace them")
    committed = run.checkpoint_versions
    versions = sorted(set(args.versions)) if args.versions else committed
    missing = [v for v in versions if v not in committed]
    if missing or not versions:
        raise SystemExit(f"{args.run_dir}: no committed checkpoint for version(s) {missing or '(any)'}; committed: "
                         f"{committed}")
    players: dict = {ref: ref for ref in REFERENCES}
    config = None
    for v in versions:
        try:
            policy, config, _ = load_policy(args.run_dir, v)
        except CheckpointError as err:
            raise SystemExit(f"version {v}: {err}") from err
        players[version_name(v)] = policy
    if not config.env.is_moba:
        raise SystemExit(f"{args.run_dir} trains {config.env.name}: jobs/tournament.py rates MOBA runs (two teams); "
                         "rate a Gymnasium run's greedy return with hpc_rl.evaluation.evaluate_return")
    pairs = len(players) * (len(players) - 1) // 2
    print(f"rating {len(versions)} version(s) of {args.run_dir} against {', '.join(REFERENCES)} and each other: "
          f"{pairs} pairs x {args.games} games, seed {args.seed}", flush=True)
    started = time.monotonic()
    tournament = play_tournament(players, config, args.games, args.seed, args.deterministic,
                                 progress=lambda line: print(line, flush=True))
    ratings = rate_tournament(tournament)
    print(format_table(ratings))
    print(f"{pairs * args.games} games in {time.monotonic() - started:.0f} s")
    if args.print_only:
        return 0
    if reason := being_written():  # the run may have been resumed while the games were played
        raise SystemExit(f"not written: {reason}")
    names = write_ratings(args.run_dir, {v: version_name(v) for v in versions}, ratings,
                          attrs={"games_per_pair": args.games, "seed": args.seed, "deterministic": args.deterministic,
                                 "scripted_hash": scripted_bot_hash(), "written": time.time()})
    print(f"wrote {len(names)} series to {args.run_dir}/metrics.h5 ({', '.join(n for n in names if 'policy' in n)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
