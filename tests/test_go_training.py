"""Go's self-play -> learn -> checkpoint (env.name=go, hpc_rl.roles.go): the role logic in one process, and one real
MPI job on 5x5 that commits checkpoints and resumes."""

import json
import re
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

from hpc_rl import metric_names as M
from hpc_rl.algo.alphazero import AlphaZeroLearner, ReplayBuffer, in_symmetries, sample_even_wins, win_group_shares
from hpc_rl.algo.config import AlphaZeroConfig
from hpc_rl.config import TrainConfig, build_config, register
from hpc_rl.data.batch import GameSchema, SegmentError
from hpc_rl.envs.go import NUM_PLANES, NUM_SYMMETRIES, GoGames, symmetry_boards, symmetry_points
from hpc_rl.launch import mpirun_command, rank_env, set_torch_threads
from hpc_rl.roles import controller
from hpc_rl.model.config import GoNetConfig
from hpc_rl.model.go_net import GoNet
from hpc_rl.runner import SerialRunner
from hpc_rl.storage import open_run
from hpc_rl.storage.hdf5 import DamagedFileError
from hpc_rl.storage.replay_buffer import read_replay_buffer, write_replay_buffer

ROOT = Path(__file__).resolve().parent.parent


def go5(runs: Path, *overrides: str) -> TrainConfig:
    register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        return build_config(compose("train", overrides=["experiment=go5", f"runs_dir={runs}", *overrides]))


def test_replay_buffer_keeps_the_newest_positions_in_order_and_samples_them_uniformly():
    buffer = ReplayBuffer(5, 5, NUM_PLANES)

    def add(first: int, n: int) -> None:  # positions labelled by their version
        buffer.add(np.zeros((n, NUM_PLANES, 5, 5), np.float32), np.full((n, 26), 1 / 26, np.float32),
                   np.zeros(n, np.float32), np.arange(first, first + n), first % 2,
                   ownership=np.ones((n, 25), np.int8), scored=first % 2 == 0)

    add(0, 3)
    assert list(buffer.version[buffer.order()]) == [0, 1, 2]
    add(3, 4)  # two of the oldest make way
    assert list(buffer.version[buffer.order()]) == [2, 3, 4, 5, 6] and buffer.size == 5
    add(7, 7)  # more than it holds at once: the newest five
    assert list(buffer.version[buffer.order()]) == [9, 10, 11, 12, 13] and buffer.added == 14
    drawn = buffer.sample(20_000, np.random.default_rng(0))["version"]
    counts = np.bincount(drawn - 9, minlength=5)
    assert set(drawn) == {9, 10, 11, 12, 13} and np.all(np.abs(counts / 20_000 - 0.2) < 0.015)
    assert list(buffer.winner[buffer.order()]) == [1] * 5 and buffer.black_win_share() == 0.0
    assert not buffer.scored[buffer.order()].any() and (buffer.ownership[buffer.order()] == 1).all()


