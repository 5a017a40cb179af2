"""The Go evaluation ladder (hpc_rl/league/go_players.py, go_ladder.py, jobs/go_ladder.py): players of every kind
choose legal moves, OpenSpiel's MCTSBot sees our game's position, a tiny 5x5 ladder resumes without replaying, its
ratings are the ratings code's own on the same games, and the go benchmark reports the committed strength."""

import importlib.util
import json
import re
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest

from hpc_rl.envs.go import GoGames
from hpc_rl.envs.go_search import VISITS
from hpc_rl.league import go_ladder, go_players
from hpc_rl.league.go_players import MCTSBotPlayer, make_player, net_spec, parse_spec
from hpc_rl.league.ratings import elo_from_results, nash_average
from hpc_rl.league.tournament import pair_seed
from hpc_rl.storage.checkpoint import checkpoint_name

ROOT = Path(__file__).resolve().parent.parent
SIZE, KOMI = 5, 7.5
KINDS = ["random", "rollout:sims=8", "rollout:sec=0.002,uct_c=1.5", "mctsbot:sims=8,rollouts=2", "mctsbot:sec=0.002"]


def random_game(seed: int, length: int) -> list[int]:
    rng, games, moves = np.random.default_rng(seed), GoGames(1, SIZE, KOMI), []
    while len(moves) < length and not games.terminal[0]:  # stones while any is legal, then a pass
        stones = np.flatnonzero(games.legal_mask()[0, :-1])
        moves.append(int(rng.choice(stones)) if len(stones) else games.pass_action)
        games.step(moves[-1:])
    return moves


def replay(moves) -> GoGames:
    games = GoGames(1, SIZE, KOMI)
    for a in moves:
        games.step([a])
    return games


@pytest.mark.parametrize("spec", KINDS)
def test_every_kind_of_player_chooses_legal_moves(spec):
    player = make_player(spec, SIZE, KOMI, seed=3)
    assert player.name == spec
    for length in (0, 6, 14):  # positions of one game, in order, as a ladder asks
        moves = random_game(11, length)
        games = replay(moves)
        action = player.choose(games, 0, moves)
        assert games.legal_mask()[0, action], (spec, moves, action)


def test_mctsbot_sees_our_position_move_for_move_and_after_a_jump_to_another_game():
    player = make_player("mctsbot:sims=4", SIZE, KOMI, seed=0)
    assert isinstance(player, MCTSBotPlayer)
    for seed in (1, 2):  # the second game does not extend the first: its state is replayed from the empty board
        moves = random_game(seed, 40)
        for k in range(len(moves) + 1):
            state, ours = player.state_after(moves[:k]), replay(moves[:k])
            planes = np.array(state.observation_tensor()).reshape(4, SIZE, SIZE)  # black, white, empty, to play
            board = ours.boards()[0]
            assert np.array_equal(planes[0] == 1, board == 1) and np.array_equal(planes[1] == 1, board == 2), k
            assert state.is_terminal() == ours.terminal[0]
            if not state.is_terminal():
                assert state.current_player() == ours.to_play[0]
                assert sorted(state.legal_actions()) == list(np.flatnonzero(ours.legal_mask()[0]))
    with pytest.raises(ValueError, match="do not lead"):
        player.choose(replay([0, 1]), 0, [0])


def test_mctsbot_counts_the_simulations_its_root_saw_when_solved_early():
    """Black to move after white's pass, the whole board black's: passing wins, so the solver stops long before 500
    simulations. Counted as asked, such a search once set a paced bot's next count past a C int."""
    moves = [m for stone in range(10) for m in (stone, SIZE * SIZE)]  # black fills two rows, white passes
    player = make_player("mctsbot:sims=500", SIZE, KOMI, seed=0)
    assert player.choose(replay(moves), 0, moves) == SIZE * SIZE
    assert 2 <= player.simulations < 500


