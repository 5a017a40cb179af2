"""MOBA 1v1 from scratch against the frozen scripted bot, in one process (the serial runner: the MPI job's roles
wired together), then a fixed evaluation.

    python jobs/vs_scripted.py --minutes 60 --clock cpu env=moba_1v1_small   # `make reproduce-1v1`
    python jobs/vs_scripted.py --minutes 5 --eval-games 100 ppo.epochs=2      # any config override of jobs/train.py

The policy plays the scripted bot in every copy, on team 0 in even copies and team 1 in odd ones, and trains on its
own steps only. Training stops after ``--minutes`` of wall time, or of this process's CPU time with ``--clock cpu``
(a budget that other work on the machine does not eat into); either clock excludes the progress evaluations. Then
the last checkpoint (the run directory is the MPI job's: metrics.h5, checkpoints/, status.json) plays
``--eval-games`` games against the bot with the fixed ``--eval-seed`` (sides alternating,
draws counted as losses), is reloaded from its HDF5 file and evaluated again to show the same result, and
``runs/<run>/vs_scripted.json`` records the win rate with its 95% Wilson interval, the bot's hash, the config, the
wall and CPU time of training.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from hpc_rl.config import build_config, register
from hpc_rl.envs.scripted import scripted_bot_hash
from hpc_rl.evaluation import load_policy, play_vs_bot
from hpc_rl.metric_names import WIN_RATE_VS_SCRIPTED
from hpc_rl.runner import SerialRunner
from hpc_rl.storage.layout import RunLayout

CONF = str(Path(__file__).resolve().parent.parent / "conf")
log = logging.getLogger("vs_scripted")


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=60.0, help="training time budget (default 60)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="what --minutes counts: wall time, or the CPU time of this process (default wall)")
    parser.add_argument("--eval-games", type=int, default=400, help="final evaluation games (default 400)")
    parser.add_argument("--eval-seed", type=int, default=12345, help="final evaluation seed (default 12345)")
    parser.add_argument("--progress-minutes", type=float, default=10.0,
                        help="wall time between progress evaluations of 50 games (default 10; 0: none)")
    parser.add_argument("overrides", nargs="*", help="config overrides, as for jobs/train.py (e.g. ppo.epochs=2)")
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.eval_games < 1:
        parser.error("--minutes must be > 0 and --eval-games >= 1")
    return args, args.overrides


def main(argv: list[str]) -> int:
    args, overrides = parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    register()
    with initialize_config_dir(version_base="1.3", config_dir=CONF):
        cfg = compose("train", overrides=["experiment=vs_scripted", *overrides])
    config = build_config(cfg)
    if not config.env.is_moba or config.env.moba.team_size != 1:
        raise SystemExit("jobs/vs_scripted.py trains MOBA 1v1 (env=moba_1v1)")
    torch.set_num_threads(1)
    run_dir = Path(config.runs_dir) / config.run_name
    if RunLayout(run_dir).checkpoints.exists():
        raise SystemExit(f"{run_dir} exists: pick a new run_name (this job does not resume)")

    runner = SerialRunner(config, overrides=tuple(overrides))
    progress: list[dict] = []
    clock = {"wall": 0.0, "cpu": 0.0}  # training only: progress evaluations are off the clock
    last = (time.perf_counter(), time.process_time())
    next_eval = args.progress_minutes * 60 if args.progress_minutes > 0 else float("inf")

    def on_update(run: SerialRunner, metrics: dict) -> bool:
        nonlocal last, next_eval
        clock["wall"] += time.perf_counter() - last[0]
        clock["cpu"] += time.process_time() - last[1]
        version = run.learner.version
        if version % 50 == 0:
            log.info("version %d  %.1f min  steps %d  %.0f steps/s  win rate in training %s", version,
                     clock["wall"] / 60, run.env_steps, run.env_steps / clock["wall"],
                     metrics.get(WIN_RATE_VS_SCRIPTED, "n/a"))
        if clock[args.clock] >= next_eval:
            next_eval += args.progress_minutes * 60
            result = play_vs_bot(run.policy.eval(), config, "scripted", games=50, seed=args.eval_seed + version)
            run.policy.train()
            progress.append({"version": version, "train_minutes": clock["wall"] / 60,
                             "train_cpu_minutes": clock["cpu"] / 60, **result})
            log.info("version %d: %d/%d wins against the scripted bot (%d draws)", version, result["wins"],
                     result["games"], result["draws"])
        last = (time.perf_counter(), time.process_time())
        return clock[args.clock] >= args.minutes * 60

    runner.run(on_update)  # the controller commits every checkpoint_every versions and the last one
    train_seconds, cpu_seconds = clock["wall"], clock["cpu"]
    version = runner.learner.version
    config_hash = config.config_hash()

    log.info("evaluating version %d: %d games, seed %d", version, args.eval_games, args.eval_seed)
    final = play_vs_bot(runner.policy.eval(), config, "scripted", games=args.eval_games, seed=args.eval_seed)
    reloaded_policy, _, reloaded_version = load_policy(run_dir, version)
    reloaded = play_vs_bot(reloaded_policy, config, "scripted", games=args.eval_games, seed=args.eval_seed)
    report = {
        "version": version, "env_steps": runner.env_steps, "train_wall_seconds": train_seconds,
        "train_cpu_seconds": cpu_seconds, "clock": args.clock, "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "eval_seed": args.eval_seed, "final": final, "reloaded_version": reloaded_version,
        "reloaded": reloaded,
        "reload_matches": (reloaded["wins"], reloaded["draws"]) == (final["wins"], final["draws"]),
        "bot_hash": scripted_bot_hash(), "config_hash": config_hash, "overrides": overrides, "progress": progress,
    }
    RunLayout(run_dir).report("vs_scripted").write_text(json.dumps(report, indent=2) + "\n")
    low, high = final["win_rate_ci95"]
    print(f"version {version} after {train_seconds / 60:.1f} min ({cpu_seconds / 60:.1f} CPU min): "
          f"{final['wins']}/{final['games']} wins against the scripted bot = {final['win_rate']:.1%} "
          f"(95% CI {low:.1%}-{high:.1%}; {final['draws']} draws counted as losses); reloaded checkpoint: "
          f"{reloaded['wins']} wins, {'same' if report['reload_matches'] else 'DIFFERENT'}; "
          f"bot {final['bot_hash'][:12]}")
    return 0 if report["reload_matches"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