def test_replay_buffer_file_restores_the_positions_of_versions_up_to_the_resumed_one(tmp_path):
    """A learner's buffer written whole and read back (``hpc_rl.storage.replay_buffer``): the positions in order,
    0/1 planes stored as uint8 and read back exact; a resume from an earlier version than the file's drops later
    networks' positions; a smaller buffer keeps the newest; a damaged file is refused by name."""
    rng = np.random.default_rng(0)
    buffer = ReplayBuffer(8, 5, NUM_PLANES)
    for game, version in enumerate((1, 3, 5, 7)):  # three positions a game, the versions that played them
        buffer.add(rng.integers(0, 2, (3, NUM_PLANES, 5, 5)).astype(np.float32), rng.random((3, 26), np.float32),
                   np.array([1.0, -1.0, 1.0], np.float32), np.full(3, version), game % 2,
                   ownership=rng.integers(-1, 2, (3, 25)).astype(np.int8), scored=game != 2)
    path = tmp_path / "replay_buffer" / "learner0.h5"
    write_replay_buffer(path, buffer.state(), version=8)
    arrays, attrs = read_replay_buffer(path)
    assert attrs["version"] == 8 and arrays["planes"].dtype == np.float32
    for name, held in buffer.state().items():
        assert np.array_equal(arrays[name], held), name
    again = ReplayBuffer(8, 5, NUM_PLANES)
    assert again.restore(arrays, 8) == 8
    assert all(np.array_equal(again.state()[k], v) for k, v in buffer.state().items())
    assert list(again.version[again.order()]) == [3, 3, 5, 5, 5, 7, 7, 7]
    again.add(np.zeros((1, NUM_PLANES, 5, 5), np.float32), np.zeros((1, 26), np.float32), np.zeros(1, np.float32),
              np.array([9]), 0, ownership=np.zeros((1, 25), np.int8), scored=True)  # the oldest makes way
    assert list(again.version[again.order()]) == [3, 5, 5, 5, 7, 7, 7, 9]
    earlier = ReplayBuffer(8, 5, NUM_PLANES)
    assert earlier.restore(arrays, 5) == 5 and list(earlier.version[earlier.order()]) == [3, 3, 5, 5, 5]
    smaller = ReplayBuffer(4, 5, NUM_PLANES)
    assert smaller.restore(arrays, 8) == 4 and list(smaller.version[smaller.order()]) == [5, 7, 7, 7]
    with pytest.raises(ValueError, match="rows of shape"):
        ReplayBuffer(8, 9, NUM_PLANES).restore(arrays, 8)
    with pytest.raises(ValueError, match="'ownership': rows of shape missing"):  # a buffer of an older format
        ReplayBuffer(8, 5, NUM_PLANES).restore({k: v for k, v in arrays.items() if k != "ownership"}, 8)
    with pytest.raises(ValueError, match="holds positions"):
        again.restore(arrays, 8)
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(DamagedFileError, match="learner0.h5: digest mismatch"):
        read_replay_buffer(path)
    assert read_replay_buffer(tmp_path / "none.h5") is None


def slow_even_win_probabilities(winners):
    """Each position's chance of being drawn: a draw's 1/N; a decided game's position half the decided share over
    its colour's positions (all of it when the other colour won none)."""
    n = len(winners)
    decided = sum(w >= 0 for w in winners) / n
    count = {c: sum(w == c for w in winners) for c in (0, 1)}
    colours = [c for c in (0, 1) if count[c]]
    return np.array([1 / n if w < 0 else decided / len(colours) / count[w] for w in winners])


@pytest.mark.parametrize("winners", [[0, 0, 0, 0, 0, 0, 1, 1, -1, 0], [1, 1, 1, 0], [0, 0, -1], [-1, -1], [1]])
def test_even_win_sampling_matches_a_slow_reference(winners):
    """ELF OpenGo's sampling: black's wins and white's drawn evenly however the buffer is split."""
    winners = np.array(winners)
    expected = slow_even_win_probabilities(winners)
    shares = win_group_shares(winners)
    assert np.allclose(shares, [expected[winners == c].sum() for c in (0, 1, -1)])
    draws = 200_000
    rows = sample_even_wins(winners, draws, np.random.default_rng(1))
    assert len(rows) == draws
    freq = np.bincount(rows, minlength=len(winners)) / draws
    assert np.all(np.abs(freq - expected) < 4 * np.sqrt(expected * (1 - expected) / draws) + 1e-12)


def fixed_batch(n: int = 32, seed: int = 0):
    rng = np.random.default_rng(seed)
    planes = (rng.random((n, NUM_PLANES, 5, 5)) < 0.3).astype(np.float32)
    pi = rng.dirichlet(np.ones(26), n).astype(np.float32)
    z = rng.choice([-1.0, 1.0], n).astype(np.float32)
    ownership = rng.integers(-1, 2, (n, 25)).astype(np.int8)
    return planes, pi, z, ownership, np.ones(n, bool)


