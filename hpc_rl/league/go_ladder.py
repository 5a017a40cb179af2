"""Go evaluation as ELF OpenGo's: a ladder of fixed opponents played out, then Elo and Nash averaging over it.

    players = ["random", "rollout:sec=0.1", "mctsbot:sec=0.1"]
    results = play_ladder(players, "out/results.json", board_size=9, komi=7.5, games_per_pair=20, seed=0)
    ratings = rate_tournament(tournament_of(results, players, 20), anchor="random")   # hpc_rl.league.tournament
    evaluation = commit_evaluation("out", results, players, 20, strength=("rollout:sec=0.1", "mctsbot:sec=0.1"))

Every pair of players (``hpc_rl.league.go_players`` specs) plays ``games_per_pair`` games; in game ``g`` of a pair the
first of the two names in sorted order plays black when ``g`` is even. The game's seeds come from ``pair_seed`` (the
players and the ladder's seed only), so a pair's games are the same in every ladder it is part of. Each game is saved
to the results file as it ends (replaced crash-safely), and a ladder run again with the same file plays only the
games it lacks: a new player (a new version) plays its pairs, nothing else is replayed.

Ratings reuse ``hpc_rl.league.tournament``: TrueSkill, maximum-likelihood Elo (random = 0) and Nash averaging over
the whole tournament. Beside them, ELF OpenGo's "self-play Elo": the players in the order given (as successive
versions), each rated from its games against the one before only, the differences summed. It inflates (ELF
OpenGo, section 4): a player gains for beating its predecessor whatever it does against earlier ones, and the logit
of a near-sweep is large, so a chain of many close steps adds up to far more than the spread the tournament shows.

``commit_evaluation`` writes ``evaluation.json`` (the ratings and, with ``strength``, one player's record against
one opponent: wins, win rate with draws counted as losses, and its 95% Wilson interval), ``ratings.md`` and
``ratings.png``: the latest committed evaluation, which ``python -m hpc_rl.bench go`` reads.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from hpc_rl.envs.go import GoGames, warm_up
from hpc_rl.league.go_players import GoPlayer, make_player, parse_spec
from hpc_rl.league.ratings import elo_from_results
from hpc_rl.league.tournament import Ratings, Tournament, pair_seed, rate_tournament
from hpc_rl.stats import wilson_interval
from hpc_rl.storage.hdf5 import write_json_durably

FORMAT = "hpc_rl go ladder results 1"
EVALUATION_FILE = "evaluation.json"  # the committed evaluation in a ladder's directory
RESULTS_FILE = "results.json"
SETTINGS = ("board_size", "komi", "seed")  # a results file holds games of these settings only


def pair_key(a: str, b: str) -> str:
    return " vs ".join(sorted((a, b)))


def play_game(black: GoPlayer, white: GoPlayer, board_size: int, komi: float) -> dict:
    """One game from the empty board: moves, black's return, and per player its moves, seconds and simulations."""
    games, moves = GoGames(1, board_size, komi), []
    players = (black, white)
    seconds, counts = [0.0, 0.0], [0, 0]
    sims_before = [p.simulations for p in players]
    while not games.terminal[0]:
        p = int(games.to_play[0])
        start = time.perf_counter()
        action = players[p].choose(games, 0, moves)
        seconds[p] += time.perf_counter() - start
        if not (0 <= action < games.num_actions and games.legal_mask()[0, action]):
            raise ValueError(f"{players[p].name} chose the illegal action {action} at move {len(moves)}")
        games.step([action])
        moves.append(action)
        counts[p] += 1
    return {"moves": moves, "black_return": float(games.returns()[0, 0]), "moves_by": counts, "seconds": seconds,
            "simulations": [p.simulations - s for p, s in zip(players, sims_before)], "superko": bool(games.superko[0])}


def load_results(path: Path, settings: dict) -> dict:
    """The results file at ``path`` (a new one when absent); ValueError naming the file when it is not a results
    file or was played with other settings."""
    if not path.exists():
        return {"format": FORMAT, **settings, "pairs": {}}
    try:
        results = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: not a readable results file ({err})") from err
    if not isinstance(results, dict) or results.get("format") != FORMAT or not isinstance(results.get("pairs"), dict):
        raise ValueError(f"{path}: not a Go ladder results file (format {FORMAT!r})")
    for key in SETTINGS:
        if results.get(key) != settings[key]:
            raise ValueError(f"{path} holds games with {key}={results.get(key)!r}, this ladder has {key}="
                             f"{settings[key]!r}: give another results file, or the same {key}")
    return results


