"""Model surgery: every transformation against the untouched policy (in float64), the learner state it carries, the
changes it refuses, and jobs/surgery.py on a trained run resumed by the serial runner."""

import dataclasses
import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from hpc_rl import metric_names as M
from hpc_rl.algo.config import PPOConfig
from hpc_rl.algo.learner import Learner
from hpc_rl.bench.surgery import record
from hpc_rl.config import EnvConfig, PipelineConfig, TrainConfig, build_config
from hpc_rl.envs.moba_config import MobaConfig
from hpc_rl.model import surgery
from hpc_rl.model.config import ModelConfig
from hpc_rl.model.policy import Policy, norm_keys
from hpc_rl.runner import SerialRunner
from hpc_rl.model.tree import to_torch_tree
from hpc_rl.storage import open_run, write_pool
from hpc_rl.envs.moba_v2 import spec_v2
from hpc_rl.surgery import SurgeryError, changed, parse_changes, upgrade_game

ROOT = Path(__file__).resolve().parent.parent
SPEC = MobaConfig().spec()
EXACT = 1e-12  # float64


@pytest.fixture(scope="module")
def recorded():
    """40 steps of the scripted bot in 2 copies of 1v1 (160 agent steps), as float64 observations."""
    torch.set_num_threads(1)
    obs, hero, starts = record(MobaConfig(), 160, 2, seed=0)
    return {k: v.double() if v.is_floating_point() else v for k, v in obs.items()}, hero, starts


def random_policy(model: ModelConfig, spec=SPEC, seed: int = 0) -> Policy:
    """A float64 policy with random weights and a non-trivial observation normaliser."""
    torch.manual_seed(seed)
    policy = Policy(spec, model).double().eval()
    for key in policy.norm_keys:
        width = policy.get_buffer(f"obs_mean_{policy.norm_keys.index(key)}").shape[0]
        policy.set_normalizer(key, torch.randn(width, dtype=torch.float64),
                              torch.rand(width, dtype=torch.float64) + 0.5)
    policy.set_value_normalizer(1.5, 2.0)
    return policy


def changed_policy(params, model: ModelConfig, spec=SPEC) -> Policy:
    policy = Policy(spec, model).double().eval()
    policy.load_state_dict(params)
    return policy


def outputs(policy, recorded, **replaced):
    obs, hero, starts = recorded
    return surgery.head_outputs(policy, {**obs, **replaced}, hero, starts)


MODELS = [ModelConfig(core=core, lstm_size=16, embed_size=8, entity_pooling=pooling)
          for core in ("lstm", "mlp") for pooling in ("attention", "max")]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: f"{m.core}-{m.entity_pooling}")
def test_widening_the_embeddings_keeps_the_function(model, recorded):
    policy = random_policy(model)
    params = surgery.widen_embed(policy.state_dict(), SPEC, 13, torch.Generator().manual_seed(1))
    wide = changed_policy(params, dataclasses.replace(model, embed_size=13))
    assert surgery.max_abs_diff(outputs(policy, recorded), outputs(wide, recorded)) < EXACT
    # The new units are live (random incoming weights), only ignored downstream until training moves them.
    assert params["global_net.0.weight"][8:].abs().min() > 0 and params["core_in.0.weight"].shape == (16, 13 * 6)


@pytest.mark.parametrize("core", ["mlp", "lstm"])
def test_widening_the_core(core, recorded):
    model = ModelConfig(core=core, lstm_size=16, embed_size=8)
    policy = random_policy(model)
    before = outputs(policy, recorded)
    params = surgery.widen_core(policy.state_dict(), model, 24, torch.Generator().manual_seed(1))
    diff = surgery.max_abs_diff(before, outputs(changed_policy(params, dataclasses.replace(model, lstm_size=24)),
                                                recorded))
    if core == "mlp":
        assert diff < EXACT
    else:  # OpenAI Five's small random LSTM weights: a small change, not none (zero would keep the units symmetric)
        assert 0 < diff < 1e-2
        new_rows = params["lstm.weight_hh_l0"][16:24]
        assert new_rows.abs().max() < 1e-3 / math.sqrt(24) and new_rows.abs().min() > 0
        usual = surgery.widen_core(policy.state_dict(), model, 24, torch.Generator().manual_seed(1), scale=1.0)
        assert surgery.max_abs_diff(before, outputs(changed_policy(usual, dataclasses.replace(model, lstm_size=24)),
                                                    recorded)) > 10 * diff


