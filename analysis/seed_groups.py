"""Groups of MOBA runs, one run a seed, compared at one checkpoint each: the win rate against the scripted bot from
the checkpoint evaluations (evaluations.jsonl, ``jobs/evaluate.py RUN --version V --games 200``), and every group
after the first tested against the first over seeds.

    python analysis/seed_groups.py --group "surgery" 330 runs/wide_s1 runs/wide_s2 runs/wide_s3 \\
        --group "from scratch" 87 runs/scratch_s1 runs/scratch_s2 runs/scratch_s3 --levels 0.61 --out plots/

Each ``--group NAME VERSION RUN ...`` names its runs and the version to read in each (versions differ where the
groups started at different versions, e.g. a surgery's run counts on from its source's). groups.md holds a row per
run (its checkpoint's games pooled over seeds of evaluation, with the Wilson interval), a row per group (mean and
standard deviation over its runs, and how many runs reach each ``--levels`` win rate), and a line per later group
``direction test: <first group> above <group>, p = <value>``: one-sided, over seeds, by ranks
(``hpc_rl.stats.permutation_p``: exact over every split of the pooled runs; the smallest p is 1 / C(n + m, n),
0.004 for 5 runs against 5). A run's games are one policy's, so the seeds, not the games, are the samples; each
group's runs must be distinct and each must have the version evaluated.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from hpc_rl.stats import permutation_p
from hpc_rl.study import Output, checkpoint_rows, fmt, load_runs, markdown_table, run_script


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--group", nargs="+", action="append", required=True, metavar="NAME VERSION RUN",
                   help="a group: its name, the version read in each run, then its run directories (one a seed)")
    p.add_argument("--levels", type=float, nargs="+", default=[], help="win rates: how many runs of a group reach each")
    p.add_argument("--z", type=float, default=1.96, help="normal quantile of the intervals (default 1.96: 95%%)")
    p.add_argument("--out", required=True, type=Path, help="directory for groups.md")
    return p


def group_rates(name: str, version: int, paths: list[str], z: float) -> list[tuple[str, np.ndarray]]:
    """(run label, checkpoint row (version, games, wins, win rate, low, high)) of each run at ``version``."""
    if len(set(paths)) < len(paths):
        raise ValueError(f"group {name!r} names a run twice")
    out = []
    for run in load_runs(paths):
        rows = checkpoint_rows(run, z)
        at = rows[rows[:, 0] == version]  # checkpoint_rows is (0, 6) for a run never evaluated
        if not len(at):
            raise ValueError(f"group {name!r}: {run.path} has no evaluation of version {version} "
                             f"(jobs/evaluate.py {run.path} --version {version})")
        out.append((run.label, at[0]))
    return out


def body(args: argparse.Namespace, out: Output) -> None:
    groups = []
    for spec in args.group:
        if len(spec) < 3:
            raise ValueError(f"--group needs NAME VERSION RUN [RUN ...], got {spec}")
        name, version, paths = spec[0], spec[1], spec[2:]
        try:
            version = int(version)
        except ValueError:
            raise ValueError(f"--group {name!r}: the version must be an integer, got {version!r}") from None
        groups.append((name, version, group_rates(name, version, paths, args.z)))
    if len({name for name, _, _ in groups}) < len(groups):
        raise ValueError("two groups share a name")
    runs = [[name, label, fmt(v), fmt(n), fmt(w), fmt(p), fmt(lo), fmt(hi)]
            for name, _, rows in groups for label, (v, n, w, p, lo, hi) in rows]
    summary = []
    for name, version, rows in groups:
        rates = np.array([row[3] for _, row in rows])
        summary.append([name, fmt(version), len(rates), fmt(rates.mean()),
                        fmt(rates.std(ddof=1)) if len(rates) > 1 else "-", fmt(rates.min()), fmt(rates.max()),
                        *(f"{int(np.sum(rates >= level))}/{len(rates)}" for level in args.levels)])
    first = groups[0]
    tests = [f"direction test: {first[0]} above {name}, p = "
             f"{permutation_p([row[3] for _, row in first[2]], [row[3] for _, row in rows]):.4f}"
             for name, _, rows in groups[1:]]
    text = (markdown_table(["group", "run", "version", "games", "wins", "win rate", "ci low", "ci high"], runs)
            + "\n" + markdown_table(["group", "version", "runs", "mean", "sd", "min", "max",
                                     *(f"runs >= {level:g}" for level in args.levels)], summary)
            + "".join(f"\n{line}\n" for line in tests))
    out.table("groups.md", "win rate vs the scripted bot at one checkpoint per run, groups of seeds", text)


def main(argv: list[str] | None = None) -> int:
    return run_script(parser(), body, argv)


if __name__ == "__main__":
    sys.exit(main())
