"""A Go run's self-play over time, in windows of wall clock: how many games ended, which colour won them, how many
were resigned, how long they were, and where the learner's value loss and its buffer's colour balance stood.

    python analysis/go_selfplay.py runs/go9 --out plots/ [--window-minutes 10]

The collapse of self-play into one colour's quick wins (docs/go.md, "Calibrated resignation and even sampling") and
a value head that fits its games' outcomes (a value loss far below that of judging positions) show here first.
A run resumed over several sittings is cut per sitting: each job counts its games from its own start. Writes
go_selfplay.md (a table per run) and go_selfplay.png (black's share of wins, the resigned share, moves a game and
the value loss against minutes of self-play, summed over the sittings).
"""

from __future__ import annotations

import argparse
import sys

from hpc_rl.study import Output, fmt, load_runs, markdown_table, pyplot, run_script, script_parser, selfplay_windows


def parser() -> argparse.ArgumentParser:
    p = script_parser(__doc__)
    p.add_argument("--window-minutes", type=float, default=10.0, help="the windows' length (default 10)")
    return p


def body(args: argparse.Namespace, out: Output) -> None:
    if not args.window_minutes > 0:
        raise ValueError(f"--window-minutes must be > 0, got {args.window_minutes}")
    runs = load_runs(args.paths)
    plt = pyplot()
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.2))
    tables = []
    for run in runs:
        windows = selfplay_windows(run.metrics, args.window_minutes * 60.0)
        minutes = [w.minutes for w in windows]
        for ax, values in zip(axes, ([w.black_won for w in windows], [w.resigned for w in windows],
                                     [w.moves for w in windows], [w.value_loss for w in windows])):
            ax.plot(minutes, [float("nan") if v is None else v for v in values], marker="o", ms=3, label=run.label)
        rows = [[w.sitting, fmt(w.minutes, 1), f"{w.first_version:,}-{w.last_version:,}", w.games, fmt(w.black_won, 2),
                 fmt(w.resigned, 2), fmt(w.moves), fmt(w.value_loss), fmt(w.buffer_black, 2)] for w in windows]
        tables.append(f"## {run.label}\n\n" + markdown_table(
            ["sitting", "minutes", "versions", "games", "black won", "resigned", "moves a game",
             "value loss at the end", "buffer: black's wins"], rows))
    for ax, title in zip(axes, ("black's share of wins", "resigned share", "moves a game", "value loss")):
        ax.set(xlabel="minutes of self-play", title=title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="best")
    out.figure("go_selfplay.png", fig)
    out.table("go_selfplay.md", f"self-play in windows of {args.window_minutes:g} minutes", "\n".join(tables))


def main(argv: list[str] | None = None) -> int:
    return run_script(parser(), body, argv)


if __name__ == "__main__":
    sys.exit(main())