@pytest.mark.parametrize("key", norm_keys(SPEC))
def test_adding_a_feature_keeps_the_function_and_neutral_statistics(key, recorded):
    model = ModelConfig(core="lstm", lstm_size=16, embed_size=8)
    policy = random_policy(model)
    normalizers = {k: {"count": 1000.0, "mean": np.ones(w), "m2": np.full(w, 4000.0)}
                   for k, w in zip(policy.norm_keys, (24, 19, 12, 11, 9))}
    params, stats = surgery.add_feature(policy.state_dict(), SPEC, key, position=2, normalizers=normalizers)
    wide = changed_policy(params, model, surgery.spec_with_feature(SPEC, key, 1))
    obs = recorded[0][key]
    extra = torch.randn(*obs.shape[:-1], 1, dtype=obs.dtype) * 100  # whatever the new feature holds
    got = outputs(wide, recorded, **{key: torch.cat([obs[..., :2], extra, obs[..., 2:]], dim=-1)})
    assert surgery.max_abs_diff(outputs(policy, recorded), got) < EXACT
    assert stats[key]["mean"][2] == 0.0 and stats[key]["m2"][2] / stats[key]["count"] == 1.0
    assert stats[key]["mean"].shape == (normalizers[key]["mean"].shape[0] + 1,)


def test_removing_a_feature_holds_it_at_a_constant(recorded):
    model = ModelConfig(core="lstm", lstm_size=16, embed_size=8)
    policy = random_policy(model)
    key = "entities/creeps"
    obs = recorded[0][key]
    held = obs.clone()
    held[..., 3] = 0.7
    params, _ = surgery.remove_feature(policy.state_dict(), SPEC, key, 3, 0.7)
    narrow = changed_policy(params, model, surgery.spec_with_feature(SPEC, key, -1))
    got = outputs(narrow, recorded, **{key: torch.cat([obs[..., :3], obs[..., 4:]], dim=-1)})
    assert surgery.max_abs_diff(outputs(policy, recorded, **{key: held}), got) < EXACT
    assert surgery.max_abs_diff(outputs(policy, recorded), got) > 1e-6  # the feature did matter before


def reference_offset(tolerance: float) -> float:
    """The largest offset o whose new action takes at most ``tolerance`` from a policy sure of the action it copies
    (the worst case): bisection on the softmax of the logits (0, o), in float64."""
    low, high = -60.0, 60.0
    for _ in range(200):
        middle = (low + high) / 2
        taken = float(torch.softmax(torch.tensor([0.0, middle], dtype=torch.float64), 0)[1])
        low, high = (middle, high) if taken <= tolerance else (low, middle)
    return low


def test_the_new_action_s_offset_keeps_it_within_its_tolerance():
    """new_action_offset against the bisection; on random logits (any action copied) the new action's probability,
    which is the total variation from the old distribution, stays within the tolerance, and nearly reaches it where
    the copied action is nearly certain."""
    generator = torch.Generator().manual_seed(0)
    for tolerance in (1e-9, 2.0611536e-9, 1e-6, 1e-3, 0.01, 0.3, 0.5, 0.9):
        offset = surgery.new_action_offset(tolerance)
        assert offset == pytest.approx(reference_offset(tolerance), abs=1e-9)
        logits = torch.randn(2000, 5, generator=generator, dtype=torch.float64) * 4
        logits[:1000, 0] += 100  # the copied action certain but for rounding
        old = torch.softmax(logits, -1)
        new = torch.softmax(torch.cat([logits, logits[:, :1] + offset], -1), -1)
        total_variation = 0.5 * ((new[:, :5] - old).abs().sum(-1) + new[:, 5])
        assert torch.allclose(total_variation, new[:, 5], rtol=1e-9, atol=1e-15)
        assert float(new[:, 5].max()) <= tolerance * (1 + 1e-12)
        assert float(new[:1000, 5].min()) > tolerance * (1 - 1e-9)
        assert float((new[:, :5].log() - old.log()).abs().max()) <= -math.log1p(-tolerance) + 1e-12
    assert surgery.new_action_offset(2.0611536e-9) == pytest.approx(-20.0, abs=1e-6)  # e^-20's odds
    for tolerance in (0.0, 1.0, -0.1, 2.0):
        with pytest.raises(ValueError, match="tolerance"):
            surgery.new_action_offset(tolerance)


