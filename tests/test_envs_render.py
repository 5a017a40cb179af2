"""The replay renderer writes real PNG frames and an animated GIF of one game, fog included."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from hpc_rl.envs.moba import MobaConfig, MobaEnv
from hpc_rl.envs.render import draw_frame, fog_mask

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