def test_a_paced_search_sets_its_count_from_the_rate_of_its_last_full_search(monkeypatch):
    from hpc_rl.league import go_players

    clock = [0.0]
    monkeypatch.setattr(go_players.time, "perf_counter", lambda: clock[0])
    asked = []

    def search(sims, rate=1000.0, solved_after=None):  # a search of `rate` simulations a second on a fake clock
        asked.append(sims)
        done = sims if solved_after is None else min(sims, solved_after)
        clock[0] += done / rate
        return 7, done

    pace = go_players.Pace(0.5)
    assert pace.choose(search) == 7
    assert asked == [go_players.PROBE_SIMULATIONS, int(1000 * (0.5 - go_players.PROBE_SIMULATIONS / 1000))]
    pace.choose(lambda sims: search(sims, rate=400.0))  # slower now: measured on this move, used on the next
    pace.choose(lambda sims: search(sims, solved_after=3))  # stopped early by a solved root: the rate stays
    pace.choose(search)
    assert asked[2:] == [500, 200, 200] and pace.rate == pytest.approx(1000.0)


@pytest.mark.parametrize("spec, message", [("nope", "unknown kind"), ("rollout", "exactly one of sims"),
                                           ("mctsbot:sims=8,sec=1", "exactly one of sims"),
                                           ("rollout:sims=1", "sims must be >= 2"), ("rollout:sec=0", "sec must be"),
                                           ("rollout:sims=x", "is not a int"), ("random:sims=3", "not key=value")])
def test_bad_specs_are_named(spec, message):
    with pytest.raises(ValueError, match=message) as err:
        make_player(spec, SIZE, KOMI, 0)
    assert repr(spec) in str(err.value)


def test_spec_parsing():
    assert parse_spec("mctsbot:sec=0.5,uct_c=1.4") == ("mctsbot", {"sec": 0.5, "uct_c": 1.4})
    assert parse_spec("random") == ("random", {})


PLAYERS = ["random", "rollout:sims=6", "mctsbot:sims=6"]


