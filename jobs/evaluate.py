"""Evaluate a run's checkpoint as a training job's end does (``hpc_rl.evaluation.final_evaluation``), in one process.

    python jobs/evaluate.py runs/my_run                          # the latest good checkpoint, 100 games
    python jobs/evaluate.py runs/my_run --games 400 --version 200 --seed 1

MOBA: games against the frozen scripted bot, half on each side, draws counted as losses, with the 95% Wilson
interval; Gymnasium: the greedy return of one episode per game; Neural MMO: the mean lifetime of the first agents of
``--games`` worlds, the policy's against the random bot's, and each one's exploration (distinct tiles per lifetime,
map coverage; docs/nmmo.md). Prints one line (Neural MMO: two) and, last, the result as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hpc_rl.launch import set_torch_threads


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="the run directory (runs/<run_name>)")
    parser.add_argument("--games", type=int, default=100,
                        help="games (Gymnasium: episodes; Neural MMO: worlds), even (default 100)")
    parser.add_argument("--version", type=int, help="the checkpoint's version (default: the latest good one)")
    parser.add_argument("--seed", type=int, help="seed of the games (default: the training job's final evaluation's)")
    args = parser.parse_args(argv)
    set_torch_threads()
    from hpc_rl.evaluation import FINAL_EVAL_SEED, checkpoint_policies, final_evaluation, load_checkpoint_of_run
    from hpc_rl.roles.console import final_eval_line

    ckpt, config = load_checkpoint_of_run(args.run_dir, args.version)
    version = ckpt.version
    try:
        result = final_evaluation(checkpoint_policies(ckpt, config), config, args.games,
                                  FINAL_EVAL_SEED if args.seed is None else args.seed)
    except ValueError as err:
        parser.error(str(err))
    print(f"version {version}: {final_eval_line(result)}")
    if config.env.is_nmmo:
        print("exploration: " + "; ".join(
            f"{player} {result[f'{player}_tiles_per_life']:.1f} distinct tiles per lifetime "
            f"[{result[f'{player}_tiles_per_life_ci95'][0]:.1f}, {result[f'{player}_tiles_per_life_ci95'][1]:.1f}], "
            f"coverage {result[f'{player}_coverage']:.2f}" for player in ("policy", "random")))
    print(json.dumps({"version": version, **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
