"""jobs/vs_scripted.py end to end on a tiny budget: it trains, commits a checkpoint, evaluates against the scripted
bot, reloads the checkpoint from its HDF5 file and gets the same result, and records it all."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_rl.envs.scripted import scripted_bot_hash
from hpc_rl.storage import open_run

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(300)
def test_vs_scripted_trains_evaluates_and_reloads_to_the_same_result(tmp_path):
    cmd = [sys.executable, str(ROOT / "jobs/vs_scripted.py"), "--minutes", "0.1", "--eval-games", "6",
           "--progress-minutes", "0", "run_name=tiny", f"runs_dir={tmp_path}", "env.num_envs=4",
           "env.moba.time_limit=200"]  # games end by the time limit: a quick evaluation
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=280)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    report = json.loads((tmp_path / "tiny" / "vs_scripted.json").read_text())
    assert report["reload_matches"] and report["reloaded_version"] == report["version"] > 0
    final = report["final"]
    assert final["games"] == 6 and final["wins"] + final["draws"] + final["losses"] == 6
    assert report["bot_hash"] == final["bot_hash"] == scripted_bot_hash()
    assert report["train_cpu_seconds"] > 0 and report["env_steps"] >= report["version"] * 4 * 64
    run = open_run(tmp_path / "tiny")
    assert run.checkpoint_versions[-1] == report["version"]
    evaluations = run.evaluations_frame().set_index("source")  # the report's two evaluations as a table
    for source, result in (("vs_scripted", final), ("vs_scripted/reloaded", report["reloaded"])):
        row = evaluations.loc[source]
        assert (row.version, row.games, row.wins, row.draws) == (report["version"], 6, result["wins"],
                                                                 result["draws"])
        assert [row.ci95_low, row.ci95_high] == result["win_rate_ci95"]
    assert "wins against the scripted bot" in out.stdout

    again = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert again.returncode != 0 and "exists: pick a new run_name" in again.stderr
