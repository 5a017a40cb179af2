"""`make figure6`: OpenAI Five's Figure 6 (reward horizon), a trained MOBA run resumed at several horizons on Slurm.

    python -m hpc_rl.horizon runs/<trained run> --horizons 45 90 180 360 720 --versions 500
    python -m hpc_rl.horizon runs/<trained run> --dry-run                  # what is finished, what would run
    python -m hpc_rl.horizon runs/<trained run> --rate-only --games 200    # rate the continuations again

OpenAI Five resumed a trained agent with different horizons H = T / (1 - gamma), T the game time of one step, and
rated each continuation against the agent at the point training was resumed. Here T is the run's
``env.step_seconds`` (2/15 s: the MOBA steps at Dota's 7.5 actions a second), so each horizon gives
gamma = 1 - T / H. The base run is read only: its latest good checkpoint (version B) is copied, with the opponent
pool's past versions, into one run directory per (horizon, seed) under ``<runs>/horizon/`` (meta.json's
``horizon_from`` names the base run, B, H and gamma), and the members are the Hydra multirun of
``conf/ablation/horizon.yaml`` (sweeping ``ppo.gamma.start``) driven as ``hpc_rl.reproduce`` drives Figure 5: each
member one Slurm array task through the submitit launcher, resuming its copy with the base run's own command line
(its preset and overrides) and the new gamma, to ``pipeline.max_versions`` = B + ``--versions``. Each resume
records in its ``config_changes.jsonl`` what differs from the base run's settings (gamma and the seed; anything
else is listed in the table). Finished members are skipped, started ones resume (a member made from another run or
version is refused: ``--version`` picks the base's); stop and resume as with ``make reproduce``.

Rating: ``--points`` checkpoints of each member, spread evenly over its versions after B (the committed checkpoint
nearest each), each play ``--games`` mirrored games (``hpc_rl.evaluation.play_match``: both sides, fixed
``--seed``, policies sampling as in training) against the frozen version B; draws count as losses, with 95% Wilson
intervals; seeds of one horizon pool their games at equal versions. Results are kept in ``<out>/figure6.json``
(a rerun plays only points not yet rated), and drawn in ``<out>/figure6.png`` (win rate against versions after the
resume, one line per horizon) and ``<out>/figure6.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from hpc_rl.reproduce import add_launcher_argument, finished_members, launch, read_panel
from hpc_rl.stats import wilson_interval
from hpc_rl.storage.run import command_overrides

PANEL = "horizon"  # conf/ablation/horizon.yaml
BASE = "base"  # the rating record of the frozen version against itself
HORIZONS_S = (45.0, 90.0, 180.0, 360.0, 720.0)  # the paper's Figure 6
# The base run's command-line settings each member sets itself (or the multirun does).
MEMBER_SET = ("run_name=", "runs_dir=", "experiment=", "pipeline.max_versions=", "pipeline.max_seconds=",
              "pipeline.max_run_seconds=", "seed=", "ppo.gamma", "hydra", "+", "~")


def gamma_for(horizon_s: float, step_seconds: float) -> float:
    """The discount whose horizon H = T / (1 - gamma) is ``horizon_s``, T = ``step_seconds`` of game time a step."""
    if step_seconds <= 0:
        raise ValueError(f"the game time per step must be > 0, got {step_seconds}")
    if horizon_s <= step_seconds:
        raise ValueError(f"a horizon must be longer than one step ({step_seconds:.4g} s), got {horizon_s} s")
    return 1.0 - step_seconds / horizon_s


def horizon_of(gamma: float, step_seconds: float) -> float:
    """H = T / (1 - gamma): the game time over which rewards count (OpenAI Five, section 4.5)."""
    return step_seconds / (1.0 - gamma)


def gamma_text(horizon_s: float, step_seconds: float) -> str:
    """``gamma_for`` as the sweep writes it: 8 decimals (H within 0.01% at 720 s), read back by Hydra as the same
    float, whose ``str`` names the member's directory."""
    return str(round(gamma_for(horizon_s, step_seconds), 8))


def member_name(gamma: str, seed: str | int) -> str:
    """A member's run directory name: ``run_name`` of conf/ablation/horizon.yaml."""
    return f"gamma{gamma}-seed{seed}"