def test_symmetries_move_planes_policy_and_ownership_of_each_position_together():
    """``in_symmetries`` against a row-by-row reference, and the buffer's draws with ``symmetries``: every drawn
    position is a stored one in one of the 8 symmetries (all 8 drawn), its outcome and version unchanged."""
    planes, pi, z, ownership, scored = fixed_batch(16, seed=3)
    batch = {"planes": planes, "pi": pi, "z": z, "ownership": ownership, "version": np.arange(16)}
    ks = np.arange(16) % NUM_SYMMETRIES
    moved = in_symmetries(batch, ks)
    for i, k in enumerate(ks):
        assert np.array_equal(moved["planes"][i], symmetry_boards(planes[i], k))
        assert np.array_equal(moved["pi"][i], symmetry_points(pi[i], 5, k))
        assert np.array_equal(moved["ownership"][i], symmetry_points(ownership[i], 5, k))
    assert moved["z"] is z and np.array_equal(batch["planes"], planes)  # the input is not changed in place

    buffer = ReplayBuffer(16, 5, NUM_PLANES)
    buffer.add(planes, pi, z, np.arange(16), 0, ownership=ownership, scored=True)
    drawn = buffer.sample(400, np.random.default_rng(0), symmetries=True)
    seen = set()
    for i, v in enumerate(drawn["version"]):
        ks = [k for k in range(NUM_SYMMETRIES) if np.array_equal(drawn["planes"][i], symmetry_boards(planes[v], k))
              and np.array_equal(drawn["pi"][i], symmetry_points(pi[v], 5, k))]
        assert len(ks) == 1 and drawn["z"][i] == z[v]
        assert np.array_equal(drawn["ownership"][i], symmetry_points(ownership[v], 5, ks[0]))
        seen.add(ks[0])
    assert seen == set(range(NUM_SYMMETRIES))
    plain = buffer.sample(400, np.random.default_rng(0))
    assert np.array_equal(plain["planes"], planes[plain["version"]])


def test_alphazero_update_lowers_the_loss_on_a_fixed_batch_and_its_checkpoint_restores_it():
    set_torch_threads()
    planes, pi, z, ownership, scored = fixed_batch()
    config = AlphaZeroConfig(replay_positions=64, min_positions=1, batch_size=32, lr=0.05, lr_drops=(20,))
    learner = AlphaZeroLearner(GoNet(GoNetConfig(blocks=1, filters=8), 5), config)
    metrics = [learner.update(planes, pi, z, ownership, scored) for _ in range(30)]
    # The policy part cannot fall below pi's entropy, nor the ownership part below that of the targets' owner
    # distributions (a neutral point's 1/2 and 1/2: log 2): the loss above those floors must fall.
    floor = float(-(pi * np.log(pi)).sum(1).mean()) + config.ownership_weight * float((ownership == 0).mean()) * np.log(2)
    losses = [m[M.LOSS] - floor for m in metrics]
    assert losses[-1] < 0.5 * losses[0], losses
    assert metrics[-1][M.OWNERSHIP_LOSS] < metrics[0][M.OWNERSHIP_LOSS]
    assert np.isclose(metrics[0][M.LOSS], metrics[0][M.VALUE_LOSS] + metrics[0][M.POLICY_LOSS]
                      + config.ownership_weight * metrics[0][M.OWNERSHIP_LOSS], atol=1e-5)
    assert [m[M.LR] for m in metrics[19:21]] == [0.05, pytest.approx(0.005)] and learner.version == 30
    restored = AlphaZeroLearner(GoNet(GoNetConfig(blocks=1, filters=8), 5), config)
    restored.load_checkpoint_sections(learner.checkpoint_sections())
    assert restored.version == 30
    a, b = learner.net.state_dict(), restored.net.state_dict()
    assert all(np.array_equal(a[k].numpy(), b[k].numpy()) for k in a)
    assert restored.optimizer.state_dict()["state"].keys() == learner.optimizer.state_dict()["state"].keys()


