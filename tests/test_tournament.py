"""Ratings of trained policies: the controller's rating book, jobs/tournament.py's round robin, evaluator ranks."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hpc_rl.launch import rank_env
from hpc_rl.league.tournament import RatingBook, last_rated_version
from hpc_rl.storage import MetricsWriter, open_run
from hpc_rl.storage.layout import RunLayout

from small_moba import one_torch_thread, tiny_run  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parent.parent


def _matches(scores_random, scores_scripted):
    def match(scores):
        return {"games": len(scores), "wins": scores.count(1.0), "draws": scores.count(0.5),
                "losses": scores.count(0.0), "scores": list(scores)}
    return {"random": match(scores_random), "scripted": match(scores_scripted)}


def test_rating_book_writes_figures_and_a_resumed_run_continues_its_table(tmp_path):
    results = {2: _matches([1.0, 0.5, 1.0, 1.0], [0.0, 0.0, 0.0, 0.5]),
               4: _matches([1.0, 1.0, 1.0, 1.0], [0.0, 0.5, 0.0, 1.0]),
               6: _matches([1.0, 1.0, 1.0, 1.0], [1.0, 0.5, 1.0, 0.0])}
    book = RatingBook.load(tmp_path, resume_version=-1)
    figures = {v: book.add(v, m) for v, m in results.items()}
    book.save()
    assert figures[2]["eval/games/policy"] == 8 and figures[6]["eval/games/random"] == 12
    assert figures[2]["eval/win_rate/random"] == 0.75 and figures[2]["eval/draw_rate/scripted"] == 0.25
    assert figures[6]["eval/trueskill/scripted"] > 0  # the references are rated relative to random
    assert figures[6]["eval/trueskill/policy"] > figures[2]["eval/trueskill/policy"]
    with pytest.raises(ValueError, match="not newer"):
        book.add(6, results[6])

    # A run resumed from version 4 continues from the table as it stood after version 4: rating version 6 again
    # gives exactly the figures of the uninterrupted run.
    assert last_rated_version(tmp_path, 5) == 4 and last_rated_version(tmp_path, -1) == -1
    resumed = RatingBook.load(tmp_path, resume_version=5)
    assert resumed.last_version == 4
    assert resumed.add(6, results[6]) == figures[6]
    assert json.loads(RunLayout(tmp_path).ratings.read_text())["records"][-1]["version"] == 6


# --- jobs/tournament.py --------------------------------------------------------------------------------------
def _tournament(*args, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, str(ROOT / "jobs/tournament.py"), *map(str, args)], capture_output=True,
                         text=True, timeout=400, env=rank_env(), cwd=ROOT)
    if check:
        assert out.returncode == 0, out.stdout + out.stderr
    return out


def _table(stdout: str) -> list[str]:
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("player"))
    return lines[start:start + 6]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_tournament_rates_every_version_writes_eval_series_and_is_deterministic(tmp_path):
    run_dir = tiny_run(tmp_path / "run")
    out = _tournament(run_dir, "--games", 4, "--seed", 5)
    assert "[6/6]" in out.stdout  # progress, one line per pair (2 versions + random + scripted)
    metrics = open_run(run_dir).metrics
    policy = metrics["eval/trueskill/policy"]
    assert list(policy["version"]) == [2, 4]
    assert list(policy["step"]) == [2000, 4000] and list(policy["wall_time"]) == [200.0, 400.0]  # training's rows
    for name in ("eval/elo/policy", "eval/nash/policy", "eval/nash_weight/policy", "eval/trueskill_sigma/policy",
                 "eval/win_rate/scripted", "eval/games_vs/random", "eval/trueskill/scripted", "eval/nash/random"):
        assert list(metrics[name]["version"]) == [2, 4], name
    assert list(metrics["eval/games/policy"]["value"]) == [12.0, 12.0]  # 3 opponents x 4 games
    assert list(metrics["eval/games_vs/scripted"]["value"]) == [4.0, 4.0]
    weights = (metrics["eval/nash_weight/policy"]["value"].sum() + metrics["eval/nash_weight/random"]["value"][0]
               + metrics["eval/nash_weight/scripted"]["value"][0])
    assert weights == pytest.approx(1.0, abs=1e-6)
    # The scripted bot beats random: every rating puts it above random (0 by definition).
    assert metrics["eval/trueskill/scripted"]["value"][0] > 0 and metrics["eval/elo/scripted"]["value"][0] > 0

    # Same seed, same games, same figures (--print-only: nothing written the second time).
    again = _tournament(run_dir, "--games", 4, "--seed", 5, "--print-only")
    assert _table(again.stdout) == _table(out.stdout)
    rerun = open_run(run_dir).metrics
    assert all(np.array_equal(rerun[name], rows) for name, rows in metrics.items())


def _tournament_in_process(*args) -> None:
    """jobs/tournament.py's main in this process (no interpreter start-up per call)."""
    spec = importlib.util.spec_from_file_location("tournament_job", ROOT / "jobs/tournament.py")
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    assert job.main([str(a) for a in args]) == 0


