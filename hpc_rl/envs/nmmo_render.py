"""Replays of ``nmmo``: one world seen from above as an animated GIF, agents coloured by population.

    python -m hpc_rl.envs.nmmo_render --out replay/nmmo.gif [--agents 128] [--steps 300] [--every 2] [--seed 0] \
        [--populations 1]

The forager bot (``hpc_rl.envs.nmmo_bots``, attacking on ``--aggression`` of its ticks: 2% by default, as in the
benchmark) plays every agent of one copy from its first tick. Tiles are drawn in their material's colour (lava,
water, grass, eaten forest, forest, stone), each agent as a disc in its population's colour (``spec.agent_team``:
slot a is in population a mod ``--populations``) with a white ring while frozen; the caption counts the tick and the
living agents and, with populations, shows each one's colour. Frames share ``hpc_rl.envs.render.save_gif``'s palette.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from hpc_rl.envs.nmmo import GTICK, IFREEZE, IX, IY, NmmoEnv
from hpc_rl.envs.nmmo_bots import Forager
from hpc_rl.envs.nmmo_config import MATERIALS, NmmoConfig
from hpc_rl.envs.render import CAPTION_HEIGHT, caption, save_gif

MATERIAL_COLOURS = {"lava": (200, 70, 25), "water": (45, 95, 200), "grass": (120, 175, 80), "scrub": (165, 160, 95),
                    "forest": (30, 105, 45), "stone": (125, 125, 125)}
POPULATION_COLOURS = ((250, 225, 40), (230, 60, 200), (60, 220, 230), (255, 140, 30), (240, 240, 240),
                      (150, 90, 240), (255, 90, 90), (40, 40, 40))
_PALETTE = np.array([MATERIAL_COLOURS[m] for m in MATERIALS], dtype=np.uint8)


def draw_world(env: NmmoEnv, copy: int = 0, tile_pixels: int = 6) -> Image.Image:
    """The current state of ``copy``: tiles, and every living agent in its population's colour."""
    k = tile_pixels
    image = Image.fromarray(np.repeat(np.repeat(_PALETTE[env.tiles[copy]], k, axis=0), k, axis=1))
    draw = ImageDraw.Draw(image)
    population = np.asarray(env.spec.agent_team)
    for a in np.flatnonzero(env.alive[copy]):
        y, x = env.ai[copy, a, IY] * k, env.ai[copy, a, IX] * k
        colour = POPULATION_COLOURS[population[a] % len(POPULATION_COLOURS)]
        frozen = env.ai[copy, a, IFREEZE] > 0
        draw.ellipse((x, y, x + k - 1, y + k - 1), fill=colour, outline=(255, 255, 255) if frozen else (0, 0, 0))
    return image


def legend(image: Image.Image, populations: int, side: int = 5) -> Image.Image:
    """With populations, a swatch of each one's colour in the caption's top right corner, in population order. The
    GIF's palette is taken from the first frame, where few agents have spawned yet: the swatches keep every
    population's colour in it."""
    if populations > 1:
        draw = ImageDraw.Draw(image)
        for k in range(populations):
            x = image.width - (populations - k) * (side + 1) - 1
            y = image.height - CAPTION_HEIGHT + 3
            draw.rectangle((x, y, x + side - 1, y + side - 1), fill=POPULATION_COLOURS[k % len(POPULATION_COLOURS)])
    return image


def render_world(out: Path, config: NmmoConfig, steps: int, every: int, seed: int = 0, tile_pixels: int = 6,
                 aggression: float = 0.02) -> tuple[Path, int]:
    """Play ``steps`` ticks of one world with the forager and write every ``every``-th as a GIF frame: the GIF's path
    and its number of frames."""
    if steps < 1 or every < 1 or tile_pixels < 1:
        raise ValueError(f"steps, every and tile_pixels must be >= 1, got {steps}, {every}, {tile_pixels}")
    env = NmmoEnv(config, 1)
    bot = Forager(config, seed, aggression)
    obs = env.reset(seed)
    frames = []

    def frame() -> None:
        alive = int(env.alive.sum())
        frames.append(legend(caption(draw_world(env, 0, tile_pixels),
                                     [f"nmmo, seed {seed}: tick {env.gi[0, GTICK]}",
                                      f"{alive} of {config.num_agents} agents alive"]), config.populations))

    frame()
    for t in range(1, steps + 1):
        obs = env.step(bot.act(obs))[0]
        if t % every == 0:
            frame()
    comment = f"nmmo {config.num_agents} agents, forager (aggression {aggression}), seed {seed}, {steps} ticks"
    return save_gif(frames, out, comment=comment), len(frames)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m hpc_rl.envs.nmmo_render", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("replay/nmmo.gif"))
    parser.add_argument("--agents", type=int, default=NmmoConfig.num_agents, help="the spawn cap")
    parser.add_argument("--map-size", type=int, default=NmmoConfig.map_size)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=2, help="keep one frame every this many ticks")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tile-pixels", type=int, default=6)
    parser.add_argument("--aggression", type=float, default=0.02, help="the forager's chance to attack per tick")
    parser.add_argument("--populations", type=int, default=1, help="populations the agents are coloured by")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        config = NmmoConfig(num_agents=args.agents, map_size=args.map_size, populations=args.populations)
        path, frames = render_world(args.out, config, args.steps, args.every, args.seed, args.tile_pixels,
                                     args.aggression)
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    print(f"wrote {path} ({frames} frames, {path.stat().st_size / 1e6:.1f} MB, {time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