def member_overrides(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """The base run's preset (``experiment=``) and the rest of its command line that members repeat: every
    ``key=value`` but what each member sets itself (its name, directory, budget, seed and gamma)."""
    experiment = next((a.partition("=")[2] for a in argv if a.startswith("experiment=")), None)
    return experiment, command_overrides(argv, MEMBER_SET)


def rating_versions(committed: Sequence[int], base: int, points: int) -> list[int]:
    """Up to ``points`` committed versions after ``base``, spread evenly: the one nearest each of base + k (last -
    base) / points, k = 1..points (the last committed version included), each once."""
    after = sorted(v for v in committed if v > base)
    if points < 1:
        raise ValueError(f"points must be >= 1, got {points}")
    if not after:
        return []
    span = after[-1] - base
    chosen = {min(after, key=lambda v: (abs(v - (base + k * span / points)), v)) for k in range(1, points + 1)}
    return sorted(chosen)


def prepare_member(base_dir: Path, version: int, out: Path, record: dict) -> Path:
    """``out`` as a run directory holding ``base_dir``'s checkpoint of ``version`` (and the opponent pool's past
    versions and qualities), its config under ``out``'s name, and meta.json's ``horizon_from`` = ``record``: what
    a surgery writes, without the change, for the member's job to resume."""
    from hpc_rl.evaluation import load_policy
    from hpc_rl.storage import load_checkpoint, open_run
    from hpc_rl.surgery import past_versions, write_run

    if out.exists():
        raise ValueError(f"{out} exists: a member starts as a new run directory")
    _, config, _ = load_policy(base_dir, version)
    run = open_run(base_dir)
    past = {v: load_checkpoint(path).sections for v, path in past_versions(base_dir, version).items()}
    return write_run(out, config, version, run.load_checkpoint(version).sections, past,
                     run.layout.pool if past else None, horizon_from=record)


def check_member(out: Path, base_dir: Path, version: int) -> None:
    """Refuse a member directory made from another run or version than the one this sitting resumes."""
    from hpc_rl.storage import open_run

    made = open_run(out).meta.get("horizon_from") or {}
    if (made.get("run_dir"), made.get("version")) != (str(base_dir), version):
        raise SystemExit(f"{out} was made from {made.get('run_dir', 'no base run')} at version "
                         f"{made.get('version')}, not {base_dir} at version {version}: pass --version "
                         f"{made.get('version')} to go on with it, or another --runs")


def pooled_rows(records: Sequence[dict], z: float = 1.96) -> list[dict]:
    """The members' rating records pooled by (horizon, versions after the resume), seeds together: games, wins,
    draws, the win rate (draws count as losses) and its Wilson interval, ordered by horizon then versions."""
    pooled: dict[tuple[float, int], dict] = {}
    for r in records:
        if r["member"] == BASE:
            continue
        row = pooled.setdefault((r["horizon_s"], r["after"]), {"horizon_s": r["horizon_s"], "gamma": r["gamma"],
                                                               "after": r["after"], "games": 0, "wins": 0, "draws": 0,
                                                               "members": 0})
        row["games"] += r["games"]
        row["wins"] += r["wins"]
        row["draws"] += r["draws"]
        row["members"] += 1
    for row in pooled.values():
        row["win_rate"] = row["wins"] / row["games"]
        row["ci95"] = list(wilson_interval(row["wins"], row["games"], z))
    return [pooled[key] for key in sorted(pooled)]


def rate_members(base_dir: Path, base_version: int, sweep_dir: Path, members: Sequence[tuple[str, str]],
                 gammas: dict[str, float], args) -> list[dict]:
    """Each member's ``rating_versions`` against the frozen base version, one record per (member, version): the
    ones ``<out>/figure6.json`` holds for the same games, seed and base are reused, the rest played and added to it
    (records of other settings stay in the file)."""
    from hpc_rl.evaluation import load_policy, play_match
    from hpc_rl.storage import open_run
    from hpc_rl.storage.hdf5 import write_json_durably

    store = args.out / "figure6.json"
    kept = json.loads(store.read_text()) if store.is_file() else []
    same = {"base": str(base_dir), "base_version": base_version, "games_per_point": args.games, "seed": args.seed}
    matches = [all(r.get(k) == v for k, v in same.items()) for r in kept]
    known = {(r["member"], r["version"]): r for r, match in zip(kept, matches) if match}
    others = [r for r, match in zip(kept, matches) if not match]  # other games, seed or base: kept, not shown
    frozen = None

    def played(name: str, version: int, player_dir: Path, record: dict) -> dict:
        nonlocal frozen
        if (name, version) not in known:
            if frozen is None:
                frozen = load_policy(base_dir, base_version)[0]
            policy, config, _ = load_policy(player_dir, version)
            result = play_match(policy, frozen, config, args.games, args.seed)
            known[(name, version)] = {**same, **record, "member": name, "version": version,
                                      "after": version - base_version,
                                      **{k: result[k] for k in ("games", "wins", "draws", "losses", "win_rate")}}
            args.out.mkdir(parents=True, exist_ok=True)
            ours = sorted(known.values(), key=lambda r: (r["member"], r["version"]))
            write_json_durably(store, others + ours)  # replaced whole: a stopped rating loses no earlier point
        found = known[(name, version)]
        print(f"{name} v{version} (+{found['after']}) vs v{base_version}: {found['wins']}/{found['games']} wins, "
              f"{found['draws']} draws", flush=True)
        return found

    # The frozen version against itself: where no change of the policy would put a line (half the decided games).
    records = [played(BASE, base_version, base_dir, {"horizon_s": None, "gamma": None, "changes": []})]
    for gamma, seed in members:
        name = member_name(gamma, seed)
        run_dir = sweep_dir / name
        versions = rating_versions(open_run(run_dir).checkpoint_versions, base_version, args.points) \
            if run_dir.is_dir() else []
        if not versions:
            print(f"{name}: no checkpoint after version {base_version} to rate", flush=True)
        changes = [c["key"] for c in open_run(run_dir).config_changes]
        records += [played(name, version, run_dir, {"horizon_s": gammas[gamma], "gamma": float(gamma),
                                                    "seed_run": seed, "changes": changes}) for version in versions]
    return records


def write_figure(records: Sequence[dict], out: Path, base: str) -> list[Path]:
    """figure6.png (win rate against versions after the resume, a line and its 95% band per horizon) and
    figure6.md (the pooled rows, and what each member's resume changed)."""
    from hpc_rl.study import Output, fmt, markdown_table, pyplot

    from matplotlib.ticker import MaxNLocator

    output = Output(out)
    rows = pooled_rows(records)
    reference = next((r for r in records if r["member"] == BASE), None)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for horizon in sorted({r["horizon_s"] for r in rows}):
        line = [r for r in rows if r["horizon_s"] == horizon]
        x = [r["after"] for r in line]
        drawn = ax.plot(x, [r["win_rate"] for r in line], marker="o",
                        label=f"H = {horizon:g} s (γ = {line[0]['gamma']})")
        ax.fill_between(x, [r["ci95"][0] for r in line], [r["ci95"][1] for r in line], color=drawn[0].get_color(),
                        alpha=0.15)
    if reference is not None:
        ax.axhline(reference["win_rate"], color="grey", linestyle=":", linewidth=1,
                   label=f"the base against itself ({reference['draws']} draws in {reference['games']})")
    ax.set_ylim(0, 1)
    ax.set_xlim(left=0)  # the resume point, where every member is the base
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("versions after the resume")
    ax.set_ylabel(f"win rate against {base}")
    ax.set_title("Figure 6: resumed at several horizons (draws lose; 95% Wilson bands)", fontsize=10)
    if rows or reference:
        ax.legend(fontsize=8)
    output.figure("figure6.png", fig)
    table = markdown_table(
        ["horizon (s)", "gamma", "versions after resume", "members", "games", "wins", "draws", "win rate", "95% CI"],
        [[f"{r['horizon_s']:g}", r["gamma"], r["after"], r["members"], r["games"], r["wins"], r["draws"],
          fmt(r["win_rate"]), f"[{fmt(r['ci95'][0])}, {fmt(r['ci95'][1])}]"] for r in rows])
    if reference is not None:
        low, high = wilson_interval(reference["wins"], reference["games"])
        table += (f"\nThe base against itself (the level of no change; draws lose): {reference['wins']}/"
                  f"{reference['games']} wins, {reference['draws']} draws, win rate {fmt(reference['win_rate'])} "
                  f"[{fmt(low)}, {fmt(high)}].\n")
    changes = sorted({(r["member"], ", ".join(r["changes"]) or "(none)") for r in records if r["member"] != BASE})
    table += "\nSettings each member's resume changed from the base run's (config_changes.jsonl):\n\n" + \
        markdown_table(["member", "changed on resume"], changes)
    output.table("figure6.md", f"Figure 6: win rate against {base}", table)
    return output.written


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("base", type=Path, help="the trained MOBA run directory to resume (read only)")
    p.add_argument("--runs", type=Path, default=Path("runs/figure6"),
                   help="the members' runs go into <runs>/horizon/ (default runs/figure6)")
    p.add_argument("--version", type=int, help="the base run's version to resume (default: its latest good "
                   "checkpoint)")
    p.add_argument("--horizons", type=float, nargs="+", default=list(HORIZONS_S),
                   help="horizons H in seconds of game time (default 45 90 180 360 720)")
    p.add_argument("--versions", type=int, default=500, help="versions each member trains after the resume point "
                   "(default 500)")
    p.add_argument("--seeds", nargs="+", help="seeds of every horizon (default: conf/ablation/horizon.yaml's, 3)")
    p.add_argument("--parallel", type=int, default=1, help="members running at once (Slurm array parallelism)")
    p.add_argument("--experiment", help="the members' preset, conf/experiment/<name>.yaml (default: the base run's "
                   "experiment= in its meta.json argv)")
    p.add_argument("--ranks", type=int, help="MPI ranks per member (default: the base run's world size)")
    p.add_argument("--games", type=int, default=100, help="games per rated checkpoint, even (default 100)")
    p.add_argument("--points", type=int, default=5, help="rated checkpoints per member (default 5)")
    p.add_argument("--seed", type=int, default=0, help="seed of the rating games (default 0)")
    p.add_argument("--out", type=Path, default=Path("docs/figures/figure6"), help="figure6.png, .md and .json")
    add_launcher_argument(p)
    p.add_argument("--dry-run", action="store_true", help="print the multirun, prepare and launch nothing")
    p.add_argument("--rate-only", action="store_true", help="launch nothing: rate the members' checkpoints so far")
    p.add_argument("overrides", nargs="*", help="further config overrides for every member (key=value)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_intermixed_args(argv)  # overrides before or after the options
    if min(args.versions, args.parallel, args.points) < 1 or args.games < 2 or args.games % 2:
        raise SystemExit("--versions, --parallel and --points must be >= 1, --games even and >= 2")
    from hpc_rl.launch import set_torch_threads

    set_torch_threads()  # the driver rates on the login node beside running jobs: one thread
    from hpc_rl.evaluation import load_policy
    from hpc_rl.storage import open_run

    args.base, args.runs = args.base.resolve(), args.runs.resolve()  # the multirun runs in the checkout's root
    try:
        _, config, base_version = load_policy(args.base, args.version)
    except FileNotFoundError as err:
        raise SystemExit(f"{args.base}: {err}") from None
    if not config.env.is_moba:
        raise SystemExit(f"{args.base} trains {config.env.name}: Figure 6 rates MOBA runs against their own past")
    meta = open_run(args.base).meta
    experiment, base_overrides = member_overrides(meta.get("argv", [])[1:])
    args.experiment = args.experiment or experiment
    args.overrides = [*base_overrides, *args.overrides]
    args.ranks = args.ranks or meta.get("world_size")
    if not args.ranks:
        raise SystemExit(f"--ranks: {args.base}/meta.json has no world_size")
    step = config.env.step_seconds
    try:
        gammas = {gamma_text(h, step): h for h in args.horizons}
    except ValueError as err:
        raise SystemExit(f"--horizons: {err}") from None
    panel = read_panel(PANEL)
    panel = replace(panel, values=tuple(gammas), seeds=tuple(args.seeds) if args.seeds else panel.seeds,
                    versions=base_version + args.versions, ranks=args.ranks)
    sweep_dir = args.runs / PANEL
    print(f"{args.base} at version {base_version} (gamma {config.ppo.gamma}, horizon "
          f"{horizon_of(config.ppo.gamma(base_version), step):.1f} s; T = {step:.4g} s a step): "
          + ", ".join(f"H {h:g} s -> gamma {g}" for g, h in gammas.items()), flush=True)
    if not args.rate_only:
        done = {PANEL: finished_members(panel, sweep_dir)}
        print(f"{len(panel.members)} members: {len(done[PANEL])} finished (skipped), "
              f"{len(panel.members) - len(done[PANEL])} to run, {args.parallel} at a time", flush=True)
        for gamma, seed in panel.members:
            out = sweep_dir / member_name(gamma, seed)
            if out.exists():
                check_member(out, args.base, base_version)
            if (gamma, seed) in done[PANEL] or out.exists() or args.dry_run:
                continue
            prepare_member(args.base, base_version, out, {
                "run_dir": str(args.base), "version": base_version, "horizon_s": gammas[gamma],
                "step_seconds": step, "gamma": float(gamma)})
            print(f"prepared {out} from version {base_version}", flush=True)
        code = launch([panel], done, len(panel.members), args)
        if code or args.dry_run:
            return code
    records = rate_members(args.base, base_version, sweep_dir, panel.members, gammas, args)
    write_figure(records, args.out, f"{args.base.name} at version {base_version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
