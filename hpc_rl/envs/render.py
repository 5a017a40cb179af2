"""Replays people can look at: one ``moba`` game as an animated GIF (and, for bot games, PNG frames).

    python -m hpc_rl.envs.render --run runs/my_run [--version 40] [--opponent scripted|random|v12] [--team 1]
    python -m hpc_rl.envs.render --out replay/ --bots scripted,random --every 10 [--five]

Draws the map, lanes, towers, bases, creeps and heroes (team 0 blue, team 1 red) with HP bars, and darkens what the
chosen team does not see (its fog of war). ``--run``: a run's checkpoint (the latest by default) plays team ``--team``
against a reference bot or a past version of the same run, on the run's own map, and ``<run>/replay.gif`` (or
``--out``) gets the game with a caption naming the run, the versions and the result. ``--bots``: two reference bots
play; ``frame_00000.png`` ... and ``game.gif`` go into ``--out``. The game is played by ``hpc_rl.play.play``.
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image, ImageDraw

from hpc_rl.envs.moba import HERO_TYPES, IALIVE, ISUB, ITEAM, UHP, UMAXHP, UVISION, UX, UY, MobaConfig, MobaEnv
from hpc_rl.envs.scripted import make_bot
from hpc_rl.play import NOT_FINISHED, Games, play, team_agents

if TYPE_CHECKING:
    from hpc_rl.actors import Actor  # imports torch, which bot games do without

TEAM_COLOURS = ((60, 110, 230), (220, 60, 50))
BACKGROUND = (70, 120, 60)
LANE = (150, 140, 110)


def fog_mask(env: MobaEnv, copy: int, team: int, pixels: int) -> np.ndarray:
    """(pixels, pixels) bool indexed [y, x] in map orientation: True where no living unit of ``team`` sees the cell."""
    scale = env.config.map_size / pixels
    centres = (np.arange(pixels) + 0.5) * scale
    gx, gy = np.meshgrid(centres, centres, indexing="xy")
    seen = np.zeros((pixels, pixels), dtype=bool)
    mine = (env.ui[copy, :, IALIVE] == 1) & (env.ui[copy, :, ITEAM] == team)
    for u in np.nonzero(mine)[0]:
        x, y, r = env.uf[copy, u, UX], env.uf[copy, u, UY], env.uf[copy, u, UVISION]
        seen |= (gx - x) ** 2 + (gy - y) ** 2 <= r * r
    return ~seen


def draw_frame(env: MobaEnv, copy: int = 0, team: int = 0, pixels: int = 384) -> Image.Image:
    """The current state of ``copy`` seen from above, with ``team``'s fog of war."""
    size = env.config.map_size
    k = pixels / size

    def px(x: float, y: float) -> tuple[float, float]:
        return x * k, pixels - y * k  # y grows upwards on the map

    image = Image.new("RGB", (pixels, pixels), BACKGROUND)
    draw = ImageDraw.Draw(image)
    for lane in env.layout.lane_waypoints:
        draw.line([px(*p) for p in lane], fill=LANE, width=max(2, int(2.5 * k)))
    uf, ui = env.uf[copy], env.ui[copy]
    kinds = ((env.base_slots, 2.2, "square"), (env.tower_slots, 1.3, "square"), (env.creep_slots, 0.45, "circle"),
             (env.hero_slots, 0.9, "circle"))
    for slots, radius, shape in kinds:
        for u in slots:
            if ui[u, IALIVE] == 0:
                continue
            x, y = px(uf[u, UX], uf[u, UY])
            r = radius * k
            colour = TEAM_COLOURS[ui[u, ITEAM]]
            box = (x - r, y - r, x + r, y + r)
            if shape == "square":
                draw.rectangle(box, fill=colour, outline=(20, 20, 20))
            else:
                draw.ellipse(box, fill=colour, outline=(255, 255, 255) if slots is env.hero_slots else None)
            if slots is env.hero_slots:
                draw.text((x - 3, y - 6), HERO_TYPES[ui[u, ISUB]][0].upper(), fill=(255, 255, 255))
            frac = max(0.0, uf[u, UHP] / uf[u, UMAXHP])
            bar = (x - r, y - r - 4, x + r, y - r - 2)
            draw.rectangle(bar, fill=(40, 40, 40))
            draw.rectangle((bar[0], bar[1], bar[0] + (bar[2] - bar[0]) * frac, bar[3]), fill=(80, 230, 80))
    fog = fog_mask(env, copy, team, pixels)[::-1]  # image rows run from the top of the map down
    pixels_rgb = np.asarray(image).astype(np.float32)
    pixels_rgb[fog] *= 0.45
    image = Image.fromarray(pixels_rgb.astype(np.uint8))
    ImageDraw.Draw(image).text((4, 4), f"step {env.gi[copy, 0]}  fog of team {team}", fill=(255, 255, 255))
    return image