def test_a_tiny_ladder_resumes_without_replaying_and_rates_as_the_ratings_code(tmp_path):
    lines = []
    results = go_ladder.play_ladder(PLAYERS, tmp_path / "results.json", SIZE, KOMI, 2, seed=5, progress=lines.append)
    assert lines[0].endswith("0 in " + str(tmp_path / "results.json") + ", 6 to play") and len(lines) == 7
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved == json.loads(json.dumps(results))
    for key, games in saved["pairs"].items():
        first, second = key.split(" vs ")
        assert [g["black"] for g in games] == [first, second]  # colours alternate, sorted name first
        assert [g["seed"] for g in games] == [pair_seed(5, first, second) + 2 * g for g in range(2)]
        assert all(g["moves_by"][0] + g["moves_by"][1] == len(g["moves"]) for g in games)

    # Resumed: nothing replayed; with a player added, only its pairs are played and the old games are kept as they are.
    lines.clear()
    go_ladder.play_ladder(PLAYERS, tmp_path / "results.json", SIZE, KOMI, 2, seed=5, progress=lines.append)
    assert lines == [f"3 pairs x 2 games: 6 in {tmp_path / 'results.json'}, 0 to play"]
    bigger = go_ladder.play_ladder(PLAYERS + ["rollout:sims=12"], tmp_path / "results.json", SIZE, KOMI, 2, seed=5,
                                   progress=lines.append)
    assert lines[-7].endswith("6 to play") and sum(map(len, bigger["pairs"].values())) == 12
    assert all(bigger["pairs"][k] == saved["pairs"][k] for k in saved["pairs"])
    # Fixed-simulation games replay identically in another ladder (the seeds are the players' and the ladder's).
    again = go_ladder.play_ladder(PLAYERS[1:], tmp_path / "other.json", SIZE, KOMI, 2, seed=5, progress=lines.append)
    key = go_ladder.pair_key(*PLAYERS[1:])
    assert [g["moves"] for g in again["pairs"][key]] == [g["moves"] for g in saved["pairs"][key]]

    # Ratings: the ratings code's Elo and Nash averaging on the points counted here from the saved games.
    evaluation = go_ladder.commit_evaluation(tmp_path, bigger, PLAYERS, 2, strength=("rollout:sims=6", "random"))
    n = len(PLAYERS)
    points, games = np.zeros((n, n)), np.zeros((n, n))
    for i, a in enumerate(PLAYERS):
        for j, b in enumerate(PLAYERS):
            for g in bigger["pairs"].get(go_ladder.pair_key(a, b), []) if i != j else []:
                black_points = (g["black_return"] + 1) / 2
                points[i, j] += black_points if g["black"] == a else 1 - black_points
                games[i, j] += 1
    elo = elo_from_results(points, games, anchor=0)
    nash, weight = nash_average(np.where(games > 0, (points + 0.5) / (games + 1), 0.5))
    for i, name in enumerate(PLAYERS):
        rated = evaluation["players"][name]
        assert rated["elo"] == pytest.approx(elo[i], abs=1e-6) and rated["games"] == 4
        assert rated["nash"] == pytest.approx(nash[i], abs=1e-6)
        assert rated["nash_weight"] == pytest.approx(weight[i], abs=1e-6)
    chain = elo_from_results(points[:2, :2], games[:2, :2])[1]
    assert evaluation["players"]["rollout:sims=6"]["selfplay_elo"] == pytest.approx(chain, abs=1e-6)
    assert evaluation["players"]["random"]["seconds_per_move"] > 0
    strength = evaluation["strength"]
    wins = sum(1 for g in bigger["pairs"][go_ladder.pair_key("random", "rollout:sims=6")]
               if g["black_return"] == (1 if g["black"] == "rollout:sims=6" else -1))
    assert (strength["games"], strength["wins"], strength["opponent"]) == (2, wins, "random")
    assert strength["ci95"][0] <= strength["win_rate"] <= strength["ci95"][1]
    assert (tmp_path / "ratings.md").read_text().count("`mctsbot:sims=6`") == 3  # a row, a column, a row
    assert (tmp_path / "ratings.png").stat().st_size > 0

    # The go benchmark reports the committed strength; none where nothing is committed.
    assert go_ladder.latest_strength(tmp_path) == (strength, str(tmp_path / "evaluation.json"))
    none, why = go_ladder.latest_strength(tmp_path / "nothing")
    assert none is None and "no committed evaluation" in why
    go_ladder.commit_evaluation(tmp_path, bigger, PLAYERS, 2)
    none, why = go_ladder.latest_strength(tmp_path)
    assert none is None and "--strength" in why


def test_a_results_file_of_other_settings_or_not_one_is_refused(tmp_path):
    path = tmp_path / "results.json"
    go_ladder.play_ladder(["random", "rollout:sims=4"], path, SIZE, KOMI, 2, seed=0, progress=lambda _: None)
    with pytest.raises(ValueError, match=f"{path} holds games with komi=7.5"):
        go_ladder.play_ladder(["random", "rollout:sims=4"], path, SIZE, 5.5, 2, seed=0)
    path.write_text("{")
    with pytest.raises(ValueError, match=f"{path}: not a readable results file"):
        go_ladder.play_ladder(["random", "rollout:sims=4"], path, SIZE, KOMI, 2, seed=0)


def test_the_go_benchmark_reports_the_committed_strength(tmp_path):
    from hpc_rl.bench import go as bench

    evaluation = {"strength": {"agent": "a", "opponent": "mctsbot:sec=1", "games": 100, "wins": 57, "win_rate": 0.57,
                               "ci95": [0.47, 0.66]}}
    (tmp_path / "evaluation.json").write_text(json.dumps(evaluation))
    args = Namespace(board_size=5, positions=1, opening_moves=(2, 4), simulations=4, rollouts=1, uct_c=2.0,
                     python_positions=0, match_games=0, seed=0, guided_games=2, guided_moves=1,
                     guided_simulations=2, guided_leaves=1, guided_blocks=1, guided_filters=4, ladder_simulations=2,
                     ladder_leaves=1, ladder_blocks=1, ladder_filters=4, evaluation=str(tmp_path))
    result = bench.run(args)
    assert result["strength"] == evaluation["strength"]
    assert set(result["strength"]) >= {"opponent", "games", "wins", "win_rate", "ci95"}
    assert result["strength_source"] == str(tmp_path / "evaluation.json")


