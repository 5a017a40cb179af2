"""`make figure6`'s driver (hpc_rl/horizon.py): gamma from the horizon, the members' names and overrides, the rated
versions and the pooled rows in-process; a member prepared from a real checkpoint; and, on the local Slurm cluster,
a tiny MOBA run resumed at two horizons, rated against itself and resumed again with nothing left to run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hpc_rl.horizon import (BASE, HORIZONS_S, gamma_for, gamma_text, horizon_of, member_name, member_overrides,
                            pooled_rows, prepare_member, rating_versions, write_figure)
from hpc_rl.launch import rank_env
from hpc_rl.reproduce import read_panel
from hpc_rl.storage import open_run

ROOT = Path(__file__).resolve().parent.parent
MOBA_STEP_S = 2 / 15  # the MOBA's env.step_seconds: Dota's 7.5 actions a second


def test_gamma_gives_the_horizon_back():
    assert gamma_for(180, MOBA_STEP_S) == pytest.approx(1 - MOBA_STEP_S / 180)
    for horizon in HORIZONS_S:
        assert horizon_of(float(gamma_text(horizon, MOBA_STEP_S)), MOBA_STEP_S) == pytest.approx(horizon, rel=1e-4)
    assert horizon_of(0.995, MOBA_STEP_S) == pytest.approx(26.67, abs=0.01)
    with pytest.raises(ValueError, match="longer than one step"):
        gamma_for(0.1, MOBA_STEP_S)
    with pytest.raises(ValueError, match="per step must be > 0"):
        gamma_for(45, 0)


def test_the_ablation_config_sweeps_the_papers_horizons():
    """conf/ablation/horizon.yaml's own values (a sweep run without the driver) are the driver's defaults."""
    panel = read_panel("horizon")
    assert panel.key == "ppo.gamma.start"
    assert panel.values == tuple(gamma_text(h, MOBA_STEP_S) for h in HORIZONS_S)
    assert member_name("0.99925926", 3) == "gamma0.99925926-seed3"


def test_members_repeat_the_base_command_line_but_what_they_set():
    argv = ["run_name=c60", "runs_dir=/tmp/r", "experiment=moba_kickstart", "pipeline.max_versions=100000",
            "pipeline.max_seconds=3600", "seed=4", "ppo.gamma=0.99", "ppo.gamma.start=0.99", "hydra.run.dir=x",
            "+extra=1", "-m", "topology.env=3", "ppo.lr=1e-4"]
    assert member_overrides(argv) == ("moba_kickstart", ["topology.env=3", "ppo.lr=1e-4"])
    assert member_overrides(["jobs/train.py"]) == (None, [])


def test_rating_versions_spread_over_the_continuation():
    committed = [2003, 2050, 2100, 2150, 2200, 2250, 2300, 2350, 2400, 2450, 2480, 2490, 2500, 2503]
    assert rating_versions(committed, 2003, 5) == [2100, 2200, 2300, 2400, 2503]
    assert rating_versions(committed, 2003, 1) == [2503]
    assert rating_versions([1, 2, 3], 1, 5) == [2, 3]  # fewer checkpoints than points: each once
    assert rating_versions([1, 2], 2, 3) == []
    with pytest.raises(ValueError, match="points"):
        rating_versions(committed, 2003, 0)


def _record(member, horizon, after, wins, draws, games=10):
    return {"member": member, "horizon_s": horizon, "gamma": None if horizon is None else gamma_for(horizon, 0.1),
            "after": after, "version": 100 + after, "games": games, "wins": wins, "draws": draws,
            "win_rate": wins / games, "changes": ["ppo.gamma"]}


def test_pooled_rows_sum_the_seeds_of_a_horizon_and_leave_the_base_out(tmp_path):
    records = [_record(BASE, None, 0, 4, 2), _record("a-seed0", 90, 10, 6, 1), _record("a-seed1", 90, 10, 2, 3),
               _record("a-seed0", 90, 20, 7, 0), _record("b-seed0", 45, 10, 3, 0)]
    rows = pooled_rows(records)
    assert [(r["horizon_s"], r["after"], r["games"], r["wins"], r["draws"], r["members"]) for r in rows] == \
        [(45, 10, 10, 3, 0, 1), (90, 10, 20, 8, 4, 2), (90, 20, 10, 7, 0, 1)]
    assert rows[1]["win_rate"] == 0.4 and rows[1]["ci95"][0] < 0.4 < rows[1]["ci95"][1]
    written = write_figure(records, tmp_path / "out", "base at version 100")
    assert sorted(p.name for p in written) == ["figure6.md", "figure6.png"]
    table = (tmp_path / "out" / "figure6.md").read_text()
    assert "| 90          |" in table and "4/10 wins, 2 draws" in table and "| a-seed1 | ppo.gamma" in table


def test_a_member_starts_from_the_base_runs_checkpoint(tmp_path):
    from small_moba import tiny_run

    base = tiny_run(tmp_path / "base", versions=(2, 4))
    out = prepare_member(base, 2, tmp_path / "sweep" / "gamma0.99-seed0", {"run_dir": str(base), "version": 2})
    member = open_run(out)
    assert member.checkpoint_versions == [2]
    for name, value in open_run(base).load_checkpoint(2).sections["params"].items():
        np.testing.assert_array_equal(member.load_checkpoint().sections["params"][name], value)
    assert member.config["run_name"] == "gamma0.99-seed0" and member.meta["horizon_from"]["version"] == 2
    with pytest.raises(ValueError, match="exists"):
        prepare_member(base, 2, out, {})


def test_members_of_another_base_version_are_refused(tmp_path, capsys):
    from small_moba import tiny_run

    from hpc_rl.horizon import main

    base = tiny_run(tmp_path / "base", versions=(2, 4))
    runs = tmp_path / "figure6"
    prepare_member(base, 2, runs / "horizon" / member_name(gamma_text(45, MOBA_STEP_S), 3),
                   {"run_dir": str(base), "version": 2})
    command = [str(base), "--runs", str(runs), "--horizons", "45", "90", "--ranks", "5", "--dry-run"]
    with pytest.raises(SystemExit, match="at version 2, not .* at version 4: pass --version 2"):
        main(command)  # the base's latest good checkpoint is version 4 now
    assert main([*command, "--version", "2"]) == 0
    out = capsys.readouterr().out
    assert "0 finished (skipped), 2 to run" in out and "ppo.gamma.start=0.99703704,0.99851852 seed=3" in out


# A MOBA run small enough to resume and rate in seconds: short games, a tiny network, 5 ranks (one learner).
TINY = ["topology=local_one_learner", "env.num_envs=2", "env.vs_scripted_fraction=1.0", "env.moba.time_limit=200",
        "model.lstm_size=16", "model.embed_size=8", "pipeline.segment_len=16", "pipeline.segments_per_batch=1",
        "ppo.num_minibatches=1", "pipeline.checkpoint_every=1", "pipeline.final_eval_games=0"]


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_figure6_resumes_a_run_at_two_horizons_on_slurm_and_rates_it(slurm_cluster, tmp_path):
    from hydra import compose, initialize_config_dir

    from hpc_rl.config import build_config, register
    from hpc_rl.runner import SerialRunner

    register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[*TINY, "run_name=base", f"runs_dir={tmp_path}",
                                                      "pipeline.max_versions=2"])
    SerialRunner(build_config(cfg)).run()
    runs, out = tmp_path / "figure6", tmp_path / "out"
    command = [sys.executable, "-m", "hpc_rl.horizon", str(tmp_path / "base"), "--runs", str(runs), "--horizons",
               "45", "720", "--versions", "2", "--points", "2", "--games", "4", "--ranks", "5", "--parallel", "2",
               "--out", str(out), *TINY]
    first = subprocess.run(command, cwd=ROOT, env=rank_env(), capture_output=True, text=True, timeout=240)
    assert first.returncode == 0, first.stdout + first.stderr
    for horizon in (45, 720):
        member = open_run(runs / "horizon" / member_name(gamma_text(horizon, MOBA_STEP_S), 3))
        assert member.summary["state"] == "finished" and member.summary["version"] == 4
        # The resume recorded what differs from the base run's settings: gamma, the seed, and the one-process
        # base's own topology and transport (SerialRunner's) against the MPI job's.
        changes = {c["key"]: c for c in member.config_changes}
        assert sorted(changes) == ["ppo.gamma", "seed", "topology.env", "transport.backend"]
        change = changes["ppo.gamma"]
        assert (change["version"], change["old"]["start"]) == (2, 0.995)
        assert change["new"]["start"] == pytest.approx(gamma_for(horizon, MOBA_STEP_S), abs=1e-8)
        assert member.meta["horizon_from"]["horizon_s"] == horizon and member.meta["resumed_from"] == 2
    records = json.loads((out / "figure6.json").read_text())
    members = [member_name(gamma_text(h, MOBA_STEP_S), 3) for h in (45, 720)]
    assert sorted((r["member"], r["version"], r["games"]) for r in records) == \
        [(BASE, 2, 4)] + [(name, v, 4) for name in members for v in (3, 4)]
    assert (out / "figure6.png").stat().st_size > 0 and "| 720 " in (out / "figure6.md").read_text()
    # A second sitting finds every member finished and every point rated: it launches and plays nothing.
    again = subprocess.run(command, cwd=ROOT, env=rank_env(), capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "2 finished (skipped), 0 to run" in again.stdout and "$ " not in again.stdout
    assert json.loads((out / "figure6.json").read_text()) == records