def record(env: MobaEnv, players: Sequence[tuple[Actor, np.ndarray]], seed: int, every: int, team: int = 0,
           pixels: int = 384, max_steps: int | None = None) -> tuple[list[Image.Image], Games]:
    """Play one game in ``env`` (one copy) between ``players`` (``hpc_rl.play.play``'s actors and their agents) and
    draw every ``every``-th step of it, seen with ``team``'s fog of war: the frames and the game."""
    if env.num_envs != 1:
        raise ValueError(f"a replay records a one-copy env, got {env.num_envs} copies")
    if every < 1:
        raise ValueError(f"every must be >= 1, got {every}")
    if team not in (0, 1):
        raise ValueError(f"team must be 0 or 1, got {team}")
    frames = []

    def draw(t: int, finished: np.ndarray) -> None:
        if t % every == 0 and not finished[0]:  # once it has ended the env has started the next game: not drawn
            frames.append(draw_frame(env, team=team, pixels=pixels))

    games = play(env, players, seed, on_step=draw, max_steps=max_steps)
    return frames, games


def save_gif(frames: Sequence[Image.Image], path: Path, frame_ms: int = 80, last_ms: int = 2000,
             comment: str = "") -> Path:
    """An animated GIF of ``frames`` that holds the last one ``last_ms``. Every frame is mapped to one 64-colour palette
    taken from the first (the drawings have a few dozen colours): consecutive frames then differ only where units
    moved, which GIF stores as small patches."""
    palette = frames[0].quantize(colors=64, method=Image.Quantize.MEDIANCUT)
    images = [f.quantize(palette=palette, dither=Image.Dither.NONE) for f in frames]
    durations = [frame_ms] * (len(images) - 1) + [last_ms]
    path.parent.mkdir(parents=True, exist_ok=True)
    images[0].save(path, format="GIF", save_all=True, append_images=images[1:], duration=durations, loop=0,
                   optimize=False, comment=comment)
    return path


def render_game(out: Path, config: MobaConfig, bots: tuple[str, str], seed: int, steps: int, every: int,
                team: int = 0, pixels: int = 384) -> list[Path]:
    """Play one game (at most ``steps`` steps; ``bots`` are team 0's and team 1's) and write every ``every``-th frame
    and the GIF; return the PNG paths."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    out.mkdir(parents=True, exist_ok=True)
    env = MobaEnv(config, 1)
    players = [(make_bot(name, config, seed=seed + side), team_agents(env.spec, np.full(1, side)))
               for side, name in enumerate(bots)]
    frames, _ = record(env, players, seed, every, team, pixels, max_steps=steps)
    paths = []
    for i, frame in enumerate(frames):
        paths.append(out / f"frame_{i:05d}.png")
        frame.save(paths[-1])
    save_gif(frames, out / "game.gif", last_ms=80)
    return paths


# --- replays of a trained run -------------------------------------------------------------------------------------
REPLAY_EVERY = 10  # steps per frame: a 1v1 game of ~2,500 steps gives ~250 frames, 20 s at 80 ms a frame
CAPTION_HEIGHT = 30
BOTS = ("scripted", "random")


@dataclass(frozen=True)
class Replay:
    """A rendered game of a run's checkpoint: where the GIF is, who played, and how it ended."""

    path: Path
    version: int
    team: int  # the side the checkpoint played
    opponent: str  # "scripted", "random" or "v<N>"
    winner: int  # the winning team, -1 a draw at the time limit, ``NOT_FINISHED`` when stopped at ``max_steps``
    steps: int
    frames: int

    @property
    def result(self) -> str:
        """The game's end from the checkpoint's side, in words."""
        if self.winner == NOT_FINISHED:
            return f"not finished after {self.steps:,} steps"
        if self.winner == -1:
            return f"a draw at the time limit ({self.steps:,} steps)"
        return f"{'won' if self.winner == self.team else 'lost'} in {self.steps:,} steps"


def parse_opponent(opponent: str) -> str | int:
    """``"scripted"`` or ``"random"`` (a reference bot), or ``"v<N>"``: version N of the same run (returned as N)."""
    if opponent in BOTS:
        return opponent
    if match := re.fullmatch(r"v(\d+)", opponent):
        return int(match.group(1))
    raise ValueError(f"unknown opponent {opponent!r}: choose scripted, random or v<N> (a version of the run)")


def caption(image: Image.Image, lines: Sequence[str]) -> Image.Image:
    """``image`` with a dark strip below it holding ``lines``."""
    framed = Image.new("RGB", (image.width, image.height + CAPTION_HEIGHT), (25, 25, 25))
    framed.paste(image, (0, 0))
    draw = ImageDraw.Draw(framed)
    for i, line in enumerate(lines):
        draw.text((4, image.height + 3 + 13 * i), line, fill=(235, 235, 235))
    return framed


