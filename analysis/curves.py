"""Learning curves: one metric against policy versions and against wall time, several runs overlaid.

    python analysis/curves.py runs/ablation_staleness runs/my_run --out plots/
    python analysis/curves.py runs/my_run --metric train/entropy --smooth 5 --out plots/

The default metric is the trained policy's TrueSkill (eval/trueskill/policy), else the win rate against the scripted
bot (MOBA), else the episode return (Gymnasium). Writes curves.png and curves.md (per run: last version, final,
best, wall time and the settings its resumes changed, config_changes.jsonl, which the plot against versions marks
with a dashed line at each version resumed), and, when runs carry TrueSkill series, trueskill.png with every rated
player.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from hpc_rl.stats import trailing_mean
from hpc_rl.study import (VERSION_LABEL, Output, check_metric, default_metric, fmt, load_runs, markdown_table, pyplot,
                          run_script, script_parser, trueskill_players, wall_axis)


def parser() -> argparse.ArgumentParser:
    p = script_parser(__doc__)
    p.add_argument("--metric", help="series to plot (default: TrueSkill, else win rate vs scripted, else return)")
    p.add_argument("--smooth", type=int, default=1, help="trailing mean over this many versions (default 1: none)")
    return p


def body(args: argparse.Namespace, out: Output) -> None:
    runs = load_runs(args.paths)
    metric = args.metric or default_metric(runs)
    check_metric(runs, metric)
    plt = pyplot()
    fig, (by_version, by_wall) = plt.subplots(1, 2, figsize=(12, 4.5))
    rows = []
    with_metric = [r for r in runs if r.has(metric)]
    longest = max(float(np.max(r.series(metric)[1], initial=0.0)) for r in with_metric)
    scale, wall_label = wall_axis(longest)
    for run in runs:
        if not run.has(metric):
            print(f"note: {run.label} has no {metric}; left out")
            continue
        versions, wall, values = run.series(metric)
        smooth = trailing_mean(values, args.smooth)
        line, = by_version.plot(versions, smooth, label=run.label, lw=1.4)
        by_wall.plot(wall / scale, smooth, color=line.get_color(), lw=1.4)
        for version, keys in changes_by_version(run.config_changes).items():
            by_version.axvline(version, color=line.get_color(), ls="--", lw=0.8)
            by_version.annotate(", ".join(keys), (version, 0.98), xycoords=("data", "axes fraction"), rotation=90,
                                va="top", ha="right", fontsize=6, color=line.get_color())
        rows.append([run.label, fmt(int(versions[-1])) if versions.size else "-",
                     fmt(float(smooth[-1])) if smooth.size else "-",
                     fmt(float(np.max(smooth))) if smooth.size else "-",
                     fmt(int(versions[int(np.argmax(smooth))])) if smooth.size else "-",
                     fmt(float(wall[-1]) / scale, 2) if wall.size else "-",
                     "; ".join(f"v{c['version']} {c['key']} {c['old']} -> {c['new']}" for c in run.config_changes)
                     or "-"])
    title = metric + (f" (trailing mean over {args.smooth} versions)" if args.smooth > 1 else "")
    by_version.set(xlabel=VERSION_LABEL, ylabel=metric, title=title)
    by_wall.set(xlabel=wall_label, ylabel=metric, title=f"{metric} vs wall time")
    for ax in (by_version, by_wall):
        ax.grid(alpha=0.3)
    by_version.legend(fontsize=7, loc="best")
    out.figure("curves.png", fig)
    out.table("curves.md", f"{metric} per run",
              markdown_table(["run", "last version", "final", "best", "best at version", wall_label,
                              "setting changes"], rows))
    trueskill(runs, out)


def changes_by_version(changes: list[dict]) -> dict[int, list[str]]:
    """The keys of config_changes.jsonl's lines grouped by the version resumed, in order."""
    grouped: dict[int, list[str]] = {}
    for change in changes:
        grouped.setdefault(int(change["version"]), []).append(change["key"])
    return grouped


def trueskill(runs, out: Output) -> None:
    """Every TrueSkill series (the policy and reference players, mu relative to random) against versions."""
    players = trueskill_players(runs)
    if not players:
        print("note: no eval/trueskill/* series in any run; TrueSkill plot skipped")
        return
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in runs:
        for name in players:
            if run.has(name):
                versions, _, values = run.series(name)
                ax.plot(versions, values, lw=1.2, label=f"{run.label}: {name.removeprefix('eval/trueskill/')}")
    ax.axhline(0.0, color="grey", lw=0.8, ls=":")
    ax.set(xlabel=VERSION_LABEL, ylabel="TrueSkill mu (random = 0)", title="TrueSkill ratings")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    out.figure("trueskill.png", fig)


def main(argv: list[str] | None = None) -> int:
    return run_script(parser(), body, argv)


if __name__ == "__main__":
    sys.exit(main())