def test_adding_an_action_leaves_the_policy_within_its_tolerance(recorded):
    model = ModelConfig(core="lstm", lstm_size=16, embed_size=8)
    policy = random_policy(model)
    for tolerance in (surgery.NEW_ACTION_TOLERANCE, 0.2):
        params = surgery.add_action(policy.state_dict(), False, True, torch.Generator().manual_seed(1),
                                    tolerance=tolerance)
        more = changed_policy(params, model, surgery.spec_with_action(SPEC, False, True))
        mask = recorded[0]["action_mask"]
        for legal, bound in ((False, EXACT), (True, -math.log1p(-tolerance))):
            new_mask = torch.cat([mask, torch.full((*mask.shape[:-1], 1), legal)], dim=-1)
            got = outputs(more, recorded, action_mask=new_mask)
            assert surgery.max_abs_diff(outputs(policy, recorded), got) < bound
        taken = got["action"][..., -1].exp()  # legal everywhere: noop's probability × e^offset, renormalised
        assert float(taken.max()) <= tolerance and float(taken.min()) > 0
    assert more.uses_target.tolist() == [*policy.uses_target.tolist(), True]


@pytest.mark.parametrize("core", ["lstm", "mlp"])
def test_moving_to_game_version_2_keeps_the_function_on_version_1_games(core, recorded):
    """hpc_rl.surgery.upgrade_game: exact where the game is version 1 in version 2's layout (the attribute 0, heal
    illegal), within the new action's tolerance where heal is legal, whatever the attribute holds."""
    model = ModelConfig(core=core, lstm_size=16, embed_size=8)
    policy = random_policy(model)
    normalizers = {k: {"count": 1000.0, "mean": np.ones(w), "m2": np.full(w, 4000.0)}
                   for k, w in zip(policy.norm_keys, (24, 19, 12, 11, 9))}
    params, stats = upgrade_game(policy.state_dict(), SPEC, 1, 2, torch.Generator().manual_seed(1), normalizers)
    moved = changed_policy(params, model, spec_v2(MobaConfig()))
    heroes, mask = recorded[0]["entities/heroes"], recorded[0]["action_mask"]
    before = outputs(policy, recorded)
    within = -math.log1p(-surgery.NEW_ACTION_TOLERANCE)
    for attribute, heal, bound in ((0.0, False, EXACT), (100.0, False, EXACT), (0.5, True, within)):
        column = torch.full((*heroes.shape[:-1], 1), attribute, dtype=heroes.dtype)
        legal = torch.full((*mask.shape[:-1], 1), heal)
        got = outputs(moved, recorded, **{"entities/heroes": torch.cat([heroes, column], dim=-1),
                                          "action_mask": torch.cat([mask, legal], dim=-1)})
        assert surgery.max_abs_diff(before, got) < bound
    assert stats["entities/heroes"]["mean"].shape == (20,) and stats["global"] is normalizers["global"]


