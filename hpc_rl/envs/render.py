"""Replays people can look at: one ``moba`` game as PNG frames and an animated GIF.

    python -m hpc_rl.envs.render --out replay/ --bots scripted,random --every 10

Draws the map, lanes, towers, bases, creeps and heroes (team 0 blue, team 1 red) with HP bars, and darkens what the
chosen team does not see (its fog of war). Writes ``frame_00000.png`` ... and ``game.gif`` into ``--out``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from hpc_rl.envs.moba import HERO_TYPES, IALIVE, ISUB, ITEAM, UHP, UMAXHP, UVISION, UX, UY, MobaConfig, MobaEnv
from hpc_rl.envs.scripted import make_bot
from hpc_rl.play import play, team_agents

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


def render_game(out: Path, config: MobaConfig, bots: tuple[str, str], seed: int, steps: int, every: int,
                team: int = 0, pixels: int = 384) -> list[Path]:
    """Play one game (at most ``steps`` steps; ``bots`` are team 0's and team 1's) and write every ``every``-th frame
    and the GIF; return the PNG paths."""
    if steps < 1 or every < 1:
        raise ValueError(f"steps and every must be >= 1, got {steps}, {every}")
    if team not in (0, 1):
        raise ValueError(f"team must be 0 or 1, got {team}")
    out.mkdir(parents=True, exist_ok=True)
    env = MobaEnv(config, 1)
    players = [(make_bot(name, config, seed=seed + side), team_agents(env.spec, np.full(1, side)))
               for side, name in enumerate(bots)]
    frames = []

    def draw(t: int, finished: np.ndarray) -> None:
        if t % every == 0 and not finished[0]:  # once it has ended the env has started the next game: not drawn
            frames.append(draw_frame(env, team=team, pixels=pixels))

    play(env, players, seed, on_step=draw, max_steps=steps)
    paths = []
    for i, frame in enumerate(frames):
        paths.append(out / f"frame_{i:05d}.png")
        frame.save(paths[-1])
    frames[0].save(out / "game.gif", save_all=True, append_images=frames[1:], duration=80, loop=0)
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m hpc_rl.envs.render", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("replay"), help="directory for the frames and game.gif")
    parser.add_argument("--bots", default="scripted,random", help="team 0 and team 1 bots: random or scripted")
    parser.add_argument("--five", action="store_true", help="5v5 on three lanes instead of 1v1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=9000, help="stop after this many steps")
    parser.add_argument("--every", type=int, default=10, help="keep one frame every this many steps")
    parser.add_argument("--team", type=int, default=0, help="whose fog of war to draw")
    parser.add_argument("--pixels", type=int, default=384)
    args = parser.parse_args(argv)
    bots = tuple(args.bots.split(","))
    if len(bots) != 2:
        raise SystemExit(f"--bots needs two names separated by a comma, got {args.bots!r}")
    config = MobaConfig.five_v_five() if args.five else MobaConfig()
    paths = render_game(args.out, config, bots, args.seed, args.steps, args.every, args.team, args.pixels)
    print(f"wrote {len(paths)} frames and {args.out / 'game.gif'}")


if __name__ == "__main__":
    main()