def play_ladder(players: Sequence[str], path: str | Path, board_size: int, komi: float, games_per_pair: int,
                seed: int, progress: Callable[[str], None] = print) -> dict:
    """Play the games of every pair of ``players`` (specs) that ``path`` lacks, saving after each; the results."""
    if len(set(players)) != len(players) or len(players) < 2:
        raise ValueError(f"a ladder needs at least 2 distinct players, got {list(players)}")
    for spec in players:
        parse_spec(spec)  # a malformed spec fails before any game
    path = Path(path)
    settings = {"board_size": board_size, "komi": float(komi), "seed": seed}
    results = load_results(path, settings)
    pairs = [tuple(sorted(p)) for p in itertools.combinations(players, 2)]
    todo = [(a, b, g) for g in range(games_per_pair) for a, b in pairs
            if g >= len(results["pairs"].get(pair_key(a, b), []))]
    # A player is made (its checkpoint read) before any game only if it has games to play: a network whose games
    # are all in the results keeps its ratings after its checkpoint is pruned (keep_every).
    for spec in dict.fromkeys(p for a, b, _ in todo for p in (a, b)):
        make_player(spec, board_size, komi, 0)
    progress(f"{len(pairs)} pairs x {games_per_pair} games: {len(pairs) * games_per_pair - len(todo)} in {path}, "
             f"{len(todo)} to play")
    warm_up()  # numba's kernels loaded before the first timed move
    started = time.monotonic()
    for k, (a, b, g) in enumerate(todo):
        game_seed = pair_seed(seed, a, b) + 2 * g
        black, white = (a, b) if g % 2 == 0 else (b, a)
        record = play_game(make_player(black, board_size, komi, game_seed),
                           make_player(white, board_size, komi, game_seed + 1), board_size, komi)
        record.update(index=g, black=black, white=white, seed=game_seed)
        results["pairs"].setdefault(pair_key(a, b), []).append(record)
        write_json_durably(path, results)
        winner = black if record["black_return"] > 0 else white if record["black_return"] < 0 else "draw"
        progress(f"[{k + 1}/{len(todo)}] {black} (black) vs {white}: {winner}, {len(record['moves'])} moves "
                 f"({time.monotonic() - started:.0f} s in all)")
    return results


def _games_of(results: dict, a: str, b: str, games_per_pair: int) -> list[dict]:
    games = results["pairs"].get(pair_key(a, b), [])[:games_per_pair]
    if len(games) < games_per_pair:
        raise ValueError(f"{a} vs {b}: {len(games)} of {games_per_pair} games played")
    return games


def score_of(game: dict, player: str) -> float:
    """``player``'s points in a game: 1 a win, 0.5 a draw, 0 a loss."""
    black_points = (game["black_return"] + 1.0) / 2.0
    return black_points if game["black"] == player else 1.0 - black_points


def tournament_of(results: dict, players: Sequence[str], games_per_pair: int) -> Tournament:
    """The first ``games_per_pair`` games of every pair of ``players`` as a ``Tournament`` (for ``rate_tournament``);
    its log takes game g of every pair before game g + 1 of any, as ``play_tournament``'s does."""
    names = list(players)
    n = len(names)
    total, points = np.zeros((n, n)), np.zeros((n, n))
    log = []
    pairs = list(itertools.combinations(range(n), 2))
    per_pair = {(i, j): _games_of(results, names[i], names[j], games_per_pair) for i, j in pairs}
    for g in range(games_per_pair):
        for i, j in pairs:
            score = score_of(per_pair[i, j][g], names[i])
            log.append((names[i], names[j], score))
            points[i, j] += score
            points[j, i] += 1.0 - score
            total[i, j] += 1
            total[j, i] += 1
    return Tournament(names, total, points, log)


def selfplay_elo(tournament: Tournament) -> np.ndarray:
    """ELF OpenGo's self-play Elo over the players in ``tournament.names`` order: each one's Elo difference to the
    one before, from their games alone (``elo_from_results`` on the pair), summed from the first (0)."""
    steps = [0.0]
    for i in range(1, len(tournament.names)):
        pair = np.ix_([i - 1, i], [i - 1, i])
        steps.append(float(elo_from_results(tournament.scores[pair], tournament.games[pair])[1]))
    return np.cumsum(steps)


def per_move(results: dict, players: Sequence[str], games_per_pair: int) -> dict[str, tuple[float, float]]:
    """Per player: mean wall-clock seconds and simulations per move over its ladder games."""
    spent = {p: np.zeros(3) for p in players}  # seconds, simulations, moves
    for a, b in itertools.combinations(players, 2):
        for game in _games_of(results, a, b, games_per_pair):
            for side, name in enumerate((game["black"], game["white"])):
                spent[name] += (game["seconds"][side], game["simulations"][side], game["moves_by"][side])
    return {p: (s[0] / max(s[2], 1), s[1] / max(s[2], 1)) for p, s in spent.items()}


def strength_of(tournament: Tournament, agent: str, opponent: str) -> dict:
    """``agent``'s record against ``opponent``: games, wins (draws count as losses), win rate, 95% Wilson interval."""
    i, j = tournament.names.index(agent), tournament.names.index(opponent)
    wins = sum(1 for a, b, s in tournament.log if (a, b, s) in ((agent, opponent, 1.0), (opponent, agent, 0.0)))
    games = int(tournament.games[i, j])
    return {"agent": agent, "opponent": opponent, "games": games, "wins": wins, "win_rate": wins / games,
            "ci95": list(wilson_interval(wins, games))}


