"""Model surgery: a run's latest good checkpoint, widened or moved to a newer game version without changing what the
policy does, as a new run.

    python jobs/surgery.py runs/my_run --out runs/my_run_wide model.lstm_size=192
    python jobs/surgery.py runs/my_run --out runs/wide model.embed_size=96 model.lstm_size=192 --warmup-versions 20
    python jobs/surgery.py runs/my_run --out runs/my_run_v2 env.game_version=2

The new run directory holds the changed config, the checkpoint (same version, learner state carried over) and
meta.json's ``surgery_from`` (source run, version, changes); its opponent pool's past versions went through the same
surgery. The learning rate stays 0 for ``--warmup-versions`` versions (``ppo.lr_zero_until``) so that the optimiser
state reset for the changed parameters re-forms first. Prints the command that resumes it with jobs/train.py, and
last, a JSON line. What each change does: hpc_rl/model/surgery.py, docs/surgery.md.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _override_value(value) -> str:
    """A value as Hydra's override grammar reads it back."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_override_value(v) for v in value) + "]"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def _leaves(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def resume_overrides(config, source_argv: list[str], changes: dict[str, int]) -> list[str]:
    """jobs/train.py's overrides that compose ``config`` (so its config hash is the checkpoint's): the source run's
    command line (none if today's conf/ no longer composes it, e.g. a sweep's), the changes and the learning-rate
    hold, plus every field today's conf/ composes otherwise. Checked by composing them."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from hpc_rl import surgery
    from hpc_rl.config import build_config, register
    from hpc_rl.storage.run import command_overrides

    register()
    replaced = ("run_name=", "runs_dir=", "model.", "env.game_version=", "ppo.lr_zero_until=")
    ours = [*(f"{k}={v}" for k, v in changes.items()), f"ppo.lr_zero_until={config.ppo.lr_zero_until}",
            f"run_name={config.run_name}", f"runs_dir={config.runs_dir}"]
    keep = command_overrides(source_argv, replaced)
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        try:
            composed = build_config(compose(config_name="train", overrides=[*keep, *ours]))
        except (HydraException, OmegaConfBaseException, ValueError):
            keep = []
            composed = build_config(compose(config_name="train", overrides=ours))
        want, got = _leaves(asdict(config)), _leaves(asdict(composed))
        overrides = [*keep, *ours, *(f"{key}={_override_value(value)}" for key, value in want.items()
                                     if got.get(key) != value)]
        if build_config(compose(config_name="train", overrides=overrides)).config_hash() != config.config_hash():
            raise surgery.SurgeryError("no jobs/train.py overrides found that compose the new run's config")
    return overrides


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="the source run directory (read only)")
    parser.add_argument("--out", type=Path, required=True, help="the new run directory (must not exist)")
    parser.add_argument("changes", nargs="*", help="key=value: model.embed_size=N, model.lstm_size=N (wider only), "
                        "env.game_version=2 (MOBA)")
    parser.add_argument("--warmup-versions", type=int, default=None,
                        help="versions trained with learning rate 0 after the surgery (default 10)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the new units' random weights")
    parser.add_argument("--new-action-tolerance", type=float, default=None,
                        help="env.game_version: the largest probability the new action (heal) may take from the old "
                        "ones where it is legal (default 1e-3; its logit starts at noop's + log(τ/(1−τ)))")
    args = parser.parse_intermixed_args(argv)  # changes before or after --out
    from hpc_rl.evaluation import load_policy  # torch: only once the arguments are good
    from hpc_rl import surgery
    from hpc_rl.model.surgery import NEW_ACTION_TOLERANCE
    from hpc_rl.storage import CheckpointError, open_run

    tolerance = NEW_ACTION_TOLERANCE if args.new_action_tolerance is None else args.new_action_tolerance
    try:
        if not 0.0 < tolerance < 1.0:
            raise surgery.SurgeryError(f"--new-action-tolerance {tolerance}: a probability in (0, 1)")
        if args.out.exists():
            raise surgery.SurgeryError(f"--out {args.out} exists: surgery writes a new run directory")
        _, config, version = load_policy(args.run_dir)  # the run's config, as evaluations rebuild it
        changes = surgery.parse_changes(config, args.changes)
        ckpt = open_run(args.run_dir).load_checkpoint(version)
        warmup = surgery.WARMUP_VERSIONS if args.warmup_versions is None else args.warmup_versions
        out = args.out.resolve()
        new = replace(surgery.changed(config, changes, version, warmup), run_name=out.name, runs_dir=str(out.parent))
        sections = surgery.operate(ckpt.sections, config, new, args.seed, tolerance)
        past = surgery.transform_past(surgery.past_versions(args.run_dir, version), config, new, args.seed,
                                      tolerance)
        source_meta = open_run(args.run_dir).meta
        overrides = resume_overrides(new, source_meta.get("argv", [])[1:], changes)
    except (surgery.SurgeryError, CheckpointError, FileNotFoundError) as err:
        print(f"surgery: {err}", file=sys.stderr)
        return 2
    record = {"run_dir": str(args.run_dir.resolve()), "version": version, "changes": changes,
              "warmup_versions": warmup, "lr_zero_until": new.ppo.lr_zero_until, "seed": args.seed,
              **({"new_action_tolerance": tolerance} if "env.game_version" in changes else {}),
              "past_versions": sorted(past)}
    pool = open_run(args.run_dir).layout.pool
    surgery.write_run(out, new, version, sections, past, pool if past else None, surgery_from=record)
    world = source_meta.get("world_size", 6)
    command = shlex.join([sys.executable, "-m", "hpc_rl.launch", str(world), "jobs/train.py", *overrides])
    print(f"{out}: version {version} of {args.run_dir} with {', '.join(args.changes)}; learning rate 0 until "
          f"version {new.ppo.lr_zero_until}")
    print(f"resume: {command}")
    print(json.dumps({"out": str(out), "surgery_from": record, "resume": overrides}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
