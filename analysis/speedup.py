"""OpenAI Five Figure 5: speed-up of each member of an ablation sweep over the baseline, at several thresholds.

    python analysis/speedup.py runs/ablation_staleness runs/ablation_reuse --out plots/
    python analysis/speedup.py runs/ablation_batch_size --thresholds 0.4 0.5 0.6 --baseline 2 --out plots/

    speedup(T) = versions for the baseline to first reach T / versions for the member to first reach T   (eq. 2)

The members are grouped by the swept parameter, read from each member's config.yaml (pipeline.segments_per_batch,
pipeline.staleness_queue or pipeline.target_reuse; --param for another key); the seeds of a group give the spread.
The baseline's versions to reach T is the mean over its seeds that reached T (undefined when fewer than
--min-reached of them did, as the paper omits thresholds too few runs reach); each member seed's speed-up divides
that mean by its own versions. Speed-ups are plotted against the swept value and against the *measured* staleness
(sample-weighted mean) and reuse (mean over versions) of each group, with min..max over seeds as error bars; a group
too few of whose seeds reach T is drawn as a triangle at speed-up 0.

Every table ends with the direction the paper found, tested over seeds at one threshold (--test-threshold, default
the middle one): `direction test: <what>, p = <value>`, a one-sided permutation test of versions to T (a seed that
never reached T counts as slowest). Staleness and reuse: the value farthest from the baseline learns slower than the
baseline; batch size: a batch 4x the baseline's needs fewer versions, but more than a quarter as many (sublinear).

Writes, per sweep, speedup_<sweep>.png (the metric against versions for every member; speed-up against the swept
value, the measured staleness and the measured reuse) and speedup_<sweep>.md (one row per threshold and value, then
the direction test).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from hpc_rl.metric_names import REUSE, STALENESS_MEAN
from hpc_rl.stats import spread, trailing_mean
from hpc_rl.study import (ABLATION_KEYS, DEFAULT_BASELINE, VERSION_LABEL, Output, RunData, SpeedupRow, check_metric,
                          choose_baseline, config_value, default_metric, default_thresholds, direction_test,
                          first_crossing, fmt, global_batch_steps, is_sweep, load_sweep, markdown_table, measured_reuse,
                          measured_staleness, pyplot, run_script, script_parser, speedup_rows, swept_key)


def parser() -> argparse.ArgumentParser:
    p = script_parser(__doc__)
    p.add_argument("--metric", help="rating to reach (default: TrueSkill, else win rate vs scripted, else return)")
    p.add_argument("--param", help="swept config key (default: the one of " + ", ".join(ABLATION_KEYS)
                   + " that differs between members)")
    p.add_argument("--baseline", help="'smallest', 'largest' or a swept value (default: smallest for every "
                   "ablation: queue 0 and reuse 1 as in the paper, and the smallest batch)")
    p.add_argument("--thresholds", type=float, nargs="+",
                   help="metric thresholds T (default: 25%%, 50%% and 75%% of the way from the baseline's mean "
                        "first value to its mean best value)")
    p.add_argument("--test-threshold", type=float,
                   help="the threshold of the direction test; one of --thresholds (default: the middle one)")
    p.add_argument("--smooth", type=int, default=1,
                   help="trailing mean over this many versions before looking for the first crossing (default 1)")
    p.add_argument("--min-reached", type=float, default=0.5,
                   help="fraction of a group's seeds that must reach T for its speed-up to be plotted (default 0.5)")
    return p


def body(args: argparse.Namespace, out: Output) -> None:
    if not 0.0 < args.min_reached <= 1.0:
        raise ValueError(f"--min-reached must be in (0, 1], got {args.min_reached}")
    for path in map(Path, args.paths):
        if not is_sweep(path):
            raise ValueError(f"{path} is not a sweep directory (no index.tsv); the speed-up needs a sweep")
        sweep(path, args, out)


def sweep(path: Path, args: argparse.Namespace, out: Output) -> None:
    members = load_sweep(path)
    metric = args.metric or default_metric(members)
    check_metric(members, metric)
    key = args.param or swept_key(members)
    ablation = ABLATION_KEYS.get(key, key)
    groups: dict[float, list[RunData]] = {}
    for run in members:
        if not run.has(metric):
            print(f"note: {run.label} has no {metric}; left out")
            continue
        groups.setdefault(float(config_value(run.config, key)), []).append(run)
    baseline = choose_baseline(list(groups), args.baseline or DEFAULT_BASELINE.get(ablation, "smallest"))
    curves = {id(r): (r.series(metric)[0], trailing_mean(r.series(metric)[2], args.smooth))
              for g in groups.values() for r in g}
    thresholds = args.thresholds or default_thresholds([curves[id(r)][1] for r in groups[baseline]])
    print(f"{path}: {ablation} ({key}), metric {metric}, baseline {fmt(baseline)}, thresholds "
          + ", ".join(fmt(t) for t in thresholds))
    crossings = {value: [[first_crossing(*curves[id(r)], t) for t in thresholds] for r in runs]
                 for value, runs in groups.items()}
    rows = speedup_rows(crossings, baseline, thresholds, args.min_reached)
    tested = tested_threshold(thresholds, args.test_threshold)
    test = direction_test({v: [c[tested] for c in seeds] for v, seeds in crossings.items()}, baseline, key,
                          thresholds[tested])
    staleness = {v: spread(measured_staleness(r.metrics) if r.has(STALENESS_MEAN) else None for r in g)
                 for v, g in groups.items()}
    reuse = {v: spread(measured_reuse(r.metrics) if r.has(REUSE) else None for r in g)
             for v, g in groups.items()}
    batch = {v: _batch(g) for v, g in groups.items()}
    table = [[fmt(row.value), fmt(batch[row.value]), fmt(row.threshold), f"{row.versions.n}/{row.versions.runs}",
              fmt(row.versions.mean, 1), fmt(row.baseline_versions, 1), fmt(row.speedups.mean),
              fmt(row.speedups.std), fmt(row.speedups.min), fmt(row.speedups.max),
              fmt(staleness[row.value].mean), fmt(reuse[row.value].mean)] for row in rows]
    out.table(f"speedup_{path.name}.md",
              f"{path.name}: speed-up over {key} = {fmt(baseline)} to reach {metric} (OpenAI Five eq. 2)",
              markdown_table([key, "batch (env steps)", "threshold", "reached", "versions mean",
                              "baseline versions", "speedup mean", "speedup std", "speedup min", "speedup max",
                              "staleness measured", "reuse measured"], table) + f"\n{test.line()}\n")
    figure(path.name, key, ablation, metric, groups, curves, rows, baseline, thresholds, staleness, reuse,
           args.min_reached, out)


def tested_threshold(thresholds: list[float], wanted: float | None) -> int:
    """Which threshold the direction test uses: ``wanted`` (one of them), else the middle one."""
    if wanted is None:
        return len(thresholds) // 2
    for i, t in enumerate(thresholds):
        if abs(t - wanted) <= 1e-9 * max(1.0, abs(t)):
            return i
    raise ValueError(f"--test-threshold {fmt(wanted)} is not one of the thresholds {[fmt(t) for t in thresholds]}")


def _batch(runs: list[RunData]) -> float | None:
    try:
        return float(global_batch_steps(runs[0].config))
    except ValueError:
        return None


def figure(name, key, ablation, metric, groups, curves, rows: list[SpeedupRow], baseline, thresholds, staleness,
           reuse, min_reached, out: Output) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 4, figsize=(21, 4.8))
    values = sorted(groups)
    colours = {v: f"C{i % 10}" for i, v in enumerate(values)}
    curve_ax = axes[0]
    for value in values:
        for i, run in enumerate(groups[value]):
            v, y = curves[id(run)]
            label = f"{key.split('.')[-1]} {fmt(value)}" + (" (b)" if value == baseline else "")
            curve_ax.plot(v, y, color=colours[value], lw=1.0, alpha=0.8, label=label if i == 0 else None)
    for t in thresholds:
        curve_ax.axhline(t, color="grey", lw=0.7, ls=":")
    curve_ax.set(xlabel=VERSION_LABEL, ylabel=metric, title=f"{metric} (thresholds dotted)")
    curve_ax.legend(fontsize=7, loc="best")

    fig.suptitle(f"{name}: speedup to reach {metric} over {key.split('.')[-1]} = {fmt(baseline)} (b); mean, "
                 "min..max over seeds")
    panels = ((axes[1], {v: spread([v]) for v in values}, f"{key} (swept)", "vs the swept value"),
              (axes[2], staleness, "measured staleness (versions)", "vs measured staleness"),
              (axes[3], reuse, "measured sample reuse", "vs measured reuse"))
    for ax, x_of, xlabel, title in panels:
        ax.set(xlabel=xlabel, ylabel="speedup (eq. 2)", title=title)
        ax.grid(alpha=0.3)
        xs = np.array([x_of[v].mean for v in values])
        note = ("not measured in every group" if not np.isfinite(xs).all() else
                f"not varied by this sweep\n(all groups {fmt(float(xs.mean()), 2)})"
                if xs.max() - xs.min() <= 0.05 * max(abs(xs.max()), 1e-9) else None)
        if note:
            # Tied x values would stack every point on one vertical line: say so instead.
            ax.text(0.5, 0.5, note, transform=ax.transAxes, ha="center", va="center")
            ax.set(xticks=[], yticks=[])
            continue
        for j, t in enumerate(thresholds):
            at_t = [r for r in rows if r.threshold == t]
            pts = sorted((r for r in at_t if r.speedups.n and r.speedups.n >= min_reached * r.speedups.runs),
                         key=lambda r: x_of[r.value].mean)
            # Groups too few of whose seeds reached T: a speed-up of 0 (T never reached), drawn as such, so that
            # what never learned stays on the plot rather than vanishing from it.
            missed = [r for r in at_t if r not in pts]
            if missed:
                ax.scatter([x_of[r.value].mean for r in missed], [0.0] * len(missed), marker="v", s=30,
                           color=f"C{j}", label=f"T = {fmt(t)}: too few seeds reached it (at 0)")
            if not pts:
                continue
            x = np.array([x_of[r.value].mean for r in pts])
            # Clipped at 0: the mean of equal values (one seed, or seeds that all measured the same) can fall a
            # rounding error outside their min..max, and matplotlib refuses a negative bar.
            xerr = np.clip([x - [x_of[r.value].min for r in pts], [x_of[r.value].max for r in pts] - x], 0, None)
            mean = np.array([r.speedups.mean for r in pts])
            err = np.clip([mean - [r.speedups.min for r in pts], [r.speedups.max for r in pts] - mean], 0, None)
            ax.errorbar(x, mean, xerr=xerr, yerr=err, marker="o", ms=4, capsize=3, lw=1.2, color=f"C{j}",
                        label=f"T = {fmt(t)}")
        if ablation == "batch_size" and ax is axes[1]:
            ax.plot(values, [v / baseline for v in values], color="black", ls="--", lw=0.8, label="linear speedup")
        ax.axhline(1.0, color="grey", lw=0.7, ls=":")
        base_x = x_of[baseline].mean
        ax.axvline(base_x, color="grey", lw=0.7, ls="--")
        ax.annotate("b", (base_x, 1.0), textcoords="offset points", xytext=(4, 4), fontsize=9)
        # Log x as in the paper's Figure 5; symlog when a value is 0 (queue length 0, staleness near 0).
        if xs.min() > 0 and xs.max() / xs.min() >= 4:
            ax.set_xscale("log", base=2)
        elif xs.min() >= 0 and xs.max() >= 4:
            ax.set_xscale("symlog", base=2, linthresh=1.0)
        ax.legend(fontsize=7, loc="best")
    out.figure(f"speedup_{name}.png", fig)


def main(argv: list[str] | None = None) -> int:
    return run_script(parser(), body, argv)


if __name__ == "__main__":
    sys.exit(main())
