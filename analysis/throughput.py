"""Throughput per role: env steps/s (env ranks), learner samples/s (learners), inference batch and latency.

    python analysis/throughput.py runs/my_run runs/other_run --out plots/

Writes throughput.png (each quantity against versions) and throughput.md (per run the median over versions, which
a slow start-up or a checkpoint pause does not move, plus total env steps and wall seconds). Inference rows of 0
(no inference report reached the controller in that version) are left out.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from hpc_rl import metric_names as M
from hpc_rl.study import VERSION_LABEL, Output, fmt, load_runs, markdown_table, pyplot, run_script, script_parser

PANELS = (
    (M.ENV_STEPS_PER_S, "env ranks: env steps / s"),
    (M.LEARNER_SAMPLES_PER_S, "learners: samples / s"),
    (M.INFERENCE_BATCH, "inference: mean batch (observations)"),
    (M.INFERENCE_PASSES, "inference: forward passes per step"),
    (M.INFERENCE_MS, "inference: forward passes of a step (ms)"),
)

# The controller logs 0 for the inference figures of a version in which no inference heartbeat had arrived yet; a
# rank that served requests never has a mean batch or forward pass of 0, so those rows are left out.
ZERO_IS_UNREPORTED = {M.INFERENCE_BATCH, M.INFERENCE_PASSES, M.INFERENCE_MS}


def parser() -> argparse.ArgumentParser:
    return script_parser(__doc__)


def body(args: argparse.Namespace, out: Output) -> None:
    runs = [r for r in load_runs(args.paths) if any(r.has(name) for name, _ in PANELS)]
    if not runs:
        raise ValueError(f"no run has any of {[name for name, _ in PANELS]}")
    plt = pyplot()
    fig, axes = plt.subplots(2, 3, figsize=(16, 8))
    axes.flat[-1].axis("off")  # five panels
    table = []
    for i, run in enumerate(runs):
        colour = f"C{i % 10}"
        medians = []
        for ax, (name, title) in zip(axes.flat, PANELS):
            if not run.has(name):
                medians.append(None)
                continue
            v, _, values = run.series(name)
            if name in ZERO_IS_UNREPORTED:
                v, values = v[values > 0], values[values > 0]
            ax.plot(v, values, color=colour, lw=1.2, label=run.label)
            medians.append(float(np.median(values)) if values.size else None)
        last = lambda name: float(run.series(name)[2][-1]) if run.has(name) else None  # noqa: E731
        table.append([run.label] + [fmt(m, 2) for m in medians]
                     + [fmt(last(M.ENV_STEPS)), fmt(last(M.WALL_SECONDS), 1)])
    for ax, (name, title) in zip(axes.flat, PANELS):
        ax.set(xlabel=VERSION_LABEL, ylabel=name, title=title)
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=7, loc="best")
    out.figure("throughput.png", fig)
    out.table("throughput.md", "throughput per role (median over versions)",
              markdown_table(["run", "env steps/s", "learner samples/s", "inference batch", "inference passes", "inference ms",
                              "env steps", "wall seconds"], table))


def main(argv: list[str] | None = None) -> int:
    return run_script(parser(), body, argv)


if __name__ == "__main__":
    sys.exit(main())
