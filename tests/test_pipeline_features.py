"""Pipeline features with real ranks: the opponent pool (past versions play a share of the self-play games, their
steps are never trained on, the pool is persisted in pool.h5 and survives a resume), float16 observations on the
wire, and the asynchronous action offset."""

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from hpc_rl.config import build_config
from hpc_rl.data.batch import SegmentSchema
from hpc_rl.envs.moba_config import MobaConfig
from hpc_rl.envs.scripted import scripted_bot_hash
from hpc_rl.evaluation import FINAL_EVAL_SEED
from hpc_rl.launch import mpirun_command, rank_env
from hpc_rl.roles.protocol import request_layout
from hpc_rl.stats import wilson_interval
from hpc_rl.storage import open_run

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.timeout(600)]

# MOBA 1v1, every copy self-play, half the games against past versions; games end at 48 steps (draws) so that many
# games start and end within a few versions; every 4th version joins the pool. The first two versions play a
# curriculum's warm-up on a smaller map (the controller ends it on every env rank). Observations travel as float16.
LEAGUE = ["env.num_envs=4", "transport.fp16_observations=true", "env.vs_scripted_fraction=0", "env.moba.time_limit=48", "league.past_fraction=0.5",
          "env.warmup_versions=2", "env.warmup_map_size=32",
          "pipeline.segment_len=32", "pipeline.segments_per_batch=1", "pipeline.checkpoint_every=2",
          "pipeline.keep_every=4", "pipeline.keep_last=1", "ppo.num_minibatches=2", "pipeline.final_eval_games=4"]
AGENT_STEPS = 32 * 4 * 2  # one segment: steps x copies x agents, all trained on when no past version plays


def _train(runs: Path, versions: int, options: list[str] = LEAGUE, name: str = "league") -> subprocess.CompletedProcess:
    cmd = mpirun_command(6, [str(ROOT / "jobs/train.py"), f"run_name={name}", f"runs_dir={runs}", *options,
                             f"pipeline.max_versions={versions}"])
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=runs, env=rank_env(), timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def test_past_versions_play_and_are_not_trained_on_and_the_pool_survives_a_resume(tmp_path):
    out = _train(tmp_path, 16)
    _check_summary(tmp_path / "league", out.stdout)
    assert "version 2: the warm-up is over" in (tmp_path / "league/logs/rank_0.log").read_text()
    run = open_run(tmp_path / "league")
    assert run.pool["version"] == [4, 8, 12, 16]  # every keep_every-th committed version joined
    assert set(run.pool["version"]) <= set(run.checkpoint_versions)  # retention keeps them loadable
    m = run.metrics
    size = dict(zip(m["league/pool_size"]["version"], m["league/pool_size"]["value"]))
    assert size[1] == 0 and size[16] == 3  # version 16 joins with the final checkpoint, after the last metrics
    games = m["league/games_vs_past"]
    assert games["value"].sum() > 0 and games["version"].min() > 4  # only once version 4 was in the pool
    assert np.all(m["league/score_vs_past"]["value"] == 0.5)  # every game hit the time limit: a draw
    # Learner 0's batch is one segment: all its agent steps are trained on until a past version plays one side.
    samples = dict(zip(m["perf/samples"]["version"], m["perf/samples"]["value"]))
    assert all(samples[v] == AGENT_STEPS for v in range(1, 5))
    assert min(samples[v] for v in range(6, 17)) < AGENT_STEPS
    assert all(samples[v] <= AGENT_STEPS for v in samples)

    _check_fp16_bytes(run)

    out = _train(tmp_path, 20)  # resumes from version 16
    assert "resuming" in out.stdout
    assert "opponent pool: 4 past versions from pool.h5" in (tmp_path / "league/logs/rank_0.log").read_text()
    assert open_run(tmp_path / "league").pool["version"] == [4, 8, 12, 16, 20]