# ---------------------------------------------------------------------------------------------------------------------
# The network player: a Go training run's committed checkpoints, made here as the controller writes them (config.yaml
# and checkpoints/), two versions of a 1x8 network on 5x5 (experiment=go5; komi 0.5).

def go_run(root):
    """A Go run directory with versions 1 and 2 committed (two initialisations, so the versions differ)."""
    import torch
    from hydra import compose, initialize_config_dir

    from hpc_rl.algo.alphazero import AlphaZeroLearner
    from hpc_rl.config import build_config, register, to_yaml
    from hpc_rl.launch import set_torch_threads
    from hpc_rl.model.go_net import GoNet
    from hpc_rl.storage import commit_checkpoint
    from hpc_rl.storage.layout import RunLayout

    set_torch_threads()
    register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        config = build_config(compose("train", overrides=["experiment=go5", f"runs_dir={root}", "run_name=go"]))
    layout = RunLayout.of(root, "go")
    layout.root.mkdir(parents=True)
    layout.config.write_text(to_yaml(config))
    go = config.env.go
    for version in (1, 2):
        torch.manual_seed(version)
        learner = AlphaZeroLearner(GoNet(go.net, go.board_size), config.alphazero)
        commit_checkpoint(layout.checkpoints, version, learner.checkpoint_sections(), config.config_hash(),
                          config=config.settings())
    return layout, go


def test_a_network_plays_legal_greedy_moves_from_its_committed_checkpoint(tmp_path):
    layout, go = go_run(tmp_path)
    spec = net_spec(str(layout.root), 2, sims=8)
    assert spec == f"net:run={layout.root},version=2,sims=8"
    player, twin = (make_player(spec, go.board_size, go.komi, seed=s) for s in (3, 4))
    paced = make_player(net_spec(str(layout.root), 1, seconds=0.01), go.board_size, go.komi, seed=3)
    assert player.name == spec and paced.name.endswith("version=1,sec=0.01")
    for length in (0, 6, 14):
        moves = random_game(11, length)
        games = GoGames(1, go.board_size, go.komi)
        for a in moves:
            games.step([a])
        action = player.choose(games, 0, moves)
        assert games.legal_mask()[0, action] and games.legal_mask()[0, paced.choose(games, 0, moves)]
        assert twin.choose(games, 0, moves) == action  # no noise, the most visited: the seed plays no part
    assert player.simulations == 3 * 8 and paced.simulations >= 3 * 2


def test_a_network_player_evaluates_its_paths_in_flight_in_one_batch(tmp_path):
    """leaves=4: after the root's own evaluation, each search step sends up to four leaves in one forward pass, so a
    move of 9 simulations takes 3 passes, not 9, and still plays a legal move from the same simulations."""
    layout, go = go_run(tmp_path)
    spec = net_spec(str(layout.root), 2, sims=9, leaves=4)
    assert spec.endswith("version=2,sims=9,leaves=4") and net_spec(str(layout.root), 2, sims=9, leaves=1) == \
        net_spec(str(layout.root), 2, sims=9)
    batched, single = (make_player(net_spec(str(layout.root), 2, sims=9, leaves=k), go.board_size, go.komi, seed=3)
                       for k in (4, 1))
    moves, passes = random_game(5, 6), {}
    for k, player in ((4, batched), (1, single)):
        inner, passes[k] = player.evaluate, []
        player.evaluate = lambda planes, legal, inner=inner, k=k: passes[k].append(len(planes)) or inner(planes, legal)
        action = player.choose(replay(moves), 0, moves)
        assert replay(moves).legal_mask()[0, action] and player.simulations == 9
    assert passes == {4: [1, 4, 4], 1: [1] * 9}
    with pytest.raises(ValueError, match="leaves must be >= 1"):
        make_player(net_spec(str(layout.root), 1, sims=8) + ",leaves=0", go.board_size, go.komi, 0)


