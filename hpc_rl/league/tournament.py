"""Rating frozen versions of a run: tournaments between versions and reference agents, and the ratings they give.

    players = {"random": "random", "scripted": "scripted", "v10": policy_10, "v20": policy_20}
    tournament = play_tournament(players, config, games=16, seed=0)      # every pair plays, sides alternating
    ratings = rate_tournament(tournament)                                # TrueSkill, Elo and Nash averaging
    write_ratings(run_dir, {10: "v10", 20: "v20"}, ratings)              # eval/* series of metrics.h5

    book = RatingBook.load(run_dir, resume_version, recover=True)   # the controller's running TrueSkill table
    metrics = book.add(version, matches)              # one version's games against the references -> eval/* values

TrueSkill is OpenAI Five's measure: random is anchored at 0 and a figure is the mean rating minus random's. Elo is
the maximum-likelihood Bradley-Terry fit of the whole tournament (random at 0), Nash averaging (Balduzzi et al.,
2018, as ELF OpenGo summarises tournaments) the payoff in log-odds against the tournament's maximum-entropy Nash
mixture: 0 means "as good as the Nash mixture", negative means exploitable by it.

Every figure is written with the number of games behind it. Two rules keep ``metrics.h5`` consistent: the offline
tournament (``jobs/tournament.py``) never writes into a run that is still being written (``run_in_progress``), and it
replaces the series it wrote before rather than appending to them.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import trueskill

from hpc_rl import metric_names as M
from hpc_rl.league.ratings import TrueSkillTable, elo_from_results, nash_average
from hpc_rl.storage.hdf5 import DamagedFileError, blake2b_hex, set_aside, write_json_durably
from hpc_rl.storage.metrics import ROW, open_for_write_problem, read_metrics, read_table, write_table
from hpc_rl.storage.layout import RunLayout

log = logging.getLogger(__name__)

REFERENCES = ("random", "scripted")  # the fixed reference agents; random is the anchor (rating 0)
ANCHOR = "random"
OFFLINE_SOURCE = "jobs/tournament.py"  # the source of the series the offline tournament wrote (it may replace them)
OFFLINE_ATTRS = "tournament"  # metrics.h5 attribute: the settings of the last tournament written (JSON)
# Series families written by both the evaluator ranks (via the controller) and the offline tournament.
FAMILIES = (M.TRUESKILL, M.TRUESKILL_SIGMA, M.GAMES, M.WIN_RATE, M.DRAW_RATE, M.GAMES_VS)
OFFLINE_FAMILIES = FAMILIES + ("elo", "nash", "nash_weight")


def version_name(version: int) -> str:
    return f"v{version}"


def pair_seed(seed: int, first: str, second: str) -> int:
    """The seed of the games between two players: a function of the players and ``seed`` only, so a version's games
    are the same whenever, and in whichever tournament, they are played."""
    digest = hashlib.sha256(f"{seed}/{first}/{second}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 2


# --- offline tournaments -----------------------------------------------------------------------------------------
@dataclass
class Tournament:
    """Every pair of ``names`` played ``games[i, j]`` games; ``scores[i, j]`` are i's points against j (a draw is
    half a point); ``log`` lists every game as (first, second, first's score) in the order ratings take them."""

    names: list[str]
    games: np.ndarray
    scores: np.ndarray
    log: list[tuple[str, str, float]]


def play_tournament(players: dict, config, games: int, seed: int, deterministic: bool = False,
                    progress: Callable[[str], None] = print) -> Tournament:
    """Round robin: every pair of ``players`` ({name: Policy or reference bot name}) plays ``games`` mirrored
    games with sides alternating (``hpc_rl.evaluation.play_match``), seeded by ``pair_seed``."""
    from hpc_rl.evaluation import play_match

    names = list(players)
    if len(names) < 2:
        raise ValueError(f"a tournament needs at least 2 players, got {names}")
    n = len(names)
    pairs = list(itertools.combinations(range(n), 2))
    total = np.zeros((n, n))
    points = np.zeros((n, n))
    per_pair: list[list[float]] = []
    started = time.monotonic()
    for k, (i, j) in enumerate(pairs):
        t0 = time.monotonic()
        result = play_match(players[names[i]], players[names[j]], config, games, pair_seed(seed, names[i], names[j]),
                            deterministic)
        total[i, j] = total[j, i] = games
        points[i, j] = sum(result["scores"])
        points[j, i] = games - points[i, j]
        per_pair.append(result["scores"])
        progress(f"[{k + 1}/{len(pairs)}] {names[i]} vs {names[j]}: {result['wins']} won, {result['draws']} drawn, "
                 f"{result['losses']} lost ({time.monotonic() - t0:.1f} s, {time.monotonic() - started:.0f} s in all)")
    # Game g of every pair before game g + 1 of any: TrueSkill's sequential updates see the pairs interleaved, not
    # one pair's games in a block.
    log = [(names[i], names[j], per_pair[p][g]) for g in range(games) for p, (i, j) in enumerate(pairs)]
    return Tournament(names, total, points, log)


@dataclass
class Ratings:
    """Per player (in ``names`` order): TrueSkill mu relative to the anchor and sigma, Elo (anchor 0), the Nash
    average and the player's mass in the Nash equilibrium, the games it played, and ``tournament``."""

    names: list[str]
    trueskill: np.ndarray
    trueskill_sigma: np.ndarray
    elo: np.ndarray
    nash: np.ndarray
    nash_weight: np.ndarray
    games: np.ndarray
    tournament: Tournament

    def index(self, name: str) -> int:
        return self.names.index(name)


def rate_tournament(tournament: Tournament, anchor: str = ANCHOR) -> Ratings:
    """TrueSkill over the games in ``tournament.log`` order, Elo and Nash averaging over its totals."""
    names = tournament.names
    if anchor not in names:
        raise ValueError(f"the anchor {anchor!r} did not play in the tournament ({names})")
    if np.any(tournament.games[~np.eye(len(names), dtype=bool)] == 0):
        raise ValueError("Nash averaging needs every pair to have played")
    table = TrueSkillTable(anchor=anchor)
    for first, second, score in tournament.log:
        table.record(first, second, score)
    # Nash averaging works on log-odds, where a clean sweep of a few games is infinite (clipped to +-13.8) and would
    # dominate the equilibrium: one drawn game added to every pair keeps small-sample log-odds finite and modest.
    off = ~np.eye(len(names), dtype=bool)
    win_rates = np.where(off, (tournament.scores + 0.5) / (tournament.games + 1.0), 0.5)
    nash, weight = nash_average(win_rates)
    return Ratings(names=list(names),
                   trueskill=np.array([table.mu(n) for n in names]),
                   trueskill_sigma=np.array([table.ratings[n].sigma for n in names]),
                   elo=elo_from_results(tournament.scores, tournament.games, anchor=names.index(anchor)),
                   nash=nash, nash_weight=weight, games=tournament.games.sum(axis=1), tournament=tournament)


def format_table(ratings: Ratings) -> str:
    """The ratings as a text table, best TrueSkill first, with each player's score against the references."""
    t = ratings.tournament
    refs = [r for r in REFERENCES if r in t.names]
    header = (f"{'player':>10} {'TrueSkill':>9} {'± sigma':>7} {'Elo':>7} {'Nash':>7} {'Nash wt':>7} {'games':>6}"
              + "".join(f" {'vs ' + r:>12}" for r in refs))
    lines = [header, "-" * len(header)]
    for i in np.argsort(-ratings.trueskill, kind="stable"):
        row = (f"{t.names[i]:>10} {ratings.trueskill[i]:9.2f} {ratings.trueskill_sigma[i]:7.2f} {ratings.elo[i]:7.0f} "
               f"{ratings.nash[i]:7.2f} {ratings.nash_weight[i]:7.3f} {int(ratings.games[i]):6d}")
        for r in refs:
            j = t.names.index(r)
            row += f" {t.scores[i, j] / t.games[i, j]:12.2f}" if i != j else f" {'-':>12}"
        lines.append(row)
    lines.append("TrueSkill: mean rating minus random's; Elo: random = 0; Nash: log-odds against the Nash mixture; "
                 "vs <ref>: points per game (a draw is half a point)")
    return "\n".join(lines)


# --- metrics.h5 -----------------------------------------------------------------------------------------------
def run_in_progress(run_dir: str | Path) -> str | None:
    """Why ``run_dir`` may still be written by its controller, or None when no job writes it.

    A pipeline run's controller writes ``meta.json`` when it starts and ``status.json`` when it ends; a run whose
    ``status.json`` is missing or older than its ``meta.json`` is running, or ended without finishing (a crash).
    ``metrics_writable`` adds HDF5's own guard (the file's open-for-write flag).
    """
    layout = RunLayout(run_dir)
    meta_path, status_path = layout.meta, layout.status
    if not meta_path.is_file() or "roles" not in json.loads(meta_path.read_text()):
        return None  # not written by a controller
    if not status_path.is_file():
        return (f"{run_dir} has no {status_path.name}: its controller is still running (or ended without "
                "finishing)")
    if status_path.stat().st_mtime < meta_path.stat().st_mtime:
        return (f"{status_path} is older than its {meta_path.name}: the run was resumed and its controller is "
                "still running (or ended without finishing)")
    return None


def metrics_writable(run_dir: str | Path) -> str | None:
    """Why ``metrics.h5`` cannot be opened for writing now (a writer holds it in SWMR mode, or crashed holding it),
    or None."""
    path = RunLayout(run_dir).metrics
    problem = open_for_write_problem(path) if path.is_file() else None
    if problem is None:
        return None
    return (f"{path} is open for writing elsewhere or was left open by a crashed job ({problem}); resuming the run "
            "(the same training command) recovers it")


def _version_rows(run_dir: Path) -> dict[int, tuple[int, float]]:
    """(env steps, wall time) of every version the training logged, so ratings line up with training in plots."""
    rows: dict[int, tuple[int, float]] = {}
    for name, series in read_metrics(RunLayout(run_dir).metrics).items():
        if not name.startswith("eval/"):
            for version, step, wall in zip(series["version"], series["step"], series["wall_time"]):
                rows.setdefault(int(version), (int(step), float(wall)))
    return rows


def offline_series(ratings: Ratings, versions: dict[int, str]) -> dict[str, list[tuple[int, float]]]:
    """The ``eval/*`` rows of a rated tournament: ``{name: [(version, value), ...]}``.

    The versions' figures go to ``eval/<family>/policy`` at their version; the references' figures (one number per
    tournament) are repeated at every rated version so every series shares the same versions.
    """
    t = ratings.tournament
    out: dict[str, list[tuple[int, float]]] = {}

    def add(name: str, version: int, value: float) -> None:
        out.setdefault(f"eval/{name}", []).append((version, float(value)))

    refs = [r for r in REFERENCES if r in t.names]
    for version, name in sorted(versions.items()):
        i = ratings.index(name)
        for player, k in [(M.POLICY, i)] + [(r, ratings.index(r)) for r in refs]:
            if player == ANCHOR:  # random's TrueSkill and Elo are 0 by definition
                add(f"games/{player}", version, ratings.games[k])
                add(f"nash/{player}", version, ratings.nash[k])
                add(f"nash_weight/{player}", version, ratings.nash_weight[k])
                continue
            add(f"trueskill/{player}", version, ratings.trueskill[k])
            add(f"trueskill_sigma/{player}", version, ratings.trueskill_sigma[k])
            add(f"elo/{player}", version, ratings.elo[k])
            add(f"nash/{player}", version, ratings.nash[k])
            add(f"nash_weight/{player}", version, ratings.nash_weight[k])
            add(f"games/{player}", version, ratings.games[k])
        for r in refs:
            j = ratings.index(r)
            wins = t.scores[i, j] - 0.5 * _draws(t, name, r)
            add(f"win_rate/{r}", version, wins / t.games[i, j])
            add(f"draw_rate/{r}", version, _draws(t, name, r) / t.games[i, j])
            add(f"games_vs/{r}", version, t.games[i, j])
    return out


def _draws(t: Tournament, a: str, b: str) -> int:
    return sum(1 for x, y, s in t.log if {x, y} == {a, b} and s == 0.5)


def _offline_family(name: str) -> bool:
    return any(name.startswith(f"eval/{family}/") for family in OFFLINE_FAMILIES)


def foreign_series(run_dir: str | Path) -> list[str]:
    """``eval/*`` series of the families the offline tournament writes that it did not write itself (the ratings
    of evaluator ranks during training): replacing them would lose them."""
    table = read_table(RunLayout(run_dir).metrics)
    return sorted(n for n in table.series if _offline_family(n) and table.sources.get(n) != OFFLINE_SOURCE)


def write_ratings(run_dir: str | Path, versions: dict[int, str], ratings: Ratings, attrs: dict | None = None) -> list[str]:
    """Write the tournament's series into ``metrics.h5`` (after dropping every series of the offline families, so a
    rerun replaces them); returns the names written. The caller checks ``run_in_progress`` and ``metrics_writable``
    first: the file is rewritten (a temporary file, then a rename)."""
    run_dir = Path(run_dir)
    series = offline_series(ratings, versions)
    rows_at = _version_rows(run_dir)
    now = time.time()
    table = read_table(RunLayout(run_dir).metrics)
    for name in [n for n in table.series if _offline_family(n)]:
        del table.series[name]
        table.sources.pop(name, None)
    for name, rows in series.items():
        # A version the training never logged (a copied checkpoint) gets step 0 and the time of writing.
        table.series[name] = np.array([(v, *rows_at.get(v, (0, now)), value) for v, value in rows], dtype=ROW)
        table.sources[name] = OFFLINE_SOURCE
    table.attrs[OFFLINE_ATTRS] = json.dumps(attrs or {}, sort_keys=True, default=str)
    write_table(RunLayout(run_dir).metrics, table)
    return sorted(series)


# --- the running table of evaluator ranks -----------------------------------------------------------------------
class RatingBook:
    """The controller's TrueSkill table for evaluator ranks: references plus one player per rated version.

    Each rated version is a new player with TrueSkill's default prior that plays ``games`` games against every
    reference; the references' ratings carry on from version to version. ``ratings.json`` stores one record per
    rated version (the references' ratings after it and the version's own), so a run resumed from version R
    continues from the table as it stood after the last version <= R was rated.
    """

    def __init__(self, path: Path, records: list[dict] | None = None):
        self.path = Path(path)
        self.records = list(records or [])
        self.table = TrueSkillTable(anchor=ANCHOR)
        for record in self.records:
            for name, (mu, sigma, games) in record["ratings"].items():
                self.table.ratings[name] = trueskill.Rating(mu, sigma)
                self.table.games[name] = games

    @classmethod
    def load(cls, run_dir: str | Path, resume_version: int, recover: bool = False) -> "RatingBook":
        """The table as it stood after the last version <= ``resume_version`` was rated. A damaged ``ratings.json``
        is a table with no version rated (the evaluator ranks rate the newest version next); ``recover`` (the
        controller, which owns the file) also sets it aside, for a person to look at, before the table is rebuilt."""
        path = RunLayout(run_dir).ratings
        try:
            records = read_ratings(path) if resume_version >= 0 else []
        except DamagedFileError as err:
            records = []
            if recover:
                aside = set_aside(path)
                line = f"ratings.json is damaged: set aside as {aside.name}, rating anew from the next version ({err})"
                print(line, flush=True)
                log.error(line)
            else:
                log.warning("%s: read as a table with no version rated", err)
        return cls(path, [r for r in records if r["version"] <= resume_version])

    @property
    def last_version(self) -> int:
        return self.records[-1]["version"] if self.records else -1

    def add(self, version: int, matches: dict[str, dict]) -> dict[str, float]:
        """Record ``version``'s games (``{reference: play_match result}``) and return its ``eval/*`` figures."""
        if version <= self.last_version:
            raise ValueError(f"version {version} is not newer than the last rated version {self.last_version}")
        name = version_name(version)
        # Game g against every reference before game g + 1 against any (as in the offline tournament).
        longest = max(len(m["scores"]) for m in matches.values())
        for g in range(longest):
            for ref, match in matches.items():
                if g < len(match["scores"]):
                    self.table.record(name, ref, match["scores"][g])
        players = [r for r in REFERENCES if r in self.table.ratings] + [name]
        self.records.append({"version": version, "ratings": {
            p: [self.table.ratings[p].mu, self.table.ratings[p].sigma, self.table.games[p]] for p in players}})
        figures = {M.rating(M.TRUESKILL, M.POLICY): self.table.mu(name),
                   M.rating(M.TRUESKILL_SIGMA, M.POLICY): self.table.ratings[name].sigma,
                   M.rating(M.GAMES, M.POLICY): float(self.table.games[name])}
        for ref in players[:-1]:
            if ref != ANCHOR:
                figures[M.rating(M.TRUESKILL, ref)] = self.table.mu(ref)
                figures[M.rating(M.TRUESKILL_SIGMA, ref)] = self.table.ratings[ref].sigma
            figures[M.rating(M.GAMES, ref)] = float(self.table.games[ref])
        for ref, match in matches.items():
            figures[M.rating(M.WIN_RATE, ref)] = match["wins"] / match["games"]
            figures[M.rating(M.DRAW_RATE, ref)] = match["draws"] / match["games"]
            figures[M.rating(M.GAMES_VS, ref)] = float(match["games"])
        return figures

    def save(self) -> None:
        """Replace ``ratings.json`` crash-safely (temporary file, fsync, ``os.replace``)."""
        content = {"anchor": ANCHOR, "draw_probability": self.table.draw_probability, "records": self.records}
        write_json_durably(self.path, {**content, DIGEST_KEY: _json_digest(content)})


DIGEST_KEY = "blake2b-256"  # of the rest of ratings.json as canonical JSON (sorted keys, no spaces)


def _json_digest(content: dict) -> str:
    return blake2b_hex(json.dumps(content, sort_keys=True, separators=(",", ":")).encode())


def read_ratings(path: Path) -> list[dict]:
    """The records of ``ratings.json`` ([] without the file), each ``{"version", "ratings": {player: [mu, sigma,
    games]}}`` in ascending versions. DamagedFileError naming the file when it is not the table written: not JSON,
    its digest not matching (files written before the digest are checked for their shape only), keys or values
    missing or impossible."""
    if not path.exists():
        return []
    try:
        content = json.loads(path.read_bytes())
    except (OSError, ValueError) as err:  # a directory in its place; not UTF-8, not JSON
        raise DamagedFileError(f"{path}: unreadable ({err})") from err
    if not isinstance(content, dict):
        raise DamagedFileError(f"{path}: not a JSON object")
    stored = content.pop(DIGEST_KEY, None)
    if stored is not None and stored != _json_digest(content):
        raise DamagedFileError(f"{path}: digest mismatch: the content changed since it was written")
    records = content.get("records")
    if not isinstance(records, list) or not all(_is_record(r) for r in records):
        raise DamagedFileError(f"{path}: records missing or not [{{\"version\", \"ratings\"}}, ...]")
    versions = [r["version"] for r in records]
    if versions != sorted(set(versions)):
        raise DamagedFileError(f"{path}: the records' versions do not ascend: {versions}")
    return records


def _is_record(record) -> bool:
    """``{"version": int >= 0, "ratings": {player: [mu, sigma > 0, games >= 0]}}``, every number finite."""
    def number(x) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

    return (isinstance(record, dict) and type(record.get("version")) is int and record["version"] >= 0
            and isinstance(record.get("ratings"), dict)
            and all(isinstance(rating, list) and len(rating) == 3 and all(map(number, rating)) and rating[1] > 0
                    and rating[2] >= 0 for rating in record["ratings"].values()))


def last_rated_version(run_dir: str | Path, resume_version: int) -> int:
    """The newest version ``ratings.json`` holds at or before ``resume_version`` (-1 if none): where an evaluator
    rank of a resumed run carries on. Read-only (the controller writes the file)."""
    return RatingBook.load(run_dir, resume_version).last_version



def rating_line(version: int, figures: dict[str, float]) -> str:
    """The controller's progress line for one rated version (``RatingBook.add``'s figures)."""
    line = (f"eval v{version:5d}  TrueSkill {figures[M.rating(M.TRUESKILL, M.POLICY)]:6.2f} "
            f"± {figures[M.rating(M.TRUESKILL_SIGMA, M.POLICY)]:.2f} (random 0")
    if M.rating(M.TRUESKILL, "scripted") in figures:
        line += f", scripted {figures[M.rating(M.TRUESKILL, 'scripted')]:.2f}"
    line += ")"
    for ref in REFERENCES:
        if M.rating(M.WIN_RATE, ref) in figures:
            line += (f"  vs {ref}: won {figures[M.rating(M.WIN_RATE, ref)]:.2f}"
                     f" drew {figures[M.rating(M.DRAW_RATE, ref)]:.2f} n={figures[M.rating(M.GAMES_VS, ref)]:.0f}")
    return line
