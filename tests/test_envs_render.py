"""The replay renderer writes real PNG frames and an animated GIF of one game, fog included; a run's checkpoint (a
real committed checkpoint file) plays against a bot or a past version of the same run."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hpc_rl.config import EnvConfig, to_yaml
from hpc_rl.envs.moba import MobaConfig, MobaEnv
from hpc_rl.envs.render import CAPTION_HEIGHT, draw_frame, fog_mask, main, render_run_replay
from hpc_rl.play import NOT_FINISHED
from hpc_rl.storage import write_meta
from hpc_rl.storage.layout import RunLayout

from small_moba import one_torch_thread, small_config, tiny_run  # noqa: F401 (a fixture)

pytestmark = pytest.mark.light  # runs in the base install tier (scripts/light_tier_check.sh)

ROOT = Path(__file__).resolve().parent.parent


def test_render_cli_writes_frames_and_gif(tmp_path):
    out = tmp_path / "replay"
    proc = subprocess.run([sys.executable, "-m", "hpc_rl.envs.render", "--out", str(out), "--steps", "300",
                           "--every", "50", "--pixels", "128"], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    frames = sorted(out.glob("frame_*.png"))
    assert len(frames) == 7  # the start and every 50th of 300 steps
    first, last = (np.asarray(Image.open(p)) for p in (frames[0], frames[-1]))
    assert first.shape == (128, 128, 3)
    assert not np.array_equal(first, last)  # units moved
    gif = Image.open(out / "game.gif")
    assert gif.n_frames == 7


def test_frame_darkens_what_the_team_does_not_see():
    env = MobaEnv(MobaConfig(), 1)
    env.reset(0)
    fog = fog_mask(env, 0, team=0, pixels=64)  # one cell per map unit, [y, x]
    assert not fog[4, 4]  # team 0's corner is seen
    assert fog[-4, -4]  # the enemy corner is not
    assert not fog_mask(env, 0, team=1, pixels=64)[-4, -4]  # ... which team 1 sees
    image = np.asarray(draw_frame(env, team=0, pixels=64)).astype(float)
    seen_grass, fogged_grass = image[64 - 12, 2], image[64 - 40, 50]  # map points (2, 12) and (50, 40)
    assert fogged_grass.sum() < 0.6 * seen_grass.sum()


def test_a_runs_latest_checkpoint_plays_the_scripted_bot_into_a_captioned_gif(tmp_path):
    run_dir = tiny_run(tmp_path / "demo", versions=(2, 4), time_limit=50)
    replay = render_run_replay(run_dir, max_steps=40, every=20, pixels=96)
    assert replay.path == RunLayout(run_dir).replay and (replay.version, replay.team, replay.opponent) == (4, 0,
                                                                                                          "scripted")
    assert (replay.winner, replay.steps, replay.frames) == (NOT_FINISHED, 40, 3)  # steps 0, 20 and 40
    gif = Image.open(replay.path)
    assert gif.n_frames == 3 and gif.size == (96, 96 + CAPTION_HEIGHT)
    assert gif.info["comment"].decode() == "demo v4 (blue) vs scripted (red) - v4 not finished after 40 steps"


def test_the_command_plays_a_chosen_version_against_a_past_one_to_the_end(tmp_path, capsys):
    run_dir = tiny_run(tmp_path / "demo", versions=(2, 4), time_limit=50)
    out = tmp_path / "old.gif"
    main(["--run", str(run_dir), "--version", "2", "--opponent", "v4", "--team", "1", "--every", "20",
          "--pixels", "96", "--out", str(out)])
    assert "v2 vs v4, a draw at the time limit (50 steps)" in capsys.readouterr().out
    gif = Image.open(out)
    assert gif.n_frames == 3  # steps 0, 20, 40: the game ended at 50
    assert gif.info["comment"].decode().startswith("demo v2 (red) vs v4 (blue)")
    assert not RunLayout(run_dir).replay.exists()


def test_replays_refuse_what_they_cannot_render(tmp_path):
    run_dir = tiny_run(tmp_path / "demo", versions=(2, 4), time_limit=50)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="is not a run directory"):
        render_run_replay(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match=r"no checkpoint of version 3 \(committed: 2, 4\)"):
        render_run_replay(run_dir, version=3)
    with pytest.raises(FileNotFoundError, match="no checkpoint of version 7"):
        render_run_replay(run_dir, opponent="v7")
    with pytest.raises(ValueError, match="unknown opponent 'champion'"):
        render_run_replay(run_dir, opponent="champion")
    gym = tmp_path / "cartpole"
    config = dataclasses.replace(small_config(50), env=EnvConfig(name="gym:CartPole-v1", vs_scripted_fraction=0.0))
    write_meta(gym, world_size=6)
    RunLayout(gym).config.write_text(to_yaml(config))
    with pytest.raises(ValueError, match="replays render the MOBA only; .* trained gym:CartPole-v1"):
        render_run_replay(gym)
    with pytest.raises(SystemExit, match="error: .*empty is not a run directory"):
        main(["--run", str(tmp_path / "empty")])