def test_a_network_players_first_play_urgency_is_the_runs_unless_its_spec_sets_one(tmp_path):
    layout, go = go_run(tmp_path)
    own = make_player(net_spec(str(layout.root), 2, sims=8), go.board_size, go.komi, seed=0)
    spec = net_spec(str(layout.root), 2, sims=8, fpu=0.2)
    assert spec.endswith("version=2,sims=8,fpu=0.2")
    reduced = make_player(spec, go.board_size, go.komi, seed=0)
    assert own.config.fpu_reduction == go.search.fpu_reduction and reduced.config.fpu_reduction == 0.2
    moves = random_game(5, 6)
    assert replay(moves).legal_mask()[0, reduced.choose(replay(moves), 0, moves)]
    with pytest.raises(ValueError, match="fpu must lie in"):
        make_player(net_spec(str(layout.root), 1, sims=8, fpu=-0.1), go.board_size, go.komi, 0)


def test_a_network_player_keeps_its_tree_through_a_game_and_drops_it_for_another(tmp_path):
    """reuse=1: from its second move on the player's root holds the visits its last search spent below the two moves
    since played, plus this move's simulations; a position that does not follow its last one starts afresh."""
    layout, go = go_run(tmp_path)
    spec = net_spec(str(layout.root), 2, sims=24, reuse=True)
    assert spec.endswith("sims=24,reuse=1")
    player, plain = (make_player(s, go.board_size, go.komi, seed=0) for s in (spec, net_spec(str(layout.root), 2,
                                                                                            sims=24)))
    moves, roots = [], []
    games = GoGames(1, go.board_size, go.komi)
    while not games.terminal[0] and len(moves) < 12:
        for p in (player, plain):  # the player alternates colours with a player that keeps nothing
            if games.terminal[0]:
                break
            action = p.choose(games, 0, moves)
            assert games.legal_mask()[0, action]
            if p is player:
                roots.append(player.search._nf[player.search.roots[0], VISITS])
            games.step([action])
            moves.append(action)
    assert roots[0] == 24 and max(roots[1:]) > 24 and player.simulations == 24 * len(roots)
    fresh = GoGames(1, go.board_size, go.komi)
    player.choose(fresh, 0, [])  # another game: nothing kept
    assert player.search._nf[player.search.roots[0], VISITS] == 24
    with pytest.raises(ValueError, match="reuse must be 0 or 1"):
        make_player(spec.replace("reuse=1", "reuse=2"), go.board_size, go.komi, 0)


def test_sampled_openings_make_two_networks_games_differ_and_replay_from_their_seeds(tmp_path):
    """Without an opening two networks play one game per colour whatever the seeds; with opening=4 the first four
    moves are drawn from the visit counts, so seeds give different games, each replayed exactly from its seed."""
    layout, go = go_run(tmp_path)

    def game(seed, opening):
        black, white = (make_player(net_spec(str(layout.root), v, sims=4, opening=opening), go.board_size, go.komi,
                                    seed + k) for k, v in enumerate((1, 2)))
        return go_ladder.play_game(black, white, go.board_size, go.komi)["moves"]

    assert game(0, 0) == game(10, 0)
    sampled = [game(s, 4) for s in (0, 2, 4)]
    assert len({tuple(m[:4]) for m in sampled}) > 1 and game(2, 4) == sampled[1]
    assert net_spec(str(layout.root), 1, sims=8, opening=4).endswith("version=1,sims=8,opening=4")
    with pytest.raises(ValueError, match="opening must be >= 0"):
        make_player(net_spec(str(layout.root), 1, sims=8) + ",opening=-1", go.board_size, go.komi, 0)


