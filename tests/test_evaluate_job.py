"""jobs/evaluate.py over a run's checkpoints (evaluations.jsonl) and analysis/win_rate.py --checkpoints reading them,
on a tiny MOBA run trained by the serial runner."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hpc_rl.algo.config import PPOConfig
from hpc_rl.config import EnvConfig, PipelineConfig, TrainConfig
from hpc_rl.envs.moba_config import MobaConfig
from hpc_rl.model.config import ModelConfig
from hpc_rl.runner import SerialRunner
from hpc_rl.stats import wilson_interval
from hpc_rl.storage import open_run
from test_analysis import table

ROOT = Path(__file__).resolve().parent.parent


def evaluate_job():
    spec = importlib.util.spec_from_file_location("evaluate_job", ROOT / "jobs" / "evaluate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("evaluate")
    SerialRunner(TrainConfig(
        run_name="tiny", runs_dir=str(root), seed=3,
        env=EnvConfig(num_envs=4, vs_scripted_fraction=0.5, moba=MobaConfig(time_limit=12)),
        model=ModelConfig(core="lstm", lstm_size=16, embed_size=8), ppo=PPOConfig(epochs=1, num_minibatches=2),
        pipeline=PipelineConfig(segment_len=16, segments_per_batch=1, max_versions=3, checkpoint_every=1,
                                keep_every=1, final_eval_games=0))).run()
    return root / "tiny"


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "evaluations.jsonl").read_text().splitlines() if line != "{not json"]


@pytest.mark.timeout(120)
def test_every_checkpoint_is_evaluated_once_and_win_rate_draws_the_curve(run, tmp_path, capsys):
    job = evaluate_job()
    assert job.main([str(run), "--games", "4", "--seed", "5", "--version", "all"]) == 0
    played = records(run)
    assert [r["version"] for r in played] == [1, 2, 3]
    assert all(r["games"] == 4 and r["seed"] == 5 and r["result"]["games"] == 4 for r in played)
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [p["wins"] for p in printed] == [r["result"]["wins"] for r in played]

    # Asked again, the recorded games are printed, not played: nothing is appended. Another seed is played.
    assert job.main([str(run), "--games", "4", "--seed", "5", "--version", "3", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("(recorded ") == 2 and len(records(run)) == 3
    assert job.main([str(run), "--games", "4", "--seed", "6", "--version", "3"]) == 0
    assert "(recorded " not in capsys.readouterr().out
    played = records(run)
    assert [(r["version"], r["seed"]) for r in played] == [(1, 5), (2, 5), (3, 5), (3, 6)]
    # A record against another scripted bot does not count: the version is played again.
    stale = dict(played[0], result=dict(played[0]["result"], bot_hash="0" * 64))
    (run / "evaluations.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [stale, *played[1:]]) + "{not json\n")
    assert job.main([str(run), "--games", "4", "--seed", "5", "--version", "1"]) == 0
    assert "(recorded " not in capsys.readouterr().out
    assert records_of_current_bot(run) == {(1, 5), (2, 5), (3, 5), (3, 6)}
    # The run's reader skips the broken line and lists every record in its table of evaluations.
    frame = open_run(run).evaluations_frame()
    mine = frame[frame["source"] == "evaluate"]
    assert len(open_run(run).evaluations) == 5 and mine["version"].tolist() == [1, 2, 3, 3, 1]
    assert mine["wins"].tolist() == [r["result"]["wins"] for r in records(run)]

    # The curve: one row per checkpoint, the seeds of version 3 pooled; the stale record left out with a note.
    out = subprocess.run([sys.executable, str(ROOT / "analysis" / "win_rate.py"), str(run), "--checkpoints",
                          "--levels", "0", "--out", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "tiny: 1 evaluations against an earlier scripted bot left out" in out.stdout
    rows = table(tmp_path / "win_rate.md")
    current = [r for r in records(run) if r["result"]["bot_hash"] != "0" * 64]
    by_version: dict[int, list[int]] = {}
    for r in current:
        games, wins = by_version.setdefault(r["version"], [0, 0])
        by_version[r["version"]] = [games + r["result"]["games"], wins + r["result"]["wins"]]
    assert [(int(r["version"]), int(r["games"]), int(r["wins"])) for r in rows] == [
        (v, g, w) for v, (g, w) in sorted(by_version.items())]
    games, wins = by_version[3]
    assert float(rows[-1]["ci low"]) == pytest.approx(wilson_interval(wins, games, 1.96)[0], abs=1e-3)
    assert "each checkpoint's evaluations" in (tmp_path / "win_rate.md").read_text()
    level = table(tmp_path / "levels.md")[0]
    assert level["version"] == "1" and int(level["env steps"]) > 0  # level 0: the first checkpoint reaches it
    # Pooled over blocks of two versions: versions 1-2 and 3.
    subprocess.run([sys.executable, str(ROOT / "analysis" / "win_rate.py"), str(run), "--checkpoints", "--block",
                    "2", "--env-steps", "--out", str(tmp_path / "b")], check=True, capture_output=True, timeout=60)
    assert (tmp_path / "b" / "win_rate.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = table(tmp_path / "b" / "win_rate.md")
    assert [(int(r["version"]), int(r["games"])) for r in rows] == [(2, 8), (3, 8)]


def records_of_current_bot(run: Path) -> set[tuple[int, int]]:
    return {(r["version"], r["seed"]) for r in records(run) if r["result"]["bot_hash"] != "0" * 64}


def test_bad_requests_are_refused_naming_the_problem(run, tmp_path, capsys):
    job = evaluate_job()
    for argv, says in (([str(run), "--version", "99"], "has no checkpoint of version 99"),
                       ([str(run), "--version", "last"], "a version is a checkpoint's number or 'all'"),
                       ([str(run), "--games", "3"], "--games must be even"),
                       ([str(tmp_path / "nothing"), "--version", "all"], "no run directory at")):
        with pytest.raises(SystemExit) as stop:
            job.main(argv)
        assert stop.value.code == 2 and says in capsys.readouterr().err
