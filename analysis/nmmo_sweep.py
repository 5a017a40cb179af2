"""Neural MMO sweeps: lifetime, exploration and niches against the swept populations or agent cap (docs/nmmo.md,
"Sweeps"; conf/ablation/nmmo_populations.yaml and nmmo_agents.yaml).

    python analysis/nmmo_sweep.py runs/nmmo_populations [more sweep or run directories] --out plots/ \
        [--param env.nmmo.populations] [--games 8] [--seed 12345]

The members (sweep directories are expanded to them; all given make one sweep) are grouped by the swept setting,
env.nmmo.populations or env.nmmo.num_agents, whichever differs between them (or --param). Each member's latest good
checkpoint plays the rollout of the final evaluation (``hpc_rl.evaluation.nmmo_rollout``: every population's policy
on its own agents of ``--games`` worlds, by default the run's pipeline.final_eval_games, from the final evaluation's
seed; then the random bot in the same worlds), so its lifetimes repeat summary.json's, and it adds what summary.json
does not hold: the niche measures. Writes sweep.md (per member: the lifetimes and their ratio, distinct tiles per
lifetime and coverage, each with the random bot's; the tile and style divergence between populations, the
split-half baseline and, for tiles, the shuffled one (groups of the populations' sizes drawn from all agents:
hpc_rl/envs/nmmo_measures.py); then per swept value the mean over seeds with its 95% interval, and how far the
populations diverge beyond the shuffled baseline, with the p-value of the permutation test) and sweep.png (the same
against the swept value: one dot per seed, the line through the means over seeds, their interval shaded where
there are several seeds).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpc_rl.study import Output, config_value, fmt, load_runs, markdown_table, pyplot, run_script, script_parser

SWEPT_KEYS = ("env.nmmo.populations", "env.nmmo.num_agents")


def parser() -> argparse.ArgumentParser:
    p = script_parser(__doc__)
    p.add_argument("--param", choices=SWEPT_KEYS, help="the swept setting (default: the one that differs)")
    p.add_argument("--games", type=int, help="worlds per player (default: each run's pipeline.final_eval_games)")
    p.add_argument("--seed", type=int, help="seed of the worlds (default: the final evaluation's)")
    return p


# --- pure helpers ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Member:
    """One member's figures from its rollouts (lifetimes in ticks; intervals are 95% over the cohort's agents)."""

    name: str
    value: int  # of the swept setting
    seed: int
    version: int
    lifetime: tuple[float, float, float]  # the policy's cohort: mean, low, high
    random_lifetime: tuple[float, float, float]
    tiles: tuple[float, float, float]  # distinct tiles per lifetime
    random_tiles: float
    coverage: float
    random_coverage: float
    tiles_between: float | None  # JS divergence (bits) of the populations' tile distributions; None with one
    tiles_split_half: float | None
    tiles_shuffled: float | None  # the divergence between groups of the populations' sizes drawn from all agents
    tiles_shuffled_p: float | None  # the permutation test's p-value of tiles_between against those groups
    styles_between: float | None
    styles_split_half: float | None

    @property
    def ratio(self) -> float:
        return self.lifetime[0] / self.random_lifetime[0]

    @property
    def niche_excess(self) -> float | None:
        """How far the populations' tile distributions diverge beyond groups of their sizes drawn from all agents
        together (> 0: niches; the split-half baseline's halves are smaller than a population, so it sits higher)."""
        if self.tiles_between is None or self.tiles_shuffled is None:
            return None
        return self.tiles_between - self.tiles_shuffled


def swept_setting(configs: Sequence[dict], param: str | None = None) -> str:
    """The one of ``SWEPT_KEYS`` whose value differs between the members' configs (``param`` if given)."""
    if param is not None:
        return param
    varying = [k for k in SWEPT_KEYS if len({config_value(c, k) for c in configs}) > 1]
    if len(varying) != 1:
        raise ValueError(f"the members differ in {varying or 'none'} of {', '.join(SWEPT_KEYS)}: pass --param "
                         f"(a sweep varies one of them)")
    return varying[0]


def seed_interval(values: Sequence[float | None]) -> tuple[float, float, float]:
    """The mean over seeds of a figure and its 95% interval (Student's t: a sweep has few seeds); NaN for the
    interval with one seed, and all NaN with none (members without the figure are left out)."""
    from scipy.stats import t

    x = np.array([v for v in values if v is not None], dtype=np.float64)
    if x.size == 0:
        return float("nan"), float("nan"), float("nan")
    mean = float(x.mean())
    if x.size == 1:
        return mean, float("nan"), float("nan")
    half = float(t.ppf(0.975, x.size - 1)) * float(x.std(ddof=1)) / np.sqrt(x.size)
    return mean, mean - half, mean + half


def by_value(members: Sequence[Member]) -> dict[int, list[Member]]:
    """The members grouped by the swept value (ascending), each group ordered by seed."""
    groups: dict[int, list[Member]] = {}
    for m in sorted(members, key=lambda m: (m.value, m.seed)):
        groups.setdefault(m.value, []).append(m)
    return groups


def interval(mean: float, low: float, high: float, digits: int = 1) -> str:
    """``mean [low, high]``; the mean alone where there is no interval (one seed), ``-`` without a mean."""
    if not np.isfinite(mean):
        return "-"
    return f"{mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]" if np.isfinite(low) else f"{mean:.{digits}f}"


def over_seeds(members: Sequence[Member], get, digits: int = 1) -> str:
    """A figure's mean over the members (seeds) of one swept value, with its 95% interval."""
    return interval(*seed_interval([get(m) for m in members]), digits=digits)


# --- the rollouts ---------------------------------------------------------------------------------------------
def measure(path: Path, name: str, value: int, games: int | None, seed: int) -> Member:
    """The member's policy and the random bot in the final evaluation's worlds."""
    from hpc_rl.evaluation import (checkpoint_policies, load_checkpoint_of_run, nmmo_exploration, nmmo_niches,
                                   nmmo_rollout)
    from hpc_rl.stats import mean_ci95

    ckpt, config = load_checkpoint_of_run(path)
    if not config.env.is_nmmo:
        raise ValueError(f"{path} is not a Neural MMO run (env.name={config.env.name})")
    worlds = games or config.pipeline.final_eval_games or 8
    policy = nmmo_rollout(checkpoint_policies(ckpt, config), config, worlds, seed)
    random = nmmo_rollout("random", config, worlds, seed)
    explored, random_explored = nmmo_exploration(policy), nmmo_exploration(random)
    niches = nmmo_niches(policy, seed)
    return Member(name, value, config.seed, ckpt.version, mean_ci95(policy.lifetimes), mean_ci95(random.lifetimes),
                  (explored["tiles_per_life"], *explored["tiles_per_life_ci95"]), random_explored["tiles_per_life"],
                  explored["coverage"], random_explored["coverage"], niches["tiles"]["between"],
                  niches["tiles"]["split_half"], niches["tiles"]["shuffled"], niches["tiles"]["shuffled_p"],
                  niches["styles"]["between"], niches["styles"]["split_half"])


def body(args: argparse.Namespace, out: Output) -> None:
    from hpc_rl.evaluation import FINAL_EVAL_SEED
    from hpc_rl.launch import set_torch_threads

    if args.games is not None and args.games < 1:
        raise ValueError(f"--games must be >= 1, got {args.games}")
    set_torch_threads()
    runs = load_runs(args.paths)
    key = swept_setting([r.config for r in runs], args.param)
    seed = FINAL_EVAL_SEED if args.seed is None else args.seed
    members = [measure(r.path, r.label, int(config_value(r.config, key)), args.games, seed) for r in runs]
    groups = by_value(members)
    rows = [[m.value, m.seed, m.name, m.version, interval(*m.lifetime), interval(*m.random_lifetime),
             f"{m.ratio:.2f}", interval(*m.tiles), f"{m.random_tiles:.1f}", fmt(m.coverage, 2),
             fmt(m.random_coverage, 2), fmt(m.tiles_between), fmt(m.tiles_split_half), fmt(m.tiles_shuffled),
             fmt(m.tiles_shuffled_p, 2), fmt(m.styles_between), fmt(m.styles_split_half)] for ms in groups.values() for m in ms]
    header = [key, "seed", "run", "version", "lifetime [95%]", "random's", "ratio", "distinct tiles per lifetime "
              "[95%]", "random's", "coverage", "random's", "tiles: JS between populations", "tiles: split-half JS",
              "tiles: shuffled JS", "p", "styles: JS between populations", "styles: split-half JS"]
    summary = [[value, len(ms), over_seeds(ms, lambda m: m.ratio, 2), over_seeds(ms, lambda m: m.tiles[0]),
                over_seeds(ms, lambda m: m.coverage, 2), over_seeds(ms, lambda m: m.tiles_between, 3),
                over_seeds(ms, lambda m: m.tiles_split_half, 3), over_seeds(ms, lambda m: m.tiles_shuffled, 3),
                over_seeds(ms, lambda m: m.niche_excess, 3)]
               for value, ms in groups.items()]
    out.table("sweep.md", f"Neural MMO sweep over {key}: the final evaluation's rollout, seed {seed}",
              markdown_table(header, rows) + "\nMean over seeds (95% interval with several seeds):\n\n"
              + markdown_table([key, "seeds", "lifetime ratio", "distinct tiles per lifetime", "coverage",
                                "tiles: JS between populations", "tiles: split-half JS",
                                "tiles: shuffled JS", "tiles: between minus shuffled"], summary))
    out.figure("sweep.png", figure(key, groups))


def figure(key: str, groups: dict[int, list[Member]]):
    """Four panels against the swept value (log scale, base 2): lifetime ratio, distinct tiles per lifetime,
    coverage, and the populations' tile divergence against the split-half and shuffled baselines."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 4, figsize=(17, 4))
    values = list(groups)
    panels = [("mean lifetime / random's", "policy", lambda m: m.ratio, None),
              ("distinct tiles per lifetime", "policy", lambda m: m.tiles[0], lambda m: m.random_tiles),
              ("map coverage", "policy", lambda m: m.coverage, lambda m: m.random_coverage),
              ("tiles: JS divergence (bits)", "between populations", lambda m: m.tiles_between, None)]
    for ax, (label, name, get, random) in zip(axes, panels):
        line(ax, groups, get, name, "C0")
        if random is not None:
            line(ax, groups, random, "random bot", "grey")
        ax.set_ylabel(label)
    line(axes[3], groups, lambda m: m.tiles_split_half, "split-half baseline", "C1")
    line(axes[3], groups, lambda m: m.tiles_shuffled, "shuffled baseline", "C2")
    for m in (m for ms in groups.values() for m in ms):  # the per-agent intervals of each seed's tiles
        axes[1].errorbar(m.value, m.tiles[0], yerr=[[m.tiles[0] - m.tiles[1]], [m.tiles[2] - m.tiles[0]]],
                         color="C0", capsize=3, lw=1)
    axes[0].axhline(1.0, color="grey", lw=0.8, ls=":")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(values, [str(v) for v in values])
        ax.minorticks_off()
        ax.set_xlabel(key)
        ax.legend(fontsize=8)
    seeds = sorted({m.seed for ms in groups.values() for m in ms})
    fig.suptitle(f"Neural MMO sweep over {key}: seeds {', '.join(map(str, seeds))} (dots), their mean (line)")
    return fig


def line(ax, groups: dict[int, list[Member]], get, label: str, color: str) -> None:
    """One dot per member, a line through the means over seeds and their 95% interval shaded (several seeds)."""
    points = [(m.value, get(m)) for ms in groups.values() for m in ms if get(m) is not None]
    if not points:
        return
    ax.scatter(*zip(*points), color=color, s=14, alpha=0.7)
    stats = [(v, *seed_interval([get(m) for m in ms])) for v, ms in groups.items()]
    stats = [s for s in stats if np.isfinite(s[1])]
    x, mean, low, high = (np.array(c) for c in zip(*stats))
    ax.plot(x, mean, color=color, label=label)
    if np.isfinite(low).any():
        ax.fill_between(x, low, high, color=color, alpha=0.15)


if __name__ == "__main__":
    sys.exit(run_script(parser(), body))