def test_ownership_trains_only_on_games_played_out():
    """Positions of resigned games (``scored`` False) carry no ownership target: an update on them alone is the
    update without the ownership loss (weight 0), parameter for parameter; on scored ones it is not."""
    set_torch_threads()
    planes, pi, z, ownership, scored = fixed_batch(seed=1)

    def params_after(weight: float, scored: np.ndarray) -> list[np.ndarray]:
        torch.manual_seed(0)
        config = AlphaZeroConfig(replay_positions=64, min_positions=1, batch_size=32, ownership_weight=weight)
        learner = AlphaZeroLearner(GoNet(GoNetConfig(blocks=1, filters=8), 5), config)
        metrics = learner.update(planes, pi, z, ownership, scored)
        return [p.detach().numpy().copy() for p in learner.net.parameters()], metrics

    without, _ = params_after(0.0, scored)
    resigned, metrics = params_after(1.5, np.zeros_like(scored))
    played_out, _ = params_after(1.5, scored)
    assert metrics[M.OWNERSHIP_LOSS] == 0.0
    assert all(np.array_equal(a, b) for a, b in zip(without, resigned))
    assert not all(np.array_equal(a, b) for a, b in zip(without, played_out))


def test_env_rank_records_games_with_the_search_policy_and_each_players_outcome(tmp_path):
    """The env, inference and learner roles of a Go job in one process (the serial runner): the records that reach
    the ring hold a distribution pi per position and z the game's result for the player to move; the run then
    learns and commits its checkpoints."""
    set_torch_threads()
    config = go5(tmp_path, "run_name=serial", "pipeline.max_versions=2")
    runner = SerialRunner(config)
    schema = GameSchema(5, config.env.go.game_length)
    records = []
    while len(records) < 3:
        records += runner.collect_games()
    for record in records:
        assert np.allclose(record.pi.sum(1), 1.0, atol=1e-5) and (record.pi >= 0).all()
        assert set(np.unique(record.z)) <= {-1.0, 0.0, 1.0}
        assert list(record.to_play) == [i % 2 for i in range(len(record.z))]  # black first, then alternating
        games = GoGames(1, 5, komi=0.5)
        moves = record.actions[:-1] if record.resigned else record.actions
        for action in moves:
            games.step(np.array([action]))
        if record.resigned:  # the player to move at the last position resigned
            assert not games.terminal[0] and record.winner == 1 - record.to_play[-1]
        else:
            assert games.terminal[0]
            returns = games.returns()[0]
            assert np.array_equal(record.z, returns[record.to_play].astype(np.float32))
        assert (record.versions >= 0).all()
        if not record.resigned:  # the final board's owners: KataGo's ownership target
            assert np.array_equal(record.ownership, games.area_owners()[0])
        again, _, _ = schema.unpack(schema.pack(record, 1, 1))  # the wire keeps every field
        for name in ("planes", "pi", "z", "to_play", "actions", "versions", "ownership"):
            assert np.array_equal(getattr(again, name), getattr(record, name)), name
        assert (again.winner, again.resigned, again.moves) == (record.winner, record.resigned, record.moves)
    broken = records[0]
    broken.z = -broken.z if broken.winner >= 0 else broken.z + 1
    with pytest.raises(SegmentError, match="outcomes"):
        schema.unpack(schema.pack(broken, 1, 1))
    broken = records[1]
    broken.ownership = broken.ownership.copy()
    broken.ownership[3] = 2
    with pytest.raises(SegmentError, match="ownership"):
        schema.unpack(schema.pack(broken, 1, 1))
    metrics = runner.run()
    assert metrics[M.GO_GAMES] >= 1 and metrics[M.REPLAY_POSITIONS] >= config.alphazero.min_positions
    assert open_run(tmp_path / "serial").checkpoint_versions[-1] == 2
    summary = json.loads((tmp_path / "serial" / "summary.json").read_text())  # a Go run's next step: its ladder
    assert any("go_ladder.py mctsbot:sec=0.1" in c and "--versions 2 " in c for c in summary["next"])
    assert not any("evaluate.py" in c for c in summary["next"])
    # The replay buffer file is a cache: a write that fails (here its folder is a file) is logged, not raised, and
    # the file written at the last version stays whole.
    written = read_replay_buffer(runner.learner_worker.buffer_path)
    assert written[1]["version"] == 2 and len(written[0]["z"]) == runner.learner_worker.buffer.size
    (tmp_path / "blocked").write_text("")
    runner.learner_worker.buffer_path = tmp_path / "blocked" / "learner0.h5"
    runner.learner_worker.save_buffer()
    assert (tmp_path / "blocked").read_text() == ""


