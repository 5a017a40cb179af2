"""A resumed run may change every setting its saved state's shapes allow; the changes are recorded in the run."""

from dataclasses import asdict, fields, replace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from hpc_rl import metric_names as M
from hpc_rl.algo.learner import Learner
from hpc_rl.algo.schedules import Schedule, constant
from hpc_rl.config import GO_SHAPE_KEYS, SHAPE_KEYS, ResumeError, TrainConfig, build_config, setting_changes, to_yaml
from hpc_rl.envs.moba_config import MobaConfig
from hpc_rl.envs.moba_v2 import spec_v2
from hpc_rl.launch import set_torch_threads
from hpc_rl.model.config import ModelConfig
from hpc_rl.model.policy import Policy
from hpc_rl.roles.controller import open_run_dir
from hpc_rl.runner import SerialRunner
from hpc_rl.storage import CheckpointError, commit_checkpoint, load_checkpoint, open_run, read_metrics
from hpc_rl.storage.layout import RunLayout

# A value other than the default for every field of the model's and the MOBA's configs: the test below must see
# each (a field added to either config must be classified here, as shaping the saved state or not).
OTHER_MODEL = {"core": "lstm", "lstm_size": 64, "embed_size": 32, "entity_pooling": "max", "chunk_len": 8}
OTHER_MOBA = {"team_size": 2, "lanes": 3, "towers_per_lane": 3, "map_size": 96.0, "creep_wave_period": 100,
              "wave_melee": 2, "wave_ranged": 2, "max_waves_alive": 2, "creep_upgrade_waves": 3, "creep_upgrade": 0.3,
              "time_limit": 100, "hero_pool": ("mage",), "randomize_lineup": False, "lineup": ("mage", "mage"),
              "random_start_level": 0, "random_start_gold": 0.0, "mirrored_pairs": True, "target_range": 5.0,
              "reward_weights": {**MobaConfig().reward_weights, "win": 1.0}}


def _state_and_spaces(config: TrainConfig) -> tuple[dict[str, tuple], object]:
    """The shape of every array of the learner's checkpoint sections, and the environment's spec (MOBA)."""
    spec = config.env.moba.spec() if config.env.game_version == 1 else spec_v2(config.env.moba)
    learner = Learner(Policy(spec, config.model), config.ppo)
    shapes = {}

    def walk(prefix: str, tree) -> None:
        if isinstance(tree, dict):
            for key, value in tree.items():
                walk(f"{prefix}/{key}", value)
        else:
            shapes[prefix] = np.shape(tree)

    walk("", learner.checkpoint_sections())
    return shapes, spec


def test_shape_keys_are_the_settings_that_shape_the_saved_state_or_its_spaces():
    assert set(OTHER_MODEL) == {f.name for f in fields(ModelConfig)}
    assert set(OTHER_MOBA) == {f.name for f in fields(MobaConfig)}
    set_torch_threads()
    base = TrainConfig()
    reference = _state_and_spaces(base)
    variants = {f"model.{k}": replace(base, model=replace(base.model, **{k: v})) for k, v in OTHER_MODEL.items()}
    variants |= {f"env.moba.{k}": replace(base, env=replace(base.env, moba=replace(base.env.moba, **{k: v})))
                 for k, v in OTHER_MOBA.items()}
    variants["ppo.value_norm"] = replace(base, ppo=replace(base.ppo, value_norm=not base.ppo.value_norm))
    variants["env.game_version"] = replace(base, env=replace(base.env, game_version=2))
    shaping = {key for key, config in variants.items() if _state_and_spaces(config) != reference}
    # env.name: another environment altogether; Go's keys shape Go's learner (below); Neural MMO's populations its
    # checkpoints' groups (tests/test_populations.py)
    assert shaping == {key for key in SHAPE_KEYS
                       if key not in ("env.name", "env.nmmo.populations") and key not in GO_SHAPE_KEYS}