def render_run_replay(run_dir: str | Path, out: str | Path | None = None, opponent: str = "scripted",
                      version: int | None = None, team: int = 0, every: int = REPLAY_EVERY, seed: int = 0,
                      pixels: int = 384, max_steps: int | None = None) -> Replay:
    """Render one game of the run's checkpoint ``version`` (the latest good one by default) playing ``team`` against
    ``opponent`` (a reference bot, or ``"v<N>"``: version N of the same run) on the run's own map, to an animated GIF
    at ``out`` (default ``<run_dir>/replay.gif``). Policies sample their actions from torch's generator seeded with
    ``seed``, as in evaluation; the bot is seeded with ``seed + 1``. ``max_steps`` stops the game early."""
    import torch

    from hpc_rl.evaluation import load_policy, player_actor
    from hpc_rl.storage import open_run
    from hpc_rl.storage.layout import RunLayout

    if team not in (0, 1):
        raise ValueError(f"team must be 0 or 1, got {team}")
    rival = parse_opponent(opponent)
    env_name = open_run(run_dir).config.get("env", {}).get("name", "moba")  # read first: a Gym run fails fast
    if env_name != "moba":
        raise ValueError(f"replays render the MOBA only; {run_dir} trained {env_name}")
    policy, config, version = load_policy(run_dir, version)
    if isinstance(rival, int):
        rival = load_policy(run_dir, rival)[0]
    env = config.env.moba_env(config.env.moba, 1)  # the run's game version
    side = team_agents(env.spec, np.full(1, team))
    players = [(player_actor(policy, side, config, seed + 1, deterministic=False), side),
               (player_actor(rival, ~side, config, seed + 1, deterministic=False), ~side)]
    torch.manual_seed(seed)
    frames, games = record(env, players, seed, every, team, pixels, max_steps)
    colours = ("blue", "red")
    replay = Replay(Path(out) if out is not None else RunLayout(run_dir).replay, version, team, opponent,
                    int(games.winner[0]), int(games.length[0]), len(frames))
    title = f"{Path(run_dir).resolve().name} v{version} ({colours[team]}) vs {opponent} ({colours[1 - team]})"
    lines = (title, f"v{version} {replay.result}")
    save_gif([caption(f, lines) for f in frames], replay.path, comment=" - ".join(lines))
    return replay


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m hpc_rl.envs.render", description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, help="a run directory: its checkpoint plays (replaces --bots and --five)")
    parser.add_argument("--version", type=int, help="with --run: the checkpoint's version (default: the latest)")
    parser.add_argument("--opponent", default="scripted", help="with --run: scripted, random or v<N> (a version of "
                        "the same run)")
    parser.add_argument("--out", type=Path, help="--bots: directory for the frames and game.gif (default replay/); "
                        "--run: the GIF (default <run>/replay.gif)")
    parser.add_argument("--bots", default="scripted,random", help="team 0 and team 1 bots: random or scripted")
    parser.add_argument("--five", action="store_true", help="5v5 on three lanes instead of 1v1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, help="stop after this many steps (default: --run the game's end, "
                        "--bots 9000)")
    parser.add_argument("--every", type=int, default=REPLAY_EVERY, help="keep one frame every this many steps")
    parser.add_argument("--team", type=int, default=0, help="--run: the checkpoint's side; whose fog of war to draw")
    parser.add_argument("--pixels", type=int, default=384)
    args = parser.parse_args(argv)
    if args.run is not None:
        from hpc_rl.storage import CheckpointError

        start = time.perf_counter()
        try:
            replay = render_run_replay(args.run, args.out, args.opponent, args.version, args.team, args.every,
                                       args.seed, args.pixels, args.steps)
        except (FileNotFoundError, ValueError, CheckpointError) as err:
            raise SystemExit(f"error: {err}") from None
        print(f"wrote {replay.path} ({replay.frames} frames, {replay.path.stat().st_size / 1e6:.1f} MB, "
              f"{time.perf_counter() - start:.0f} s): v{replay.version} vs {replay.opponent}, {replay.result}")
        return
    bots = tuple(args.bots.split(","))
    if len(bots) != 2:
        raise SystemExit(f"--bots needs two names separated by a comma, got {args.bots!r}")
    config = MobaConfig.five_v_five() if args.five else MobaConfig()
    out = args.out or Path("replay")
    paths = render_game(out, config, bots, args.seed, args.steps or 9000, args.every, args.team, args.pixels)
    print(f"wrote {len(paths)} frames and {out / 'game.gif'}")


if __name__ == "__main__":
    main()
