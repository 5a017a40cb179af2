"""Surgery on a run: its latest good checkpoint, changed by ``hpc_rl.model.surgery``, as the first checkpoint of a new
run that ``jobs/train.py`` resumes with the changed config (``jobs/surgery.py``; docs/surgery.md).

    changes = parse_changes(config, ["model.lstm_size=192"])    # checked: known, changeable, wider (or newer)
    new = changed(config, changes, ckpt.version)                # the changes, and the learning rate held at 0
    sections = operate(ckpt.sections, config, new)              # params, Adam, clip for the new shapes
    write_run(out, new, ckpt.version, sections, surgery_from={...})

The new run's checkpoint keeps the source's version, normaliser statistics and learner state, so its metrics and
version numbers continue the source's; the opponent pool's past versions go through the same surgery (OpenAI Five:
otherwise past versions would play worse forever).

A change of the game (``env.game_version``) is a change of the observation and action spaces; ``upgrade_game`` maps
it to the model's transforms (the one place that knows what each game version added).
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict
from pathlib import Path

import torch
import yaml

from hpc_rl.algo.learner import Learner
from hpc_rl.config import GAME_VERSIONS, TrainConfig, to_yaml
from hpc_rl.envs.api import EnvSpec
from hpc_rl.envs.moba_config import A_NOOP
from hpc_rl.model import surgery
from hpc_rl.model.policy import Policy
from hpc_rl.model.tree import to_numpy_tree, to_torch_tree
from hpc_rl.storage import commit_checkpoint, load_checkpoint, read_pool, write_meta, write_pool
from hpc_rl.storage.checkpoint import checkpoint_name
from hpc_rl.storage.layout import RunLayout

# What surgery changes, in the order it applies them: the sizes (wider only), and the MOBA's game version (newer
# only; ``upgrade_game``).
SURGERY_KEYS = ("model.embed_size", "model.lstm_size", "env.game_version")
WARMUP_VERSIONS = 10  # default versions with learning rate 0 after a surgery (PPOConfig.lr_zero_until)


class SurgeryError(ValueError):
    """A surgery that cannot be done, saying why."""


def _lookup(tree: dict, key: str):
    node = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(key)
        node = node[part]
    return node


def parse_changes(config: TrainConfig, overrides: list[str]) -> dict[str, int]:
    """``key=value`` overrides (Hydra's syntax, without its + and ~ prefixes) as {key: new value}; refuses an unknown
    key, a key surgery cannot change, a value that is not a wider int (a newer game version), a key given twice, and
    no change at all."""
    if not overrides:
        raise SurgeryError(f"no change given; surgery changes {', '.join(SURGERY_KEYS)} (e.g. model.lstm_size=192)")
    current = asdict(config)
    changes: dict[str, int] = {}
    for override in overrides:
        key, sep, text = override.partition("=")
        if not sep or not key:
            raise SurgeryError(f"a change is key=value (e.g. model.lstm_size=192), got {override!r}")
        try:
            old = _lookup(current, key)
        except KeyError:
            raise SurgeryError(f"unknown key {key!r}: the run's config has no such field") from None
        if key not in SURGERY_KEYS:
            raise SurgeryError(f"surgery cannot change {key}: it changes {', '.join(SURGERY_KEYS)} (the parameters "
                               "keep their function only across those); other settings belong to the training "
                               "command that resumes the new run")
        if key in changes:
            raise SurgeryError(f"{key} is given twice")
        value = yaml.safe_load(text)
        if isinstance(value, bool) or not isinstance(value, int):
            raise SurgeryError(f"{key} must be an int, got {text!r}")
        if key == "env.game_version":
            if not config.env.is_moba or value not in GAME_VERSIONS:
                raise SurgeryError(f"env.game_version={value}: the MOBA has game versions {GAME_VERSIONS}"
                                   + ("" if config.env.is_moba else f", this run trains {config.env.name}"))
            if value < old:
                raise SurgeryError(f"env.game_version={value} is older than the run's ({old}): surgery moves a run "
                                   "to a newer game (what a newer version added cannot be taken back exactly)")
        elif value < old:
            raise SurgeryError(f"{key}={value} shrinks the layer ({old} units): surgery only widens (a unit's "
                               "function cannot be kept once removed)")
        if value == old:
            raise SurgeryError(f"{key} is already {old}: nothing to change")
        changes[key] = value
    return changes


def changed(config: TrainConfig, changes: dict[str, int], version: int,
            warmup_versions: int = WARMUP_VERSIONS) -> TrainConfig:
    """The config after the surgery of ``version``: the changes (a new game version's share counted from
    ``version``), and the learning rate 0 until ``warmup_versions`` versions later (or a previous surgery's later
    hold)."""
    if warmup_versions < 0:
        raise SurgeryError(f"warmup versions must be >= 0, got {warmup_versions}")
    model = dataclasses.replace(config.model, **{k.split(".", 1)[1]: v for k, v in changes.items()
                                                 if k.startswith("model.")})
    env = config.env
    if "env.game_version" in changes:  # the new version's share counts its versions from here
        env = dataclasses.replace(env, game_version=changes["env.game_version"], new_version_since=version)
    ppo = dataclasses.replace(config.ppo, lr_zero_until=max(config.ppo.lr_zero_until, version + warmup_versions))
    return dataclasses.replace(config, env=env, model=model, ppo=ppo)


def upgrade_game(params: surgery.Params, spec: EnvSpec, old_version: int, new_version: int,
                 generator: torch.Generator, normalizers: dict | None = None,
                 new_action_tolerance: float = surgery.NEW_ACTION_TOLERANCE) -> tuple[surgery.Params, dict | None]:
    """A policy of game version ``old_version`` (``spec``: its spaces) for ``new_version``. Version 2
    (``hpc_rl.envs.moba_v2``): the hero attribute, last of the hero rows (``add_feature``: exact), and ``heal``, last
    of the primary actions (``add_action`` copying noop, which heal plays as besides its hp: heal takes at most
    ``new_action_tolerance`` of probability from the old actions where it is legal, and none where it is not, as in
    every game played under version 1's rules)."""
    from hpc_rl.envs.moba_v2 import ATTACK_TIMER, HEAL_USES_MOVE, HEAL_USES_TARGET

    if new_version == old_version:
        return params, normalizers
    # 1 -> 2, the one newer version there is (hpc_rl.config.GAME_VERSIONS; parse_changes refuses the others)
    params, normalizers = surgery.add_feature(params, spec, "entities/heroes", ATTACK_TIMER, normalizers)
    params = surgery.add_action(params, HEAL_USES_MOVE, HEAL_USES_TARGET, generator, like=A_NOOP,
                                tolerance=new_action_tolerance)
    return params, normalizers


def operate(sections: dict, old: TrainConfig, new: TrainConfig, seed: int = 0,
            new_action_tolerance: float = surgery.NEW_ACTION_TOLERANCE) -> dict:
    """A checkpoint's sections (numpy trees) for ``new``'s model and game: the parameters (and the observation
    normaliser's statistics) transformed, Adam's and the clip's state carried where shapes are unchanged and reset
    where not; checked by loading them into a learner. ``new_action_tolerance``: a new game version's action's
    (``upgrade_game``)."""
    spec = old.env.make(num_envs=1).spec
    generator = torch.Generator().manual_seed(seed)
    before = to_torch_tree(sections["params"])
    after = surgery.widen_embed(before, spec, new.model.embed_size, generator)
    after = surgery.widen_core(after, old.model, new.model.lstm_size, generator)
    after, normalizers = upgrade_game(after, spec, old.env.game_version, new.env.game_version, generator,
                                      sections.get("normalizers"), new_action_tolerance)
    spec = new.env.make(num_envs=1).spec
    names = surgery.parameter_names(spec, new.model)
    result = {**sections, "params": to_numpy_tree(after)}
    if normalizers is not None:
        result["normalizers"] = normalizers
    if "optimizer" in sections:  # a past version kept for the opponent pool may hold its parameters only
        result["optimizer"] = surgery.carry_optimizer(sections["optimizer"], names, before, after)
        result["clip"] = surgery.carry_clip(sections["clip"], names, before, after)
        Learner(Policy(spec, new.model), new.ppo).load_checkpoint_sections(result)  # what a resume does
    else:
        Policy(spec, new.model).load_state_dict(to_torch_tree(result["params"]))
    return result


def write_run(out: Path, config: TrainConfig, version: int, sections: dict, past: dict[int, dict] | None = None,
              source_pool: Path | None = None, **meta) -> Path:
    """The new run directory ``out``: config.yaml (``config``, named after ``out``), the checkpoints of the past
    versions ``past`` and of ``version`` (``latest``), the opponent pool (``source_pool``'s versions and qualities)
    and meta.json with ``meta``. ``out`` must not exist."""
    if out.exists():
        raise SurgeryError(f"{out} exists: surgery writes a new run directory, never into an existing one")
    config = dataclasses.replace(config, run_name=out.name, runs_dir=str(out.parent))
    layout = RunLayout(out)
    out.mkdir(parents=True)
    layout.config.write_text(to_yaml(config))
    for past_version, past_sections in sorted((past or {}).items()):
        commit_checkpoint(layout.checkpoints, past_version, past_sections, config.config_hash(),
                          config=config.settings())
    commit_checkpoint(layout.checkpoints, version, sections, config.config_hash(), config=config.settings())
    if source_pool is not None:
        versions, qualities, attrs = read_pool(source_pool)
        write_pool(layout.pool, versions, qualities, **attrs)
    write_meta(out, config_hash=config.config_hash(), **meta)
    return out


def past_versions(source: Path, version: int) -> dict[int, Path]:
    """The opponent pool's past versions (up to ``version``) whose checkpoints ``source`` still has."""
    layout = RunLayout(source)
    stored = read_pool(layout.pool)
    if stored is None:
        return {}
    return {v: layout.checkpoints / checkpoint_name(v) for v in stored[0]
            if v < version and (layout.checkpoints / checkpoint_name(v)).is_file()}


def transform_past(paths: dict[int, Path], old: TrainConfig, new: TrainConfig, seed: int,
                   new_action_tolerance: float = surgery.NEW_ACTION_TOLERANCE) -> dict[int, dict]:
    """The past versions' checkpoints through the same surgery (each with its own draw of the new weights)."""
    return {v: operate(load_checkpoint(path).sections, old, new, seed + 1 + i, new_action_tolerance)
            for i, (v, path) in enumerate(sorted(paths.items()))}
