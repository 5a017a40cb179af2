"""The library of the offline scripts in ``analysis/``: reading run and sweep directories, OpenAI Five's speed-up
(eq. 2), data-quality figures, and the tables and plots the scripts write (no MPI, no torch).

    runs = load_runs(["runs/ablation_staleness", "runs/my_run"])   # a sweep expands to its members
    name = default_metric(runs)                                      # TrueSkill, else win rate vs scripted, else return
    v = first_crossing(versions, values, threshold)                  # OpenAI Five eq. 2, numerator and denominator
    speedup(v_baseline, v_member)

The pure functions (``first_crossing``, ``speedup``, ``staleness_histogram``, ``measured_staleness``,
``measured_reuse``, ``speedup_rows``, ``direction_test``, ``selfplay_windows``) take arrays and numbers, so the tests can check them
against hand-computed cases; loading and table formatting are kept apart from them. The small statistics the
scripts share with training (``wilson_interval``, ``trailing_mean``, ``spread``, ``permutation_p``) are in
``hpc_rl.stats``.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hpc_rl import metric_names as M
from hpc_rl.stats import Spread, permutation_p, spread, wilson_interval
from hpc_rl.storage import open_run
from hpc_rl.storage.layout import INDEX_FILE, RunLayout, runs_index
from hpc_rl.storage.run import read_evaluations

TRUESKILL_PREFIX = M.rating(M.TRUESKILL, "")
TRUESKILL_POLICY = M.rating(M.TRUESKILL, M.POLICY)  # the trained policy's rating; other players are reference agents
VERSION_LABEL = "policy version"

# The three sweeps of OpenAI Five's Figure 5: the config key each varies and the baseline it is compared with.
# The paper's baselines: queue length 0 (5b), sample reuse 1 (5c, our smallest: target_reuse >= 1) and a small batch
# (5a: 123k, larger batches show speed-ups above 1 against a linear-speedup line).
ABLATION_KEYS = {
    "pipeline.segments_per_batch": "batch_size",
    "pipeline.staleness_queue": "staleness",
    "pipeline.target_reuse": "reuse",
}
DEFAULT_BASELINE = {"batch_size": "smallest", "staleness": "smallest", "reuse": "smallest"}
# Keys that differ between members without being what the sweep studies.
NOT_SWEPT = {"seed", "run_name", "runs_dir"}


# --- pure computations ----------------------------------------------------------------------------------------
def first_crossing(versions: np.ndarray, values: np.ndarray, threshold: float) -> int | None:
    """The first version whose value is >= ``threshold`` ("versions to first reach T" of OpenAI Five's eq. 2), or
    None if the run never reaches it. NaN values (versions with no games to rate) never count as reaching."""
    versions = np.asarray(versions)
    values = np.asarray(values, dtype=np.float64)
    if versions.shape != values.shape:
        raise ValueError(f"versions and values differ in shape: {versions.shape} vs {values.shape}")
    order = np.argsort(versions, kind="stable")
    reached = np.nonzero(values[order] >= threshold)[0]
    return int(versions[order][reached[0]]) if reached.size else None


def speedup(baseline_versions: float | None, member_versions: float | None) -> float | None:
    """OpenAI Five eq. 2: versions for the baseline to first reach T / versions for the member; None when either
    never reached T. Above 1 the member learned faster (in versions) than the baseline."""
    if baseline_versions is None or member_versions is None:
        return None
    if member_versions <= 0 or baseline_versions <= 0:
        raise ValueError(f"versions to reach a threshold must be > 0, got baseline {baseline_versions}, "
                         f"member {member_versions} (a run already at T at version 0 has no defined speedup)")
    return float(baseline_versions) / float(member_versions)


def staleness_histogram(metrics: dict[str, np.ndarray]) -> np.ndarray:
    """Consumed samples per staleness 0..15 (the last bin: >= 15), summed over every version of the run."""
    names = [M.staleness_bin(b) for b in range(M.STALENESS_BINS)]
    missing = [n for n in names if n not in metrics]
    if missing:
        raise ValueError(f"run has no staleness histogram: series {missing[0]} missing")
    return np.array([float(np.nansum(metrics[n]["value"])) for n in names])


def measured_staleness(metrics: dict[str, np.ndarray]) -> float:
    """Mean staleness over every consumed sample of the run: each version's ``data/staleness_mean`` weighted by the
    samples that version consumed (its histogram row sum), so slow versions with few samples do not dominate.
    Without a histogram, the plain mean over versions."""
    if M.STALENESS_MEAN not in metrics:
        raise ValueError("run has no data/staleness_mean series")
    means = metrics[M.STALENESS_MEAN]
    names = [M.staleness_bin(b) for b in range(M.STALENESS_BINS)]
    if all(n in metrics for n in names):
        weight_by_version: dict[int, float] = {}
        for n in names:
            for v, w in zip(metrics[n]["version"], metrics[n]["value"]):
                weight_by_version[int(v)] = weight_by_version.get(int(v), 0.0) + float(w)
        weights = np.array([weight_by_version.get(int(v), 0.0) for v in means["version"]])
        if weights.sum() > 0:
            return float(np.sum(weights * means["value"]) / weights.sum())
    return float(np.nanmean(means["value"]))


def measured_reuse(metrics: dict[str, np.ndarray]) -> float:
    """Sample reuse of the run (samples consumed / produced, every PPO epoch counted), averaged over versions."""
    if M.REUSE not in metrics:
        raise ValueError("run has no data/reuse series")
    return float(np.nanmean(metrics[M.REUSE]["value"]))


@dataclass(frozen=True)
class SpeedupRow:
    """One swept value at one threshold: versions to reach it per seed, and speed-ups against the baseline."""

    value: float
    threshold: float
    versions: Spread
    speedups: Spread
    baseline_versions: float | None


def speedup_rows(crossings: dict[float, list[int | None]], baseline: float, thresholds: Sequence[float],
                 min_reached: float = 0.5) -> list[SpeedupRow]:
    """Eq. 2 for every swept value and threshold. ``crossings[value][seed]`` is that run's first-crossing version
    per threshold, so ``crossings`` maps value -> list (over seeds) of lists (over thresholds).

    The baseline's versions to reach T is the mean over its seeds that reached T; when fewer than ``min_reached`` of
    them did, its mean is not trusted and the speed-ups at T are undefined (the paper omits such thresholds). Each
    member seed's speed-up divides that mean by its own versions, so the spread shows the seeds' variation.
    """
    if baseline not in crossings:
        raise ValueError(f"baseline value {baseline} is not among the swept values {sorted(crossings)}")
    for value, seeds in crossings.items():
        if any(len(c) != len(thresholds) for c in seeds):
            raise ValueError(f"crossings of value {value} do not have one entry per threshold ({len(thresholds)})")
    rows = []
    for t_index, threshold in enumerate(thresholds):
        base = spread(c[t_index] for c in crossings[baseline])
        base_versions = base.mean if base.n and base.n >= min_reached * base.runs else None
        for value in sorted(crossings):
            versions = spread(c[t_index] for c in crossings[value])
            rows.append(SpeedupRow(value, threshold, versions,
                                   spread(speedup(base_versions, c[t_index]) for c in crossings[value]),
                                   base_versions))
    return rows


# The batch the sublinear test of Figure 5a compares with the baseline: this many times larger.
BATCH_TEST_RATIO = 4.0


@dataclass(frozen=True)
class DirectionTest:
    """The direction a sweep should show, as a one-sided permutation test over seeds of versions to one threshold."""

    what: str
    p: float | None  # None: the sweep has no member to test against the baseline

    def line(self) -> str:
        return f"direction test: {self.what}, p = {'-' if self.p is None else f'{self.p:.3g}'}"


def direction_test(crossings: dict[float, list[int | None]], baseline: float, key: str,
                   threshold: float) -> DirectionTest:
    """OpenAI Five's Figure 5 directions for a sweep of config ``key``, tested on ``crossings[value]`` (each seed's
    versions to reach ``threshold``; None: never reached, which counts as slowest) with
    ``hpc_rl.stats.permutation_p``:

    - ``batch_size``: the batch ``BATCH_TEST_RATIO`` times the baseline's (else the largest above it, ratio r)
      needs fewer versions than the baseline, but more than 1/r as many (a sublinear speed-up). Two one-sided
      tests: the baseline's versions against the member's, and the member's times r against the baseline's; the
      claim holds when both do, so p is the larger of the two (an intersection-union test).
    - anything else (staleness, reuse): the value farthest from the baseline and the baseline, the larger of the
      two learning slower (more versions) than the smaller.
    """
    if baseline not in crossings:
        raise ValueError(f"baseline value {baseline} is not among the swept values {sorted(crossings)}")
    at = f"versions to {threshold:g}"
    ablation = ABLATION_KEYS.get(key)
    name = ablation if ablation in ("staleness", "reuse") else key.split(".")[-1]
    if ablation == "batch_size":
        larger = [v for v in crossings if v > baseline]
        if not larger:
            return DirectionTest(f"no batch larger than the baseline ({name} {fmt(baseline)})", None)
        member = baseline * BATCH_TEST_RATIO if baseline * BATCH_TEST_RATIO in crossings else max(larger)
        ratio = member / baseline
        scaled = [None if c is None else c * ratio for c in crossings[member]]
        p = max(permutation_p(crossings[baseline], crossings[member]), permutation_p(scaled, crossings[baseline]))
        return DirectionTest(f"a {fmt(ratio)}x batch ({name} {fmt(member)}) needs fewer {at} than the baseline "
                             f"({fmt(baseline)}), but more than 1/{fmt(ratio)} as many (sublinear)", p)
    others = [v for v in crossings if v != baseline]
    if not others:
        return DirectionTest(f"no {name} other than the baseline ({fmt(baseline)})", None)
    far = max(others, key=lambda v: abs(v - baseline))
    low, high = sorted((baseline, far))
    return DirectionTest(f"{name} {fmt(high)} is slower than {fmt(low)} ({at}, one-sided)",
                         permutation_p(crossings[high], crossings[low]))


def choose_baseline(values: Sequence[float], rule: str) -> float:
    """The baseline among the swept values: ``smallest``, ``largest`` or a number that must be one of them."""
    values = sorted(set(values))
    if not values:
        raise ValueError("no swept values to choose a baseline from")
    if rule == "smallest":
        return values[0]
    if rule == "largest":
        return values[-1]
    try:
        wanted = float(rule)
    except ValueError:
        raise ValueError(f"--baseline must be 'smallest', 'largest' or a swept value, got {rule!r}") from None
    if wanted not in values:
        raise ValueError(f"--baseline {rule} is not a swept value; the sweep has {values}")
    return wanted


def default_thresholds(curves: Sequence[np.ndarray], fractions: Sequence[float] = (0.25, 0.5, 0.75)) -> list[float]:
    """Thresholds at fractions of the way from the baseline's mean starting value to its mean best value, so every
    threshold is one the baseline reaches on average (the paper's TrueSkill 100..175 suit only its scale)."""
    curves = [np.asarray(c, dtype=np.float64) for c in curves if np.isfinite(c).any()]
    if not curves:
        raise ValueError("the baseline runs have no finite metric values to choose thresholds from")
    start = float(np.mean([c[np.isfinite(c)][0] for c in curves]))
    best = float(np.mean([np.nanmax(c) for c in curves]))
    if best <= start:
        raise ValueError(f"the baseline's metric never rises above its first value ({fmt(start)}): no threshold "
                         "separates the members; pass --thresholds (or another --metric)")
    return [start + f * (best - start) for f in fractions]


# --- loading runs and sweeps ----------------------------------------------------------------------------------
@dataclass
class SelfPlayWindow:
    """A window of a Go run's self-play: its sitting (a job of the run, 1 first), minutes of self-play before its end
    (summed over the sittings), versions, and the games that ended in it with their shares and length; the learner's
    value loss and its buffer's share of black's wins at the window's end (None where not reported)."""

    sitting: int
    minutes: float
    first_version: int
    last_version: int
    games: int
    black_won: float | None
    resigned: float | None
    moves: float | None
    value_loss: float | None
    buffer_black: float | None


def selfplay_windows(metrics: dict[str, np.ndarray], window_s: float = 600.0) -> list[SelfPlayWindow]:
    """Cut a Go run's self-play into windows of ``window_s`` seconds. A job's self-play counters (``selfplay/games``
    and the shares and mean length of those games) count from the job's start, so a count that falls starts a new
    sitting; within a sitting each window's games are the difference of the counts at its ends, and its shares
    those of the differences (share x games is the count of black's wins, resignations, moves)."""
    if not window_s > 0:
        raise ValueError(f"window_s must be > 0, got {window_s}")
    if M.GO_GAMES not in metrics or not metrics[M.GO_GAMES].size:
        raise ValueError(f"no {M.GO_GAMES} series: not a Go run, or no game ended yet")
    games = np.sort(metrics[M.GO_GAMES], order="wall_time")
    starts = [0, *np.flatnonzero(np.diff(games["value"]) < 0) + 1, len(games)]

    def at(name: str, t0: float, t: float) -> float | None:  # the series' last value in [t0, t]
        rows = metrics.get(name)
        if rows is None:
            return None
        rows = rows[(rows["wall_time"] >= t0) & (rows["wall_time"] <= t)]
        return float(rows["value"][np.argmax(rows["wall_time"])]) if rows.size else None

    windows, minutes = [], 0.0
    for sitting, (lo, hi) in enumerate(zip(starts[:-1], starts[1:]), 1):
        rows = games[lo:hi]
        t0 = float(rows["wall_time"][0])
        edges = list(np.arange(t0 + window_s, float(rows["wall_time"][-1]), window_s)) + [float(rows["wall_time"][-1])]
        before = dict(games=0.0, black=0.0, resigned=0.0, moves=0.0, version=int(rows["version"][0]), t=t0)
        for edge in edges:
            end = rows[rows["wall_time"] <= edge][-1]
            count = float(end["value"])
            latest = {k: at(name, t0, edge) for k, name in
                      (("black", M.GO_BLACK_WINS), ("resigned", M.GO_RESIGNED), ("moves", M.GO_GAME_LENGTH))}
            now = dict(games=count, version=int(end["version"]), t=edge,
                       **{k: count * (v or 0.0) for k, v in latest.items()})
            played = now["games"] - before["games"]
            if played > 0 or edge == edges[-1]:
                share = {k: (now[k] - before[k]) / played if played > 0 and v is not None else None
                         for k, v in latest.items()}
                windows.append(SelfPlayWindow(sitting, minutes + (edge - t0) / 60.0, before["version"],
                                              now["version"], round(played), share["black"], share["resigned"],
                                              share["moves"], at(M.VALUE_LOSS, t0, edge),
                                              at(M.BLACK_WIN_SHARE, t0, edge)))
                before = now
        minutes += (edges[-1] - t0) / 60.0
    return windows


@dataclass
class RunData:
    """One run directory read once: its label, config.yaml, metrics.h5, the overrides its sweep gave it and the
    settings its resumes changed (config_changes.jsonl)."""

    label: str
    path: Path
    config: dict[str, Any]
    metrics: dict[str, np.ndarray]
    overrides: str = ""
    sweep: str | None = None
    config_changes: list[dict[str, Any]] = field(default_factory=list)

    def series(self, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(versions, wall seconds since the run's first row, values) of a series, finite values only."""
        rows = self.metrics[name]
        rows = rows[np.argsort(rows["version"], kind="stable")]
        keep = np.isfinite(rows["value"])
        start = float(np.min(rows["wall_time"])) if rows.size else 0.0
        return rows["version"][keep], rows["wall_time"][keep] - start, rows["value"][keep]

    def has(self, name: str) -> bool:
        return name in self.metrics and self.metrics[name].size > 0


def checkpoint_rows(run: RunData, z: float) -> np.ndarray:
    """(version, games, wins, win rate, low, high) for every checkpoint of ``run`` with a MOBA evaluation in its
    evaluations.jsonl, the games of its different (games, seed) evaluations summed. Only the latest record's scripted
    bot (``bot_hash``) counts: results against an earlier bot are left out with a note."""
    records = {}  # one per (version, games, seed, bot): an evaluation recorded twice counts once
    for record in read_evaluations(RunLayout(run.path).evaluations):
        result = record["result"]
        if "wins" in result and result.get("bot_hash"):  # a MOBA evaluation against the scripted bot
            key = (record["version"], record["games"], record["seed"], result["bot_hash"])
            records[key] = (int(result["games"]), int(result["wins"]))
    bots = list(dict.fromkeys(key[3] for key in records))
    if len(bots) > 1:
        print(f"note: {run.label}: {sum(key[3] != bots[-1] for key in records)} evaluations against an earlier "
              f"scripted bot left out")
    pooled: dict[int, np.ndarray] = {}
    for (version, _, _, bot), played in records.items():
        if bot == bots[-1]:
            pooled[version] = pooled.get(version, np.zeros(2)) + played
    out = []
    for version in sorted(pooled):
        n, wins = pooled[version]
        out.append((version, n, wins, wins / n, *wilson_interval(int(wins), int(n), z)))
    return np.array(out, dtype=np.float64).reshape(-1, 6)


def config_value(config: dict[str, Any], key: str) -> Any:
    """``config["pipeline"]["staleness_queue"]`` for key ``pipeline.staleness_queue``; ValueError naming the key."""
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ValueError(f"config has no key {key!r} (missing {part!r})")
        node = node[part]
    return node


def _read_run(path: Path, label: str, overrides: str = "", sweep: str | None = None) -> RunData:
    run = open_run(path)
    return RunData(label, path, run.config, run.metrics, overrides, sweep, run.config_changes)


def is_sweep(path: str | Path) -> bool:
    return runs_index(path).is_file()


def read_index(sweep: str | Path) -> dict[str, str]:
    """``index.tsv`` as {run_name: overrides}, in first-seen order; a name listed again keeps its last overrides."""
    index: dict[str, str] = {}
    for number, line in enumerate(runs_index(sweep).read_text().splitlines(), 1):
        if not line.strip():
            continue
        name, _, overrides = line.partition("\t")
        if not name:
            raise ValueError(f"{runs_index(sweep)}:{number}: empty run name")
        index[name] = overrides.strip()
    return index


def load_sweep(path: str | Path) -> list[RunData]:
    """The members of a sweep directory in index order. Members without metrics (not started yet) are skipped with
    a printed note: a partly finished sweep is still worth plotting."""
    path = Path(path)
    members = []
    for name, overrides in read_index(path).items():
        run_dir = path / name
        if not RunLayout(run_dir).metrics.is_file():
            print(f"note: {run_dir} has no metrics.h5; member skipped")
            continue
        members.append(_read_run(run_dir, f"{path.name}/{name}", overrides, sweep=path.name))
    if not members:
        raise ValueError(f"sweep {path} has no member with a metrics.h5")
    return members


def load_runs(paths: Iterable[str | Path]) -> list[RunData]:
    """Run directories as given and sweep directories expanded to their members."""
    runs: list[RunData] = []
    for p in map(Path, paths):
        if is_sweep(p):
            runs += load_sweep(p)
        elif RunLayout(p).metrics.is_file() or RunLayout(p).config.is_file():
            runs.append(_read_run(p, p.name))
        else:
            raise ValueError(f"{p} is neither a run directory (no metrics.h5) nor a sweep directory (no "
                             f"{INDEX_FILE})")
    return runs


def trueskill_players(runs: Iterable[RunData]) -> list[str]:
    return sorted({n for r in runs for n in r.metrics if n.startswith(TRUESKILL_PREFIX)})


def default_metric(runs: Sequence[RunData]) -> str:
    """The rating to plot: the trained policy's TrueSkill (``eval/trueskill/policy``, or the only TrueSkill series),
    else the win rate against the scripted bot (MOBA), else the episode return (Gymnasium)."""
    players = trueskill_players(runs)
    if TRUESKILL_POLICY in players:
        return TRUESKILL_POLICY
    if len(players) == 1:
        return players[0]
    if players:
        print(f"note: several TrueSkill series {players} and no {TRUESKILL_POLICY}; pass --metric to pick one")
    for name in (M.WIN_RATE_VS_SCRIPTED, M.EPISODE_RETURN):
        if any(r.has(name) for r in runs):
            return name
    raise ValueError(f"no run has {TRUESKILL_PREFIX}*, {M.WIN_RATE_VS_SCRIPTED} or {M.EPISODE_RETURN}; pass --metric")


def check_metric(runs: Sequence[RunData], name: str) -> None:
    if not any(r.has(name) for r in runs):
        available = sorted({n for r in runs for n in r.metrics})
        raise ValueError(f"no run has metric {name!r}; available: {', '.join(available)}")


def swept_key(runs: Sequence[RunData]) -> str:
    """The ablation key whose value differs between the members (seed, run name and runs_dir are not swept)."""
    varying = [k for k in ABLATION_KEYS if len({repr(_maybe(r.config, k)) for r in runs}) > 1]
    if len(varying) != 1:
        others = sorted(_differing_keys([r.config for r in runs]) - NOT_SWEPT)
        raise ValueError(f"cannot tell which parameter the sweep varies: ablation keys differing {varying}, all "
                         f"differing keys {others}; pass --param")
    return varying[0]


def _maybe(config: dict[str, Any], key: str) -> Any:
    try:
        return config_value(config, key)
    except ValueError:
        return None


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(node, dict):
        return {prefix: node}
    out: dict[str, Any] = {}
    for k, v in node.items():
        out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def _differing_keys(configs: Sequence[dict[str, Any]]) -> set[str]:
    flat = [_flatten(c) for c in configs]
    keys = set().union(*flat) if flat else set()
    return {k for k in keys if len({repr(f.get(k)) for f in flat}) > 1}


def global_batch_steps(config: dict[str, Any]) -> int:
    """Env steps in one global learner batch: segments per batch x learners x steps per segment x env copies."""
    return int(config_value(config, "pipeline.segments_per_batch") * config_value(config, "topology.learner")
               * config_value(config, "pipeline.segment_len") * config_value(config, "env.num_envs"))


# --- tables and figures ---------------------------------------------------------------------------------------
def fmt(x: float | None, digits: int = 3) -> str:
    """A number for a table: ``-`` for missing or NaN, integers without decimals."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    if float(x).is_integer() and abs(x) < 1e15:
        return str(int(x))
    return f"{x:.{digits}f}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub Markdown table with columns padded to equal width (readable as plain text too)."""
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    for row in cells:
        if len(row) != len(header):
            raise ValueError(f"table row has {len(row)} cells, header has {len(header)}: {row}")
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    line = lambda row: "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |"  # noqa: E731
    return "\n".join([line(cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
                     + [line(r) for r in cells[1:]]) + "\n"


@dataclass
class Output:
    """Where a script writes: PNGs and Markdown tables in ``--out``, every table echoed to stdout."""

    directory: Path
    written: list[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)

    def table(self, name: str, title: str, text: str) -> Path:
        path = self.directory / name
        path.write_text(f"# {title}\n\n{text}")
        print(f"\n{title}\n{text}")
        self.written.append(path)
        return path

    def figure(self, name: str, fig) -> Path:
        """Save ``fig`` with a layout that keeps titles and labels apart, and whole numbers on version axes."""
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator

        for ax in fig.axes:
            if ax.get_xlabel() == VERSION_LABEL:
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        fig.set_layout_engine("constrained")
        path = self.directory / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        # Plots have few colours: a 64-colour palette looks the same at about a quarter of the bytes, small enough
        # to commit (docs/figures). Pillow comes with matplotlib.
        from PIL import Image

        with Image.open(path) as image:
            small = image.convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT)
        small.save(path, optimize=True)
        self.written.append(path)
        return path

    def report(self) -> None:
        print("\nwrote " + ", ".join(str(p) for p in self.written))


def pyplot():
    """matplotlib's pyplot on the Agg backend (no display on compute nodes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def wall_axis(seconds_max: float) -> tuple[float, str]:
    """Divisor and label for a wall-time axis: seconds, minutes or hours, whichever reads best for the longest run."""
    if seconds_max > 2 * 3600:
        return 3600.0, "wall time (hours)"
    return (60.0, "wall time (minutes)") if seconds_max > 120 else (1.0, "wall time (seconds)")


def script_parser(description: str) -> argparse.ArgumentParser:
    """The arguments every analysis script shares: run or sweep directories, and ``--out``."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", metavar="RUN_OR_SWEEP_DIR",
                        help="run directories (with metrics.h5) or sweep directories (with index.tsv, expanded to "
                             "their members)")
    parser.add_argument("--out", required=True, type=Path, help="directory for the PNG plots and Markdown tables")
    return parser


def run_script(parser: argparse.ArgumentParser, body: Callable[[argparse.Namespace, Output], None],
               argv: Sequence[str] | None = None) -> int:
    """Parse, run, list the files written; bad input (ValueError) becomes a usage error naming it, exit status 2."""
    args = parser.parse_args(argv)
    out = Output(args.out)
    try:
        body(args, out)
    except ValueError as err:
        parser.error(str(err))
    out.report()
    return 0