def _check_fp16_bytes(run) -> None:
    """The transport's byte counters: every step request carried the observations at float16's size, about half
    their float32 size (the masks stay bool), and so did every segment."""
    m, spec, copies = run.metrics, MobaConfig().spec(), 4
    observations = spec.observation_shapes(copies)
    half, full = (request_layout(spec, copies, fp16).wire_nbytes(observations) for fp16 in (True, False))
    assert 0.5 < half / full < 0.53
    # Env ranks count a request per step, in the heartbeat that counts the step: the series divide exactly.
    steps = m["perf/env_steps"]["value"] / copies
    assert steps[-1] > 0 and np.array_equal(m["transport/request_observation_bytes"]["value"], steps * half)
    assert np.all(m["transport/request_bytes"]["value"] == steps * request_layout(spec, copies, True).nbytes)
    schema = SegmentSchema.of_run(build_config(run.config), spec)
    assert schema.fp16_observations
    names = [f"obs/{k}" for k in observations]
    per_segment = schema.layout.wire_nbytes(names)
    segments = m["transport/segment_bytes"]["value"] / schema.layout.nbytes
    assert segments[-1] > 0 and np.array_equal(m["transport/segment_observation_bytes"]["value"],
                                                 segments * per_segment)
    full_schema = SegmentSchema(spec, schema.num_agents, schema.segment_len, schema.chunk_len, schema.lstm_size)
    assert 0.5 < per_segment / full_schema.layout.wire_nbytes(names) < 0.53


def _check_summary(run_dir: Path, stdout: str) -> None:
    """The job's end: the final evaluation of version 16 against the scripted bot (4 games, both sides), printed
    and in summary.json with where the files are and the next commands. No copy has the bot in training, so the
    progress lines show no win rate against it."""
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["state"] == "finished" and summary["version"] == 16, summary
    device = "cuda:0" if torch.cuda.is_available() else "cpu"  # pipeline.*_device=auto: the rank's GPU where any
    assert summary["devices"] == {"inference": [device], "learner": [device, device]}, summary["devices"]
    final = summary["final_eval"]
    assert (final["games"], final["bot"], final["bot_hash"], final["seed"]) == (4, "scripted", scripted_bot_hash(),
                                                                                FINAL_EVAL_SEED), final
    assert final["win_rate"] == final["wins"] / 4 and final["ci95"] == list(wilson_interval(final["wins"], 4))
    assert final["draws"] == 4 - final["wins"]  # 48-step games: nobody loses a tower before the time limit
    files = summary["files"]
    assert files["run_dir"] == str(run_dir.resolve()) and files["last_checkpoint"].endswith("v000016.h5")
    assert all(Path(files[k]).exists() for k in ("last_checkpoint", "metrics", "tensorboard", "logs", "summary"))
    assert any("jobs/evaluate.py" in c for c in summary["next"]) and any("hpc_rl.envs.render --run" in c
                                                                           for c in summary["next"])
    resume = summary["next"][-1]
    assert "-m hpc_rl.launch 6 " in resume and "# resume" in resume, resume
    assert "run_name=league" in resume and "league.past_fraction=0.5" in resume, resume
    assert "== run league finished at version 16" in stdout and "final evaluation: win rate" in stdout, stdout
    assert "ranks: 0 controller, 1-2 env, 3 inference, 4-5 learner" in stdout, stdout
    assert "v   16  " in stdout and "win vs scripted" not in stdout, stdout


def test_async_action_offset_keeps_exactly_once(tmp_path):
    _train(tmp_path, 6, ["env=cartpole", "env.num_envs=4", "pipeline.segment_len=32", "pipeline.segments_per_batch=2",
                         "ppo.num_minibatches=2", "pipeline.async_actions=true"], name="offset")
    acc = json.loads((tmp_path / "offset" / "accounting.json").read_text())
    produced, consumed, left = ({tuple(x) for x in acc[k]} for k in ("produced", "consumed", "left"))
    assert acc["version"] == 6 and len(consumed) == 6 * 2 * 2
    assert consumed | left == produced and not consumed & left
    run = open_run(tmp_path / "offset")
    assert run.config["pipeline"]["async_actions"] is True
    assert run.metrics["perf/env_steps"]["value"][-1] > 0


def test_a_rank_that_raises_aborts_the_job_without_mpi4py_main(tmp_path):
    """Under submitit (Hydra sweeps) no ``python -m mpi4py`` aborts the job when a rank raises; run() must."""
    (tmp_path / "broken" / "config.yaml").mkdir(parents=True)  # the controller cannot write its config there
    cmd = mpirun_command(6, [str(ROOT / "tests/mpi_programs/controller_raises.py"), str(tmp_path)])
    cmd.remove("-m"), cmd.remove("mpi4py")
    # A hang (no abort) fails by the timeout; mpirun's own abort banner is not asserted: Open MPI sometimes loses
    # it ("Data unpack would read past end of buffer" in show_help) when several ranks are torn down at once.
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=rank_env(), timeout=240)
    assert out.returncode != 0, out.stdout + out.stderr
    assert "IsADirectoryError" in out.stderr, out.stderr