def test_playout_cap_randomisation_ships_only_full_searches_and_counts_every_move(tmp_path):
    """With fast searches (env.go.search.fast_simulations) the env role ships only the positions of full searches,
    counts every move in the game lengths, and keeps back games that recorded none (4-move games, a quarter of the
    moves full: about a third of the games record nothing)."""
    set_torch_threads()
    config = go5(tmp_path, "run_name=cap", "env.go.search.simulations=6", "env.go.search.fast_simulations=2",
                 "env.go.search.full_search_share=0.25", "env.go.max_game_length=4")
    runner = SerialRunner(config)
    records = []
    while len(records) < 8:
        records += runner.collect_games()
    env = runner.producer
    assert all(1 <= len(r.z) <= r.moves for r in records) and any(len(r.z) < r.moves for r in records)
    kept_back = env.stats["games"] - len(env.produced_ids)
    assert kept_back > 0 and len(env.produced_ids) >= len(records)  # short games of fast searches alone
    shipped = sum(r.moves for r in records)
    assert env.stats["game_moves"] >= shipped  # games still in the ring or kept back add their moves
    runner.close()


def test_gating_plays_candidates_between_selfplay_batches_and_promotes_only_winners(tmp_path):
    """With gating (env.go.gating.games) the inference role plays each candidate against the self-play network a
    search step at a time; self-play moves on meanwhile with the network that last won, and the metrics report it."""
    set_torch_threads()
    config = go5(tmp_path, "run_name=gate", "pipeline.max_versions=1000", "env.go.gating.games=2",
                 "env.go.gating.opening=2", "env.go.max_game_length=8")
    runner = SerialRunner(config)
    log = []

    def on_update(runner, metrics):
        inference = runner.inference
        log.append((inference.version, inference.gate_stats["gate_promoted"], inference.match is not None))
        return inference.gate_stats["gate_matches"] >= 2

    metrics = runner.run(on_update)
    stats = runner.inference.gate_stats
    assert stats["gate_matches"] >= 2 and 0 <= stats["gate_score"] <= 1
    assert metrics[M.GATE_MATCHES] == stats["gate_matches"] and metrics[M.GATE_SCORE] == stats["gate_score"]
    assert metrics[M.GATE_SELFPLAY_VERSION] == runner.inference.version
    # the self-play version changes only when a candidate wins, and then to that candidate
    for (version, promoted, _), (after, promoted_after, _) in zip(log, log[1:]):
        assert (after != version) == (promoted_after > promoted) and after >= version
    assert any(busy for _, _, busy in log)  # versions were trained while a match was under way