def test_go_shape_keys_are_the_settings_that_shape_the_go_learners_saved_state():
    from hpc_rl.algo.alphazero import AlphaZeroLearner
    from hpc_rl.algo.config import AlphaZeroConfig
    from hpc_rl.envs.go import NUM_PLANES
    from hpc_rl.envs.go_config import GoConfig, PUCTConfig
    from hpc_rl.model.config import GoNetConfig
    from hpc_rl.model.go_net import GoNet

    set_torch_threads()

    def shapes(go: GoConfig, az: AlphaZeroConfig) -> dict[str, tuple]:
        learner = AlphaZeroLearner(GoNet(go.net, go.board_size), az)
        net, _ = learner.net(torch.zeros((2, NUM_PLANES, go.board_size, go.board_size)))
        net.sum().backward()
        learner.optimizer.step()  # the optimiser's state exists after its first step
        out = {}

        def walk(prefix: str, tree) -> None:
            if isinstance(tree, dict):
                for key, value in tree.items():
                    walk(f"{prefix}/{key}", value)
            elif isinstance(tree, np.ndarray):
                out[prefix] = tree.shape
            else:
                out[prefix] = None

        walk("", learner.checkpoint_sections())
        return out

    go, az = GoConfig(board_size=5, net=GoNetConfig(1, 4)), AlphaZeroConfig(min_positions=1)
    reference = shapes(go, az)
    variants = {"env.go.board_size": (replace(go, board_size=6), az),
                "env.go.net.blocks": (replace(go, net=GoNetConfig(2, 4)), az),
                "env.go.net.filters": (replace(go, net=GoNetConfig(1, 6)), az),
                "alphazero.optimizer": (go, replace(az, optimizer="adam")),
                "env.go.komi": (replace(go, komi=0.5), az),
                "env.go.search": (replace(go, search=PUCTConfig(simulations=8)), az),
                "alphazero.lr": (go, replace(az, lr=0.1)), "alphazero.momentum": (go, replace(az, momentum=0.5))}
    shaping = {key for key, (g, a) in variants.items() if shapes(g, a) != reference}
    assert shaping == set(GO_SHAPE_KEYS)


def test_setting_changes_are_listed_key_by_key():
    old = TrainConfig().settings()
    new = build_config(OmegaConf.from_dotlist(["ppo.lr=1e-4", "topology.env=4", "run_name=elsewhere",
                                               "pipeline.max_versions=99"])).settings()
    # A schedule is one setting; where the run is and when it stops are not settings of what it learns.
    assert setting_changes(old, new) == [("ppo.lr", asdict(constant(1e-3)), asdict(constant(1e-4))),
                                         ("topology.env", 2, 4)]


def _config(tmp_path, *overrides: str) -> TrainConfig:
    return build_config(OmegaConf.from_dotlist([
        "env.name=gym:CartPole-v1", "env.num_envs=4", "pipeline.segment_len=32", "pipeline.segments_per_batch=1",
        "pipeline.checkpoint_every=1", "pipeline.final_eval_games=0", "ppo.epochs=1", f"runs_dir={tmp_path}",
        "run_name=cp", *overrides]))


def test_a_resumed_run_takes_new_hyperparameters_and_refuses_new_shapes(tmp_path, capsys):
    set_torch_threads()
    SerialRunner(_config(tmp_path, "pipeline.max_versions=3")).run()
    changed = ("ppo.lr=1e-4", "ppo.entropy_coef=0.01", "pipeline.segments_per_batch=2")
    SerialRunner(_config(tmp_path, "pipeline.max_versions=6", *changed)).run()
    run = open_run(tmp_path / "cp")
    out = capsys.readouterr().out
    assert "resuming from v000003.h5 with 3 changed setting(s)" in out
    assert "  ppo.lr: constant 0.001 -> constant 0.0001\n" in out
    assert [(c["version"], c["key"]) for c in run.config_changes] == [
        (3, "pipeline.segments_per_batch"), (3, "ppo.entropy_coef"), (3, "ppo.lr")]
    assert [(Schedule(**c["old"]), Schedule(**c["new"])) for c in run.config_changes[1:]] == [
        (constant(0.0), constant(0.01)), (constant(1e-3), constant(1e-4))]
    assert run.config_changes[0]["old"] == 1 and run.config_changes[0]["new"] == 2
    lr = read_metrics(run.layout.metrics)[M.LR]
    assert list(lr["version"]) == [1, 2, 3, 4, 5, 6]  # the versions continue
    assert list(lr["value"]) == pytest.approx([1e-3] * 3 + [1e-4] * 3)
    assert run.load_checkpoint().config["ppo"]["lr"]["start"] == 1e-4

    # Settings that shape the saved state are refused, each named with its values, and nothing is written.
    with pytest.raises(ResumeError) as refused:
        SerialRunner(_config(tmp_path, "pipeline.max_versions=9", "model.lstm_size=64", "model.core=lstm", *changed))
    message = str(refused.value)
    assert "model.core: 'mlp' -> 'lstm'; model.lstm_size: 128 -> 64" in message and "surgery" in message
    assert "no checkpoint verifies" not in message
    assert len(run.config_changes) == 3 and "lstm_size: 128" in run.layout.config.read_text()
    assert not RunLayout(tmp_path / "cp").lock.exists()  # released: the run can be resumed at once

    # A damaged checkpoint is still refused: the resume falls back to the previous one, and with none left, fails.
    config = _config(tmp_path, "pipeline.max_versions=9", *changed)
    latest = run.layout.checkpoints / "v000006.h5"
    data = bytearray(latest.read_bytes())
    data[-100] ^= 0xFF
    latest.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="digest mismatch"):
        load_checkpoint(latest)
    assert open_run_dir(config).version == 5
    for version in (4, 5):
        (run.layout.checkpoints / f"v00000{version}.h5").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="no checkpoint verifies"):
        open_run_dir(config)


