"""Evaluate a run's checkpoints as a training job's end does (``hpc_rl.evaluation.final_evaluation``), in one process.

    python jobs/evaluate.py runs/my_run                          # the latest good checkpoint, 100 games
    python jobs/evaluate.py runs/my_run --games 400 --version 200 --seed 1
    python jobs/evaluate.py runs/my_run --games 200 --version all # every committed checkpoint: a learning curve

MOBA: games against the frozen scripted bot, half on each side, draws counted as losses, with the 95% Wilson
interval; Gymnasium: the greedy return of one episode per game; Neural MMO: the mean lifetime of the first agents of
``--games`` worlds, the policy's against the random bot's, and each one's exploration (distinct tiles per lifetime,
map coverage; docs/nmmo.md). Prints for each version one line (Neural MMO: two) and the result as JSON.

Each result is appended to the run's ``evaluations.jsonl`` (``{"version", "games", "seed", "time", "result"}``), and
a version evaluated already with the same games and seed (MOBA: against the same scripted bot, ``bot_hash``) is
printed from there instead of played again: the games are seeded, so they would end the same. A long list of
versions can therefore be stopped and started again; ``analysis/win_rate.py --checkpoints`` draws the curve.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from hpc_rl.launch import set_torch_threads


def versions_arg(text: str) -> int | str:
    if text == "all":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a version is a checkpoint's number or 'all', got {text!r}") from None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="the run directory (runs/<run_name>)")
    parser.add_argument("--games", type=int, default=100,
                        help="games (Gymnasium: episodes; Neural MMO: worlds), even (default 100)")
    parser.add_argument("--version", type=versions_arg, nargs="+",
                        help="the checkpoints' versions, or 'all' of them (default: the latest good one)")
    parser.add_argument("--seed", type=int, help="seed of the games (default: the training job's final evaluation's)")
    args = parser.parse_args(argv)
    set_torch_threads()
    from hpc_rl.envs.scripted import scripted_bot_hash
    from hpc_rl.evaluation import FINAL_EVAL_SEED, checkpoint_policies, final_evaluation, load_checkpoint_of_run
    from hpc_rl.roles.console import final_eval_line
    from hpc_rl.storage.layout import RunLayout
    from hpc_rl.storage.run import open_run, read_evaluations, record_evaluation

    seed = FINAL_EVAL_SEED if args.seed is None else args.seed
    if args.games < 2 or args.games % 2:
        parser.error(f"--games must be even and >= 2 (half on each side), got {args.games}")
    if args.version is None:
        versions: list[int | None] = [None]
    elif "all" in args.version:
        try:
            versions = open_run(args.run_dir).checkpoint_versions
        except FileNotFoundError as err:
            parser.error(str(err))
        if not versions:
            parser.error(f"{args.run_dir} has no committed checkpoint")
    else:
        versions = list(dict.fromkeys(args.version))
    path = RunLayout(args.run_dir).evaluations
    done, bot_hash = None, None
    for asked in versions:
        try:
            ckpt, config = load_checkpoint_of_run(args.run_dir, asked)
        except (FileNotFoundError, ValueError) as err:  # no such run or version, or a checkpoint that does not load
            parser.error(str(err))
        if config.env.is_go:
            parser.error(f"{args.run_dir} is a Go run: its networks play in a ladder, e.g. python jobs/go_ladder.py "
                         f"mctsbot:sec=0.1 --run {args.run_dir} --versions {ckpt.version} --net-sec 0.1 --games 100 "
                         f"(docs/go.md, \"Evaluation\")")
        version = ckpt.version
        if done is None:  # the recorded games of this opponent (MOBA: the scripted bot as it is now), read once
            bot_hash = scripted_bot_hash() if config.env.is_moba else None
            done = {(r["version"], r["games"], r["seed"]): r for r in read_evaluations(path)
                    if r["result"].get("bot_hash") == bot_hash}
        record = done.get((version, args.games, seed))
        if record is None:
            result = final_evaluation(checkpoint_policies(ckpt, config), config, args.games, seed)
            try:
                done[version, args.games, seed] = record_evaluation(path, version, args.games, seed, result)
            except OSError as err:  # a run directory the user may read but not write: the result is still printed
                print(f"note: not recorded in {path}: {err}", file=sys.stderr)
            origin = ""
        else:
            result = record["result"]
            origin = f" (recorded {time.strftime('%Y-%m-%d %H:%M', time.localtime(record['time']))})"
        print(f"version {version}: {final_eval_line(result)}{origin}")
        if config.env.is_nmmo:
            print("exploration: " + "; ".join(
                f"{player} {result[f'{player}_tiles_per_life']:.1f} distinct tiles per lifetime "
                f"[{result[f'{player}_tiles_per_life_ci95'][0]:.1f}, "
                f"{result[f'{player}_tiles_per_life_ci95'][1]:.1f}], coverage {result[f'{player}_coverage']:.2f}"
                for player in ("policy", "random")))
        print(json.dumps({"version": version, **result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