@pytest.mark.slow
def test_tournament_refuses_a_run_being_written(tmp_path):
    run_dir = tiny_run(tmp_path / "run", versions=(2,), time_limit=100)
    status = run_dir / "status.json"  # resumed: the controller wrote meta.json again, status.json is older
    os.utime(status, (status.stat().st_mtime - 60,) * 2)
    with pytest.raises(SystemExit, match="refusing to write.*still running"):
        _tournament_in_process(run_dir, "--games", 2)
    (run_dir / "status.json").write_text(json.dumps({"state": "finished", "version": 2}))
    with MetricsWriter(run_dir / "metrics.h5"):  # a controller holding metrics.h5 in SWMR mode (another process:
        out = _tournament(run_dir, "--games", 2, check=False)  # HDF5 shares a file opened twice in one process)
    assert out.returncode != 0 and "open for writing elsewhere" in out.stderr
    with MetricsWriter(run_dir / "metrics.h5") as metrics:  # ratings an evaluator rank wrote during training
        metrics.log("eval/trueskill/policy", 2, 2000, 1.5)
    with pytest.raises(SystemExit, match="--replace"):
        _tournament_in_process(run_dir, "--games", 2)
    assert open_run(run_dir).metrics["eval/trueskill/policy"]["value"].tolist() == [1.5]
    _tournament_in_process(run_dir, "--games", 2, "--replace")
    assert open_run(run_dir).metrics["eval/trueskill/policy"]["wall_time"].tolist() == [200.0]  # replaced
    _tournament_in_process(run_dir, "--games", 2, "--seed", 1)  # its own series: a rerun replaces them
    assert open_run(run_dir).metrics["eval/trueskill/policy"]["version"].tolist() == [2]
    with pytest.raises(SystemExit, match=r"no committed checkpoint for version\(s\) \[3\]"):
        _tournament_in_process(run_dir, "--versions", 3)


# --- evaluator ranks in the pipeline ------------------------------------------------------------------------------
@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_evaluator_rank_rates_committed_versions_into_metrics(mpi, tmp_path):
    out = mpi(7, [str(ROOT / "jobs/train.py"), "run_name=rated", f"runs_dir={tmp_path}", "topology.evaluator=1",
                  "env.num_envs=4", "env.moba.time_limit=300", "pipeline.segment_len=32",
                  "pipeline.segments_per_batch=2", "ppo.num_minibatches=2", "pipeline.max_versions=8",
                  "pipeline.checkpoint_every=2", "evaluation.games=4"], timeout=480, cwd=ROOT)
    run = open_run(tmp_path / "rated")
    rows = run.metrics["eval/trueskill/policy"]
    versions = list(rows["version"])
    # Rated in version order, only committed versions (every checkpoint_every), and the final one always.
    assert versions == sorted(set(versions)) and versions[-1] == 8 and all(v % 2 == 0 for v in versions)
    for name, value in (("eval/games/policy", 8.0), ("eval/games_vs/random", 4.0), ("eval/games_vs/scripted", 4.0)):
        assert list(run.metrics[name]["version"]) == versions and set(run.metrics[name]["value"]) == {value}, name
    assert list(run.metrics["eval/trueskill/scripted"]["version"]) == versions
    records = json.loads(RunLayout(tmp_path / "rated").ratings.read_text())["records"]
    assert [r["version"] for r in records] == versions
    assert records[-1]["ratings"]["random"][2] == 4 * len(versions)  # random's games carry over between versions
    assert f"eval v{8:5d}  TrueSkill" in out.stdout