def test_a_checkpoint_written_before_checkpoints_held_settings_is_compared_with_config_yaml(tmp_path):
    old = _config(tmp_path)
    layout = RunLayout.of(old.runs_dir, old.run_name)
    layout.root.mkdir()
    layout.config.write_text(to_yaml(old))  # the job that wrote the checkpoint
    commit_checkpoint(layout.checkpoints, 4, {"params": {"w": np.zeros(3)}}, old.config_hash())  # no settings
    assert open_run_dir(_config(tmp_path, "ppo.lam=0.9")).version == 4
    assert [(c["version"], c["key"], c["old"], c["new"]) for c in open_run(layout.root).config_changes] == [
        (4, "ppo.lam", 0.95, 0.9)]
    # config.yaml now holds lam 0.9: neither it nor the run says what the checkpoint was trained with.
    with pytest.raises(ResumeError, match="records no settings"):
        open_run_dir(_config(tmp_path, "ppo.lam=0.8"))


def test_a_run_written_before_a_setting_existed_resumes(tmp_path):
    """A checkpoint and config.yaml from code that had no ``ppo.lr_zero_until`` yet: the hash that code gave the
    checkpoint leaves the field out, and the resume finds the settings by hashing config.yaml as written."""
    old = _config(tmp_path)
    layout = RunLayout.of(old.runs_dir, old.run_name)
    layout.root.mkdir()
    written = OmegaConf.to_container(OmegaConf.create(to_yaml(old)))
    del written["ppo"]["lr_zero_until"]
    layout.config.write_text(OmegaConf.to_yaml(OmegaConf.create(written)))
    legacy_hash = old.config_hash(written)
    assert legacy_hash != old.config_hash()
    commit_checkpoint(layout.checkpoints, 4, {"params": {"w": np.zeros(3)}}, legacy_hash)  # no settings
    assert open_run_dir(_config(tmp_path, "ppo.lam=0.9")).version == 4
    assert [(c["key"], c["old"], c["new"]) for c in open_run(layout.root).config_changes] == [("ppo.lam", 0.95, 0.9)]


def test_a_shape_setting_added_since_the_checkpoint_resumes_at_its_default(tmp_path):
    """A checkpoint whose recorded settings predate ``env.game_version``: they played version 1, its default, so the
    run resumes (the new keys recorded as changes from None); moving to version 2 is refused (it takes a surgery)."""
    old = _config(tmp_path)
    layout = RunLayout.of(old.runs_dir, old.run_name)
    settings = old.settings()
    del settings["env"]["game_version"], settings["env"]["new_version_share"]
    commit_checkpoint(layout.checkpoints, 4, {"params": {"w": np.zeros(3)}}, old.config_hash(), config=settings)
    assert open_run_dir(_config(tmp_path)).version == 4
    assert {(c["key"], c["old"]) for c in open_run(layout.root).config_changes} == {
        ("env.game_version", None), ("env.new_version_share", None)}
    moba = build_config(OmegaConf.from_dotlist([f"runs_dir={tmp_path}", "run_name=cp", "env.game_version=2"]))
    with pytest.raises(ResumeError, match="env.game_version: None -> 2"):
        open_run_dir(moba)