def test_a_time_limit_met_while_the_buffer_fills_ends_the_sitting_and_keeps_its_positions(tmp_path, monkeypatch,
                                                                                           capsys):
    """A stop before the learners' first update (their buffers below min_positions, which may take minutes to fill)
    ends the sitting at its limit, not at the update: the version it is at is committed with the buffer file, and the
    resumed learners start from those positions. Meanwhile the controller prints what the buffers hold."""
    monkeypatch.setattr(controller, "WAITING_LINE_S", 1.0)
    set_torch_threads()
    runner = SerialRunner(go5(tmp_path, "run_name=go", "alphazero.replay_positions=100000",
                                    "alphazero.min_positions=100000", "pipeline.max_seconds=4"))
    started = time.monotonic()
    runner.run()
    elapsed = time.monotonic() - started
    out = capsys.readouterr().out
    assert re.search(r"time limit of 4 s: stopping at version 1, or at version 0 if the learners' replay buffers "
                     r"still hold fewer than alphazero.min_positions \([\d,]+ of 100,000\)", out), out
    waiting = [line for line in out.splitlines() if line.startswith("waiting for version 1")]
    assert len(waiting) >= 2, waiting
    assert re.fullmatch(r"waiting for version 1  0:0\d elapsed  env \d+ steps/s  games \d+  "
                        r"replay [\d,]+ of 100,000 positions before the first update", waiting[-1]), waiting[-1]
    run = open_run(tmp_path / "go")
    assert run.status["state"] == "time_limit" and run.status["version"] == 0, run.status
    assert run.checkpoint_versions == [0]
    # Without the stop while filling, the sitting would run until 100,000 positions had been played (minutes).
    assert elapsed < 30, elapsed
    arrays, attrs = read_replay_buffer(tmp_path / "go" / "replay_buffer" / "learner0.h5")
    assert attrs["version"] == 0 and 0 < len(arrays["z"]) < 100_000 and arrays["version"].max() == 0
    runner = SerialRunner(go5(tmp_path, "run_name=go", "alphazero.replay_positions=100000", "pipeline.max_versions=1"))
    assert runner.learner.version == 0
    assert runner.learner_worker.buffer.size == len(arrays["z"])
    runner.run()
    assert open_run(tmp_path / "go").checkpoint_versions[-1] == 1


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_go_selfplay_learns_and_commits_checkpoints_under_mpi_and_resumes(tmp_path):
    """Controller, env, inference and learner ranks on 5x5: games played, positions learned from, versions 2 and 4
    committed, every game accounted for; the run then resumes from version 4 for one more version. The resume runs
    the same roles in one process (the serial runner): a second launch of four ranks would double the test's cost,
    and the MPI job's resume path (the controller sending the checkpoint's sections to the learners) is the MOBA's."""
    cmd = mpirun_command(4, [str(ROOT / "jobs/train.py"), "experiment=go5", "run_name=go", f"runs_dir={tmp_path}"])
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=rank_env(), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = open_run(tmp_path / "go")
    assert run.checkpoint_versions == [2, 4]
    assert list(run.metrics[M.LOSS]["version"]) == [1, 2, 3, 4]
    # The games count comes with the env rank's heartbeats, which may lag a version this short: it is written at
    # every version and never falls; that games were played and learned from, the accounting below shows.
    games = run.metrics[M.GO_GAMES]
    assert list(games["version"]) == [1, 2, 3, 4] and np.all(np.diff(games["value"]) >= 0)
    assert run.meta["transport"]["backend"] in ("rma", "twosided")
    accounting = json.loads((tmp_path / "go" / "accounting.json").read_text())
    produced, consumed, left = ({tuple(i) for i in accounting[k]} for k in ("produced", "consumed", "left"))
    assert consumed and consumed | left == produced and not consumed & left
    # The learner wrote its replay buffer at its last version; the resumed learner starts from it, not empty.
    buffer_file = tmp_path / "go" / "replay_buffer" / "learner0.h5"
    arrays, attrs = read_replay_buffer(buffer_file)
    assert attrs["version"] == 4 and len(arrays["z"]) > 0 and arrays["version"].max() <= 4
    set_torch_threads()
    runner = SerialRunner(go5(tmp_path, "run_name=go", "pipeline.max_versions=5"))
    assert runner.learner.version == 4
    assert runner.learner_worker.buffer.size == min(len(arrays["z"]), runner.learner_worker.buffer.capacity)
    assert np.array_equal(runner.learner_worker.buffer.state()["pi"], arrays["pi"][-runner.learner_worker.buffer.size:])
    runner.run()
    run = open_run(tmp_path / "go")
    assert run.checkpoint_versions[-1] == 5
    assert list(run.metrics[M.LOSS]["version"]) == [1, 2, 3, 4, 5]
    assert read_replay_buffer(buffer_file)[1]["version"] == 5
    # A damaged buffer file is set aside for a person to look at; the resumed learners start empty.
    data = bytearray(buffer_file.read_bytes())
    data[-100] ^= 0xFF
    buffer_file.write_bytes(bytes(data))
    runner = SerialRunner(go5(tmp_path, "run_name=go", "pipeline.max_versions=6"))
    assert runner.learner_worker.buffer.size == 0 and not buffer_file.exists()
    assert len(list(buffer_file.parent.glob("learner0.h5.damaged.*"))) == 1
    runner.close()