def test_the_evaluate_job_sends_a_go_run_to_the_ladder(tmp_path, capsys):
    layout, _ = go_run(tmp_path)
    job = importlib.util.spec_from_file_location("evaluate_job", ROOT / "jobs" / "evaluate.py")
    module = importlib.util.module_from_spec(job)
    job.loader.exec_module(module)
    with pytest.raises(SystemExit):
        module.main([str(layout.root), "--games", "2"])
    assert f"is a Go run: its networks play in a ladder, e.g. python jobs/go_ladder.py mctsbot:sec=0.1 --run " \
           f"{layout.root} --versions 2" in capsys.readouterr().err


def test_a_network_player_names_what_is_missing_or_damaged(tmp_path):
    layout, go = go_run(tmp_path)
    size, komi = go.board_size, go.komi
    with pytest.raises(ValueError, match=f"{tmp_path / 'nope' / 'config.yaml'} does not exist"):
        make_player(net_spec(str(tmp_path / "nope"), 1, sims=4), size, komi, 0)
    missing = re.escape(f"{layout.checkpoints / checkpoint_name(7)} does not exist: version 7 is not committed "
                        "(committed: 1, 2)")
    with pytest.raises(ValueError, match=missing):
        make_player(net_spec(str(layout.root), 7, sims=4), size, komi, 0)
    with pytest.raises(ValueError, match="give run=RUN_DIR"):
        make_player(f"net:run={layout.root},sims=4", size, komi, 0)
    with pytest.raises(ValueError, match="trained on 5x5 at komi 0.5; this ladder plays 9x9"):
        make_player(net_spec(str(layout.root), 1, sims=4), 9, 7.5, 0)
    damaged = layout.checkpoints / checkpoint_name(2)
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=re.escape(str(damaged))):
        make_player(net_spec(str(layout.root), 2, sims=4), size, komi, 0)


def test_a_ladder_of_a_runs_versions_and_random_plays_and_rates(tmp_path):
    layout, go = go_run(tmp_path / "runs")
    job = importlib.util.spec_from_file_location("go_ladder_job", ROOT / "jobs" / "go_ladder.py")
    module = importlib.util.module_from_spec(job)
    job.loader.exec_module(module)
    out = tmp_path / "ladder"
    argv = ["random", "--run", str(layout.root), "--every", "1", "--net-sims", "4", "--games", "2",
            "--board-size", str(go.board_size), "--komi", str(go.komi), "--out", str(out)]
    versions = [net_spec(str(layout.root), v, sims=4) for v in (1, 2)]
    assert module.parse(argv).players == ["random", *versions]  # oldest first: the self-play Elo chains the versions
    assert module.main(argv + ["--strength", versions[1], "random"]) == 0
    evaluation = json.loads((out / "evaluation.json").read_text())
    assert set(evaluation["players"]) == {"random", *versions}
    assert all(p["games"] == 4 and np.isfinite(p["elo"]) for p in evaluation["players"].values())
    assert evaluation["players"][versions[0]]["simulations_per_move"] == 4
    assert evaluation["strength"]["agent"] == versions[1] and evaluation["strength"]["games"] == 2
    # Version 1's checkpoint pruned (keep_every), in a new process (no network cached): the ladder, all of whose
    # games are played, commits again with version 1 rated; a player added must play version 1, which is named.
    (layout.checkpoints / checkpoint_name(1)).unlink()
    go_players.load_go_net.cache_clear()
    again = [*argv, "--strength", versions[1], "random"]
    again[again.index("--every"):again.index("--every") + 2] = ["--versions", "1", "2"]
    (out / "evaluation.json").unlink()
    assert module.main(again) == 0
    assert set(json.loads((out / "evaluation.json").read_text())["players"]) == {"random", *versions}
    with pytest.raises(SystemExit, match="version 1 is not committed"):
        module.main(["random", "rollout:sims=4", *again[1:]])
    with pytest.raises(SystemExit):
        module.parse(["random", "--run", str(layout.root)])  # which versions: not said
