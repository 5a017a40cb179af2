"""Win rate against the frozen scripted bot with 95% Wilson confidence intervals (MOBA runs).

    python analysis/win_rate.py runs/ablation_staleness --out plots/

Each row of eval/win_rate_vs_scripted is the win rate over the games against the scripted bot finished in the last
ten versions, and eval/games_vs_scripted their number; the interval comes from those two (draws count as losses).
Consecutive rows share games, so the band shows the uncertainty of each point, not of a difference between
neighbours. Where games are long and few finish in ten versions (5v5), ``--block N`` pools the games of blocks of N
versions instead (disjoint ten-version windows summed; N a multiple of ten): each point then counts its own games.
Writes win_rate.png and win_rate.md (per run, --rows evenly spaced versions including the last).

    python analysis/win_rate.py runs/moba5v5 --block 100 --out plots/

``--levels`` adds levels.md: per run and level, the first row (block, with ``--block``) whose win rate reaches it, its
version and the env steps played by then in that run directory (perf/env_steps, which each job of a run counts from
its start, summed over the run's jobs). A run made by surgery (docs/surgery.md) counts from the surgery, so a
continued run and one trained from scratch compare as env steps to reach a level:

    python analysis/win_rate.py runs/wide runs/wide_scratch --block 20 --levels 0.5 0.7 --out plots/

``--checkpoints`` reads the run's checkpoint evaluations instead (``evaluations.jsonl``, written by
``jobs/evaluate.py RUN --version all --games 200``): each row a committed checkpoint's games against the scripted
bot, those of several seeds pooled; ``--block`` pools the checkpoints of each block, and ``--levels`` works as above.
Training's windows mix the policies of ten versions and count tens of games; a checkpoint's evaluation is one policy
and as many games as asked, so levels read from it are the ones to compare runs by.

    python analysis/win_rate.py runs/wide runs/wide_scratch --checkpoints --env-steps --levels 0.6 0.7 --out plots/
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from hpc_rl.stats import wilson_interval
from hpc_rl.metric_names import ENV_STEPS, GAMES_VS_SCRIPTED, WIN_RATE_VS_SCRIPTED, WIN_RATE_WINDOW
from hpc_rl.study import (VERSION_LABEL, Output, RunData, checkpoint_rows, fmt, load_runs, markdown_table, pyplot,
                          run_script, script_parser)


def parser() -> argparse.ArgumentParser:
    p = script_parser(__doc__)
    p.add_argument("--rows", type=int, default=5, help="versions per run in the table (default 5)")
    p.add_argument("--z", type=float, default=1.96, help="normal quantile of the interval (default 1.96: 95%%)")
    p.add_argument("--block", type=int, default=0,
                   help=f"pool the games of blocks of this many versions (a multiple of {WIN_RATE_WINDOW} for training's "
                        f"windows; default 0: every version's {WIN_RATE_WINDOW}-version window, or every checkpoint)")
    p.add_argument("--env-steps", action="store_true",
                   help="plot against the env steps played in each run directory (a surgery's run counts from the "
                        "surgery) instead of versions")
    p.add_argument("--checkpoints", action="store_true",
                   help="the checkpoints' evaluations (evaluations.jsonl, jobs/evaluate.py) instead of training's windows")
    p.add_argument("--levels", type=float, nargs="+", default=[],
                   help="win rates: the first version (and env steps) at which each run reaches each (levels.md)")
    return p


def win_rate_rows(run: RunData, z: float) -> np.ndarray:
    """(version, games, wins, win rate, low, high) for every version with games against the scripted bot."""
    rate = run.metrics[WIN_RATE_VS_SCRIPTED]
    played = run.metrics[GAMES_VS_SCRIPTED]
    games = {int(v): g for v, g in zip(played["version"], played["value"])}
    out = []
    for v, p in zip(rate["version"], rate["value"]):
        n = games.get(int(v), 0.0)
        if n <= 0 or not np.isfinite(p):
            continue
        wins = round(p * n)  # the rate is wins / games of integers: rounding undoes the float division
        low, high = wilson_interval(wins, n, z)
        out.append((int(v), n, wins, wins / n, low, high))
    return np.array(out, dtype=np.float64).reshape(-1, 6)


def pooled_rows(rows: np.ndarray, block: int, z: float) -> np.ndarray:
    """Rows of disjoint games (``checkpoint_rows``, or ``win_rate_rows`` at multiples of WIN_RATE_WINDOW) pooled
    over blocks of ``block`` versions: games and wins summed per block, each block's row at its last version."""
    if block <= 0:
        raise ValueError(f"--block must be positive, got {block}")
    out = []
    for end in np.unique(np.ceil(rows[:, 0] / block) * block):
        inside = rows[(rows[:, 0] > end - block) & (rows[:, 0] <= end)]
        n, wins = inside[:, 1].sum(), inside[:, 2].sum()
        low, high = wilson_interval(int(wins), int(n), z)
        out.append((inside[-1, 0], n, wins, wins / n, low, high))
    return np.array(out, dtype=np.float64).reshape(-1, 6)