def test_the_optimizer_and_clip_state_carry_where_shapes_are_unchanged(recorded):
    model = ModelConfig(core="lstm", lstm_size=16, embed_size=8)
    torch.manual_seed(0)
    learner = Learner(Policy(SPEC, model), PPOConfig())
    obs, hero, starts = recorded
    out = learner.policy({k: v.float() if v.is_floating_point() else v for k, v in obs.items()}, hero, starts,
                         learner.policy.initial_state(starts.shape[1]))
    (out.value.mean() + out.logp.mean()).backward()
    learner.clip()
    learner.optimizer.step()
    old = learner.policy.state_dict()
    new = surgery.widen_core(old, model, 24, torch.Generator().manual_seed(1))
    names = surgery.parameter_names(SPEC, dataclasses.replace(model, lstm_size=24))
    optimizer = surgery.carry_optimizer(learner.optimizer.state_dict(), names, old, new)
    clip = surgery.carry_clip({k: v.numpy() if torch.is_tensor(v) else v for k, v in learner.clip.state_dict().items()},
                              names, old, new)
    kept = {names[i] for i in optimizer["state"]}
    assert kept == {n for n in names if old[n].shape == new[n].shape} and "lstm.weight_hh_l0" not in kept
    assert "entity_nets.0.0.weight" in kept
    # The clip's flat v: unchanged parameters' slices carried, changed ones' zero; the step count goes on.
    offset = 0
    old_v = learner.clip.v
    new_offset = 0
    for n in names:
        size, new_size = old[n].numel(), new[n].numel()
        got = clip["v"][new_offset:new_offset + new_size]
        if old[n].shape == new[n].shape:
            np.testing.assert_array_equal(got, old_v[offset:offset + size].numpy())
        else:
            assert not got.any()
        offset, new_offset = offset + size, new_offset + new_size
    assert clip["step"] == 1
    wide = Learner(Policy(SPEC, dataclasses.replace(model, lstm_size=24)), PPOConfig())
    wide.optimizer.load_state_dict(optimizer)
    wide.clip.load_state_dict({"step": clip["step"], "v": torch.from_numpy(clip["v"])})


def test_refusals():
    config = TrainConfig(model=ModelConfig(lstm_size=16, embed_size=8))
    assert parse_changes(config, ["model.lstm_size=24", "model.embed_size=12"]) == {"model.lstm_size": 24,
                                                                                  "model.embed_size": 12}
    for changes, says in ((["model.lstm_size=8"], "shrinks"), (["model.lstm_sise=32"], "unknown key"),
                          (["env.name=gym:CartPole-v1"], "cannot change env.name"), (["model.lstm_size=16"], "already"),
                          (["model.lstm_size=big"], "must be an int"), (["model.lstm_size"], "key=value"),
                          (["model.lstm_size=24", "model.lstm_size=32"], "twice"), ([], "no change")):
        with pytest.raises(SurgeryError, match=says):
            parse_changes(config, changes)
    assert changed(config, {"model.lstm_size": 24}, 100, 5).ppo.lr_zero_until == 105
    assert parse_changes(config, ["env.game_version=2"]) == {"env.game_version": 2}
    moved = changed(config, {"env.game_version": 2}, 100, 5).env
    assert (moved.game_version, moved.new_version_since) == (2, 100)  # the new version's share counts from here
    newer = dataclasses.replace(config, env=EnvConfig(game_version=2))
    gym = TrainConfig(env=EnvConfig(name="gym:CartPole-v1"))
    for cfg, changes, says in ((config, ["env.game_version=3"], "game versions"),
                               (newer, ["env.game_version=1"], "older"), (newer, ["env.game_version=2"], "already"),
                               (gym, ["env.game_version=2"], "this run trains gym")):
        with pytest.raises(SurgeryError, match=says):
            parse_changes(cfg, changes)
    with pytest.raises(ValueError, match="surgery widens"):
        surgery.widen_core(Policy(SPEC, config.model).state_dict(), config.model, 8, torch.Generator())


