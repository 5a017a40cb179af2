"""What Neural MMO runs' agents do: lifetimes, exploration and niches, against the random bot (docs/nmmo.md).

    python analysis/nmmo_behaviour.py runs/nmmo runs/nmmo_other --out plots/ [--games 8] [--seed 12345]

Each run's latest good checkpoint plays every agent of ``--games`` worlds of the run's settings, as the final
evaluation does (``hpc_rl.evaluation.nmmo_rollout``: until the first ``num_agents`` agents of each world have died),
and so does the random bot in the same worlds. Writes behaviour.md: per run and player the mean lifetime and the
distinct tiles per lifetime (95% intervals), the ticks the rollout lasted and the map coverage over them, and the niche measures of the tile visits and attack
styles: the mean Jensen-Shannon divergence (bits) between populations and the split-half baseline (one population:
the baseline only); and visits.png: where the agents of the first world stood (log colour scale; grey: water, stone
and lava).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from hpc_rl.study import Output, fmt, markdown_table, pyplot, run_script, script_parser


def parser() -> argparse.ArgumentParser:
    p = script_parser(__doc__)
    p.add_argument("--games", type=int, default=8, help="worlds per player (default 8)")
    p.add_argument("--seed", type=int, help="seed of the worlds (default: the final evaluation's)")
    return p


def interval(mean: float, ci: list[float]) -> str:
    return f"{mean:.1f} [{ci[0]:.1f}, {ci[1]:.1f}]"


def body(args: argparse.Namespace, out: Output) -> None:
    from hpc_rl.evaluation import (FINAL_EVAL_SEED, checkpoint_policies, load_checkpoint_of_run, nmmo_exploration,
                                   nmmo_niches, nmmo_rollout)
    from hpc_rl.stats import mean_ci95
    from hpc_rl.launch import set_torch_threads

    if args.games < 1:
        raise ValueError(f"--games must be >= 1, got {args.games}")
    set_torch_threads()
    seed = FINAL_EVAL_SEED if args.seed is None else args.seed
    rows, maps = [], []
    for path in args.paths:
        ckpt, config = load_checkpoint_of_run(path)
        if not config.env.is_nmmo:
            raise ValueError(f"{path} is not a Neural MMO run (env.name={config.env.name})")
        # Every population's policy on its own agents, so that the niche measures compare the populations.
        for player, who in ((f"policy v{ckpt.version}", checkpoint_policies(ckpt, config)), ("random", "random")):
            rollout = nmmo_rollout(who, config, args.games, seed)
            explored, niches = nmmo_exploration(rollout), nmmo_niches(rollout, seed)
            mean, low, high = mean_ci95(rollout.lifetimes)
            rows.append([Path(path).name, player, interval(mean, [low, high]),
                         interval(explored["tiles_per_life"], explored["tiles_per_life_ci95"]),
                         str(rollout.ticks), fmt(explored["coverage"], 2),
                         fmt(niches["tiles"]["between"]), fmt(niches["tiles"]["split_half"]),
                         fmt(niches["styles"]["between"]), fmt(niches["styles"]["split_half"])])
            size = config.env.nmmo.map_size
            first = rollout.visit_cell[rollout.visit_cell < size * size]
            maps.append((f"{Path(path).name}: {player}", np.bincount(first, minlength=size * size).reshape(size, size),
                         rollout.passable[:size * size].reshape(size, size)))
    header = ["run", "player", "lifetime [95%]", "distinct tiles per lifetime [95%]", "ticks", "coverage",
              "tiles: JS between populations", "tiles: split-half JS", "styles: JS between populations",
              "styles: split-half JS"]
    out.table("behaviour.md", f"Neural MMO behaviour, {args.games} worlds per player, seed {seed}",
              markdown_table(header, rows))
    out.figure("visits.png", visit_maps(maps))


def visit_maps(maps: list[tuple[str, np.ndarray, np.ndarray]]):
    """One panel per rollout: visits per tile of its first world on a log scale, the impassable tiles grey."""
    from matplotlib.colors import LogNorm

    plt = pyplot()
    cols = 2
    fig, axes = plt.subplots((len(maps) + cols - 1) // cols, cols, figsize=(4.2 * cols, 4 * ((len(maps) + 1) // 2)),
                             squeeze=False)
    top = max(int(counts.max()) for _, counts, _ in maps)
    for ax, (title, counts, passable) in zip(axes.flat, maps):
        ax.imshow(np.where(passable, np.nan, 0.5), cmap="Greys", vmin=0, vmax=1)
        image = ax.imshow(np.ma.masked_equal(counts, 0), cmap="viridis", norm=LogNorm(vmin=1, vmax=max(top, 2)))
        ax.set_title(title, fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    for ax in axes.flat[len(maps):]:
        ax.axis("off")
    fig.colorbar(image, ax=axes, label="agent-ticks on the tile", shrink=0.8)
    return fig


if __name__ == "__main__":
    sys.exit(run_script(parser(), body))