def run_env_steps(versions: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """perf/env_steps summed over a run's jobs: each job counts from 0, so where the count drops a new job began and
    the steps before it are added (those after a job's last row are not recorded, a heartbeat's worth at most)."""
    order = np.argsort(versions, kind="stable")
    steps = np.asarray(steps, dtype=np.float64)[order]
    before = np.concatenate([[0.0], np.where(np.diff(steps) < 0, steps[:-1], 0.0)])
    total = np.empty_like(steps)
    total[order] = steps + np.cumsum(before)
    return total


def env_steps_at(run: RunData, versions: np.ndarray) -> np.ndarray:
    """The env steps played in the run directory by each of ``versions`` (``run_env_steps`` at the last row at or
    before it: a checkpoint's version may have no row); NaN before the first row or without perf/env_steps."""
    if not run.has(ENV_STEPS):
        return np.full(len(versions), np.nan)
    rows, values = run.metrics[ENV_STEPS]["version"], run.metrics[ENV_STEPS]["value"]
    steps = run_env_steps(rows, values)
    order = np.argsort(rows, kind="stable")
    at = np.searchsorted(rows[order], versions, side="right") - 1
    return np.where(at >= 0, steps[order][np.maximum(at, 0)], np.nan)


def level_rows(run: RunData, rows: np.ndarray, levels: list[float]) -> list[list[str]]:
    """For each level, the first of ``rows`` (win_rate_rows or pooled_rows) reaching it: version, env steps, games,
    wins, win rate and interval ("not reached" where none does)."""
    steps = env_steps_at(run, rows[:, 0])
    out = []
    for level in levels:
        reached = np.flatnonzero(rows[:, 3] >= level)
        if not reached.size:
            out.append([run.label, fmt(level), "not reached", "", fmt(rows[-1, 0]) + " (last)", "", "", "", ""])
            continue
        v, n, wins, p, low, high = rows[reached[0]]
        out.append([run.label, fmt(level), fmt(v), fmt(steps[reached[0]]), fmt(n), fmt(wins), fmt(p), fmt(low),
                    fmt(high)])
    return out


def body(args: argparse.Namespace, out: Output) -> None:
    if args.rows < 1:
        raise ValueError(f"--rows must be >= 1, got {args.rows}")
    if args.block < 0 or (args.block % WIN_RATE_WINDOW and not args.checkpoints):
        raise ValueError(f"--block must be positive, got {args.block}" if args.checkpoints else
                         f"--block must be a positive multiple of {WIN_RATE_WINDOW}, got {args.block}")
    if args.checkpoints:
        runs = load_runs(args.paths)
    else:
        runs = [r for r in load_runs(args.paths) if r.has(WIN_RATE_VS_SCRIPTED) and r.has(GAMES_VS_SCRIPTED)]
        if not runs:
            print(f"note: no run has {WIN_RATE_VS_SCRIPTED} and {GAMES_VS_SCRIPTED} (not MOBA runs?); nothing written")
            return
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    table, levels = [], []
    for run in runs:
        if args.checkpoints:
            rows = checkpoint_rows(run, args.z)
        else:
            rows = win_rate_rows(run, args.z)
            rows = rows[rows[:, 0] % WIN_RATE_WINDOW == 0] if args.block else rows
        if args.block and len(rows):
            rows = pooled_rows(rows, args.block, args.z)
        if not len(rows):
            print(f"note: {run.label} " + ("has no checkpoint evaluated against the scripted bot (jobs/evaluate.py)"
                                           if args.checkpoints else "finished no game against the scripted bot")
                  + "; left out")
            continue
        x = env_steps_at(run, rows[:, 0]) if args.env_steps else rows[:, 0]
        line, = ax.plot(x, rows[:, 3], lw=1.4, marker="o" if args.checkpoints else None, ms=3, label=run.label)
        ax.fill_between(x, rows[:, 4], rows[:, 5], color=line.get_color(), alpha=0.2, lw=0)
        picks = np.unique(np.linspace(0, len(rows) - 1, min(args.rows, len(rows))).round().astype(int))
        for v, n, wins, p, low, high in rows[picks]:
            table.append([run.label, fmt(v), fmt(n), fmt(wins), fmt(p), fmt(low), fmt(high)])
        levels += level_rows(run, rows, args.levels)
    ax.axhline(0.5, color="grey", lw=0.8, ls=":")
    ax.set(xlabel="env steps in the run directory" if args.env_steps else VERSION_LABEL,
           ylabel="win rate vs scripted bot", ylim=(0, 1),
           title=f"win rate vs scripted bot, {100 * (2 * _normal_cdf(args.z) - 1):.0f}% Wilson intervals")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    out.figure("win_rate.png", fig)
    if args.checkpoints:
        games = (f"checkpoints' evaluations, pooled over blocks of {args.block} versions" if args.block
                 else "each checkpoint's evaluations")
    else:
        games = (f"games of blocks of {args.block} versions" if args.block
                 else f"games over the last {WIN_RATE_WINDOW} versions")
    out.table("win_rate.md", f"win rate vs the scripted bot ({games})",
              markdown_table(["run", "version", "games", "wins", "win rate", "ci low", "ci high"], table))
    if args.levels:
        out.table("levels.md", f"the first version reaching each win rate ({games})",
                  markdown_table(["run", "level", "version", "env steps", "games", "wins", "win rate", "ci low",
                                  "ci high"], levels))


def _normal_cdf(z: float) -> float:
    from math import erf, sqrt

    return 0.5 * (1 + erf(z / sqrt(2)))


def main(argv: list[str] | None = None) -> int:
    return run_script(parser(), body, argv)


if __name__ == "__main__":
    sys.exit(main())