def surgery_job():
    spec = importlib.util.spec_from_file_location("surgery_job", ROOT / "jobs" / "surgery.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_surgery_of_a_trained_run_resumes_and_trains(tmp_path, capsys):
    """jobs/surgery.py on a run the serial runner trained, then the new run resumed: the learning rate is 0 for the
    warm-up version, then the schedule's; meta.json records the surgery; the printed overrides compose its config."""
    torch.set_num_threads(1)
    config = TrainConfig(run_name="src", runs_dir=str(tmp_path),
                         env=EnvConfig(num_envs=2, vs_scripted_fraction=1.0),
                         model=ModelConfig(core="lstm", lstm_size=16, embed_size=8),
                         ppo=PPOConfig(epochs=1, num_minibatches=2),
                         pipeline=PipelineConfig(segment_len=16, segments_per_batch=1, max_versions=2,
                                                 checkpoint_every=1, final_eval_games=0))
    SerialRunner(config).run()
    write_pool(tmp_path / "src" / "pool.h5", [1], [0.5], eta=0.01, latest_fraction=0.8)  # a past version to play
    job = surgery_job()
    assert job.main([str(tmp_path / "src"), "--out", str(tmp_path / "empty"), "model.lstm_size=24"]) == 0
    assert job.main([str(tmp_path / "src"), "--out", str(tmp_path / "empty"), "model.lstm_size=32"]) == 2
    assert "exists" in capsys.readouterr().err
    (tmp_path / "nockpt" / "checkpoints").mkdir(parents=True)
    (tmp_path / "nockpt" / "config.yaml").write_text((tmp_path / "src" / "config.yaml").read_text())
    assert job.main([str(tmp_path / "nockpt"), "--out", str(tmp_path / "x"), "model.lstm_size=24"]) == 2
    assert "no checkpoint" in capsys.readouterr().err and not (tmp_path / "x").exists()
    assert job.main([str(tmp_path / "src"), "--out", str(tmp_path / "x"), "env.game_version=2",
                     "--new-action-tolerance", "1"]) == 2
    assert "--new-action-tolerance 1.0: a probability in (0, 1)" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()

    # A command line today's conf/ cannot compose (a sweep's) is left out of the resume overrides.
    meta_path = tmp_path / "src" / "meta.json"
    meta_path.write_text(json.dumps({**json.loads(meta_path.read_text()),
                                     "argv": ["jobs/train.py", "ppo.epochs=1,2", "--multirun"]}))
    out = tmp_path / "wide"
    assert job.main([str(tmp_path / "src"), "--out", str(out), "model.lstm_size=24", "model.embed_size=12",
                     "--warmup-versions", "1"]) == 0
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert not any(o.startswith(("ppo.epochs=1,2", "--")) for o in report["resume"])
    meta = open_run(out).meta
    assert meta["surgery_from"]["version"] == 2 and meta["surgery_from"]["changes"] == {"model.lstm_size": 24,
                                                                                        "model.embed_size": 12}
    new = build_config(yaml.safe_load((out / "config.yaml").read_text()))
    assert (new.model.lstm_size, new.model.embed_size, new.ppo.lr_zero_until) == (24, 12, 3)
    # The opponent pool's past version went through the same surgery.
    assert open_run(out).pool["version"] == [1] and meta["surgery_from"]["past_versions"] == [1]
    Policy(SPEC, new.model).load_state_dict(
        to_torch_tree(open_run(out).load_checkpoint(1).sections["params"]))
    assert new.config_hash() == open_run(out).load_checkpoint().config_hash
    assert open_run(out).load_checkpoint().config == new.settings()  # what a resume compares its settings with
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        assert build_config(compose(config_name="train", overrides=report["resume"])).config_hash() == new.config_hash()

    lrs = {}

    def watch(run, metrics):
        lrs[run.controller.version] = metrics[M.LR]
        return False

    runner = SerialRunner(dataclasses.replace(new, pipeline=dataclasses.replace(new.pipeline, max_versions=4)))
    assert runner.learner.version == 2 and runner.policy.config.lstm_size == 24
    runner.run(watch)
    assert lrs == {3: 0.0, 4: new.ppo.lr(3)} and lrs[4] > 0
    assert open_run(out).load_checkpoint().version == 4
    assert open_run(out).config_changes == []  # the surgery's own config resumed: no setting changed
    assert open_run(out).meta["surgery_from"] == meta["surgery_from"]  # kept when the resume rewrote meta.json