def markdown(ratings: Ratings, chain: np.ndarray, moves: dict[str, tuple[float, float]]) -> str:
    """The ratings table (best Elo first) and the score table (row's points per game against column)."""
    from hpc_rl.study import markdown_table

    t = ratings.tournament
    order = np.argsort(-ratings.elo, kind="stable")
    rows = [(f"`{t.names[i]}`", f"{ratings.elo[i]:.0f}", f"{chain[i]:.0f}", f"{ratings.nash[i]:.2f}",
             f"{ratings.nash_weight[i]:.2f}", f"{ratings.trueskill[i]:.1f} ± {ratings.trueskill_sigma[i]:.1f}",
             int(ratings.games[i]), f"{moves[t.names[i]][0]:.3f}", f"{moves[t.names[i]][1]:.0f}")
            for i in order]
    table = markdown_table(("player", "Elo", "self-play Elo", "Nash", "Nash weight", "TrueSkill", "games",
                            "s / move", "sims / move"), rows)
    scores = [(f"`{t.names[i]}`", *("-" if i == j else f"{t.scores[i, j] / t.games[i, j]:.2f}" for j in order))
              for i in order]
    return (table + "\n" + markdown_table(("points per game", *(f"`{t.names[j]}`" for j in order)), scores))


def plot(ratings: Ratings, chain: np.ndarray, anchor: str, path: Path) -> None:
    """Elo, self-play Elo and the Nash average per player, best Elo first."""
    from hpc_rl.study import pyplot

    plt = pyplot()
    t = ratings.tournament
    order = np.argsort(-ratings.elo, kind="stable")[::-1]
    names = [t.names[i] for i in order]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 0.5 * len(names) + 1.5), sharey=True)
    y = np.arange(len(names))
    left.barh(y - 0.2, ratings.elo[order], height=0.4, label="Elo (whole tournament)")
    left.barh(y + 0.2, chain[order], height=0.4, label="self-play Elo (each vs the one before)")
    left.set_yticks(y, names)
    left.set_xlabel(f"Elo ({anchor} = 0; self-play Elo: {t.names[0]} = 0)")
    left.legend(fontsize=8)
    right.barh(y, ratings.nash[order], height=0.5, color="tab:green")
    right.set_xlabel("Nash average (log-odds against the Nash mixture)")
    fig.suptitle(f"Go ladder: {int(t.games[0, 1])} games per pair")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def commit_evaluation(out_dir: str | Path, results: dict, players: Sequence[str], games_per_pair: int,
                      strength: tuple[str, str] | None = None) -> dict:
    """Rate the ladder and write ``evaluation.json`` (crash-safely, last), ``ratings.md`` and ``ratings.png``."""
    out_dir = Path(out_dir)
    tournament = tournament_of(results, players, games_per_pair)
    anchor = "random" if "random" in players else players[0]
    ratings = rate_tournament(tournament, anchor=anchor)
    chain = selfplay_elo(tournament)
    moves = per_move(results, players, games_per_pair)
    (out_dir / "ratings.md").write_text(markdown(ratings, chain, moves))
    plot(ratings, chain, anchor, out_dir / "ratings.png")
    evaluation = {
        "board_size": results["board_size"], "komi": results["komi"], "seed": results["seed"],
        "games_per_pair": games_per_pair, "anchor": anchor, "results": RESULTS_FILE, "written": time.time(),
        "players": {name: {"elo": float(ratings.elo[i]), "selfplay_elo": float(chain[i]),
                           "nash": float(ratings.nash[i]), "nash_weight": float(ratings.nash_weight[i]),
                           "trueskill": float(ratings.trueskill[i]),
                           "trueskill_sigma": float(ratings.trueskill_sigma[i]), "games": int(ratings.games[i]),
                           "seconds_per_move": moves[name][0], "simulations_per_move": moves[name][1]}
                    for i, name in enumerate(players)},
        "points": {a: {b: float(tournament.scores[i, j]) for j, b in enumerate(players) if i != j}
                   for i, a in enumerate(players)},
        "strength": strength_of(tournament, *strength) if strength else None,
    }
    write_json_durably(out_dir / EVALUATION_FILE, evaluation)
    return evaluation


def latest_strength(out_dir: str | Path) -> tuple[dict | None, str]:
    """The ``strength`` of the committed evaluation in ``out_dir`` and where it came from, or None and why there is
    none (no evaluation committed, or one that rated no agent). ValueError naming the file when it is unreadable."""
    path = Path(out_dir) / EVALUATION_FILE
    if not path.is_file():
        return None, f"no committed evaluation: {path} does not exist (jobs/go_ladder.py writes it)"
    try:
        evaluation = json.loads(path.read_text())
        strength = evaluation["strength"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a committed Go evaluation ({err!r})") from err
    if strength is None:
        return None, f"{path} rates no agent against an opponent (jobs/go_ladder.py --strength AGENT OPPONENT)"
    return strength, str(path)
