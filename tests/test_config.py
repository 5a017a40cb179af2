"""Configs fail with a clear message when composed, before any rank starts work."""

import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from omegaconf import OmegaConf

from hpc_rl.algo.schedules import Schedule, constant
from hpc_rl.config import SCHEDULE_KEYS, EnvConfig, TrainConfig, build_config, register
from hpc_rl.envs.nmmo_config import NmmoConfig
from hpc_rl.launch import mpirun_command, rank_env

ROOT = Path(__file__).resolve().parent.parent
register()


def _compose(*overrides: str) -> TrainConfig:
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return build_config(compose(config_name="train", overrides=list(overrides)))


def test_default_config_is_moba_1v1_on_six_ranks():
    cfg = _compose()
    assert cfg.env.name == "moba" and cfg.env.moba.team_size == 1
    assert cfg.topology.world_size == 6
    assert cfg.ppo.epochs == 1  # sample reuse 1 by default


def test_a_gymnasium_env_on_the_default_job_gets_the_default_learning_settings():
    """conf/train.yaml keeps the MOBA's learning settings for env.name=moba only (``${moba:A,B}``); its B side must be
    the dataclass default, or `env.name=gym:<id>` would run settings nobody measured."""
    gym, default = _compose("env.name=gym:Acrobot-v1"), TrainConfig()
    assert (gym.model, gym.ppo, gym.pipeline.target_reuse, gym.pipeline.segments_per_batch) == \
        (default.model, default.ppo, default.pipeline.target_reuse, default.pipeline.segments_per_batch)
    moba = _compose()
    assert (moba.model.core, moba.ppo.lr(0), moba.ppo.entropy_coef(0), moba.ppo.gamma(0), moba.ppo.value_norm,
            moba.target_reuse, moba.pipeline.segments_per_batch) == ("lstm", 3e-4, 0.01, 0.995, False, 1.0, 4)
    assert _compose("env=moba_5v5").model.core == "lstm"
    # A command-line override wins over either side.
    assert _compose("env.name=gym:Acrobot-v1", "ppo.epochs=3").target_reuse == 3


@pytest.mark.parametrize("override, message", [
    ("env.name=starcraft", "env.name must be 'moba', 'nmmo', 'go', 'gym:<id>' or 'pettingzoo:<module>', got 'starcraft'"),
    # Neural MMO is populations in a world: nothing plays a second team, and no reward is shared with a team.
    ("env.name=nmmo", "env.vs_scripted_fraction must be 0 for env.name=nmmo (populations, no two-team games), got "
                      "0.25"),
    ("experiment=nmmo league.past_fraction=0.2", "league.past_fraction must be 0 for env.name=nmmo"),
    ("experiment=nmmo ppo.team_spirit.start=0.3", "ppo.team_spirit must be 0 for env.name=nmmo"),
    ("experiment=nmmo topology.evaluator=1", "topology.evaluator must be 0 for env.name=nmmo"),
    ("env.nmmo.border=0", "nmmo.border must be >= 1, got 0"),
    ("experiment=nmmo env.nmmo.populations=3", "nmmo.populations must be >= 1 and divide nmmo.num_agents (32)"),
    ("experiment=nmmo env.nmmo.populations=2", "topology.learner (1) must be >= env.nmmo.populations (2): each "
                                               "population learns on learner ranks of its own"),
    ("env.name=pettingzoo:no_such_env_v1", "env.name=pettingzoo:no_such_env_v1: PettingZoo module 'no_such_env_v1' "
                                           "does not import: No module named 'no_such_env_v1'"),
    # PettingZoo's stub of its former MPE says where it went.
    ("env.name=pettingzoo:pettingzoo.mpe.simple_v3", "does not import: MPE has been moved into its own package: MPE2"),
    # Connect Four is an AEC game only.
    ("env.name=pettingzoo:pettingzoo.classic.connect_four_v3", "env.name=pettingzoo:pettingzoo.classic.connect_four_v3: "
                                                               "PettingZoo module 'pettingzoo.classic.connect_four_v3' "
                                                               "has no parallel_env(): not a parallel environment"),
    ("ppo.lr.start=-0.001", "learning rate must be >= 0"),
    ("pipeline.segment_len=40", "multiple of model.chunk_len"),
    ("pipeline.target_reuse=0.5", "target_reuse must be >= 1"),
    ("topology.learner=0", "topology.learner must be >= 1"),
    ("ppo.lam=1.5", "lam must lie in"),
    ("pipeline.allreduce=nccl", "pipeline.allreduce must be one of"),
    ("topology.evaluator=2", "topology.evaluator must be 0 or 1"),
    ("evaluation.games=3", "evaluation.games must be even"),
    ("evaluation.seed=-1", "evaluation.seed must be >= 0"),
    ("pipeline.fault_nonfinite_from_version=-1", "pipeline.fault_nonfinite_from_version must be >= 0 (0: off)"),
    ("pipeline.final_eval_games=5", "pipeline.final_eval_games must be even and >= 0"),
    ("pipeline.final_eval_games=-2", "pipeline.final_eval_games must be even and >= 0"),
    ("pipeline.learner_device=gpu", "pipeline.learner_device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got 'gpu'"),
    ("pipeline.inference_device=cuda:x", "pipeline.inference_device must be 'auto', 'cpu', 'cuda' or 'cuda:N'"),
    ("ppo.precision=float16", "precision must be one of ('float32', 'bfloat16'), got 'float16'"),
    ("env.go.board_size=3", "env.go: board_size must lie in"),
    ("env.go.search.simulations=1", "env.go.search: simulations must be >= 2"),
    ("alphazero.optimizer=rmsprop", "alphazero: optimizer must be one of ('sgd', 'adam'), got 'rmsprop'"),
    ("alphazero.lr_drops=[20,10]", "alphazero: lr_drops must be increasing versions >= 1"),
    ("env.name=go", "pipeline.final_eval_games must be 0 for env.name=go"),
])
def test_bad_values_fail_at_compose_time(override, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _compose(*override.split())


def test_config_hash_ignores_run_name_but_not_learning_settings():
    a, b = _compose("run_name=a"), _compose("run_name=b")
    assert a.config_hash() == b.config_hash()
    assert a.config_hash() != _compose("ppo.lam=0.9").config_hash()
    # A fault drill may be run on an existing run: it resumes from that run's checkpoints.
    assert a.config_hash() == _compose("pipeline.fault_nonfinite_from_version=5").config_hash()
    # The final evaluation plays the trained policy: it does not change what is learned.
    assert a.config_hash() == _compose("pipeline.final_eval_games=0").config_hash()
    # A run moves between GPU and CPU nodes; mixed precision changes the arithmetic of every update.
    assert a.config_hash() == _compose("pipeline.learner_device=cpu", "pipeline.inference_device=cuda:1").config_hash()
    assert a.config_hash() != _compose("ppo.precision=bfloat16").config_hash()


def test_evaluator_ranks_rate_moba_only_and_do_not_change_the_learning_problem():
    with pytest.raises(ValueError, match="topology.evaluator must be 0 for env.name=gym:CartPole-v1"):
        _compose("experiment=cartpole", "topology.evaluator=1")
    rated = _compose("topology.evaluator=1", "evaluation.games=4")
    assert rated.topology.world_size == 7
    assert rated.config_hash() == _compose().config_hash()  # a resumed run may gain an evaluator


def test_experiment_preset_composes_across_groups():
    cfg = _compose("experiment=cartpole")
    assert cfg.env.name == "gym:CartPole-v1" and cfg.ppo.num_minibatches == 8 and cfg.ppo.lr(0) == 1e-3


@pytest.mark.parametrize("preset", sorted(p.stem for p in (ROOT / "conf/experiment").glob("*.yaml")))
def test_every_experiment_preset_builds(preset):
    """A preset is checked when it is used: one that sets a schedule's end without its kind, say, fails here."""
    cfg = _compose(f"experiment={preset}")
    if preset == "moba_kickstart":  # what `make train` runs: the scripted bot teaches, at a weight fading to 0
        assert (cfg.env.teacher, cfg.env.vs_scripted_fraction, cfg.ppo.kickstart_coef(0), cfg.ppo.kickstart_coef(50),
                cfg.ppo.kickstart_coef(100), cfg.ppo.lam, cfg.ppo.entropy_coef(0), cfg.topology.learner,
                cfg.pipeline.segments_per_batch) == ("scripted", 1.0, 1.0, 0.5, 0.0, 0.8, 0.0, 1, 8)
        # 8,192 samples a version, as the default job's 2 learners x 4 segments, on the 5 ranks make train starts
        assert cfg.topology.world_size == 5 and cfg.topology.learner * cfg.pipeline.segments_per_batch * \
            cfg.env.num_envs * cfg.pipeline.segment_len * cfg.env.agents_per_copy == 8192


def test_a_bad_schedule_is_named():
    with pytest.raises(ValueError, match="ppo.kickstart_coef: a constant schedule"):
        _compose("experiment=moba_kickstart", "ppo.kickstart_coef.kind=constant")


def test_schedule_fields_are_found_in_the_dataclasses():
    assert set(SCHEDULE_KEYS) == {"ppo.lr", "ppo.entropy_coef", "ppo.gamma", "ppo.team_spirit", "ppo.kickstart_coef",
                                  "env.new_version_share"}


@pytest.mark.parametrize("key", SCHEDULE_KEYS)
def test_a_bare_number_is_a_constant_schedule(key):
    """``ppo.lr=1e-4`` is ``ppo.lr.start=1e-4`` with kind constant, replacing whatever schedule was there (the presets
    decay the learning rate and the kickstarting weight linearly), on the command line and in process alike."""
    section, name = key.split(".")
    # A kickstarting weight needs a teacher, a share of the new game version a game version 2.
    teacher = {"kickstart_coef": ["env.teacher=scripted"], "new_version_share": ["env.game_version=2"]}.get(name, [])
    preset = {"kickstart_coef": "moba_kickstart", "new_version_share": "moba_small_map"}.get(name, "cartpole")

    def schedule(cfg: TrainConfig) -> Schedule:
        return getattr(getattr(cfg, section), name)

    expected = constant(0.5)
    assert schedule(build_config(OmegaConf.from_dotlist([f"{key}=0.5", *teacher]))) == expected
    assert schedule(_compose(f"experiment={preset}", f"{key}=0.5", *teacher)) == expected
    assert schedule(_compose(f"{key}.start=0.5", *teacher)).start == 0.5  # the long form still works
    with pytest.raises(ValueError, match=f"{key} must be a number \\(a constant\\) or a schedule"):
        build_config(OmegaConf.from_dotlist([f"{key}=fast"]))


def test_config_errors_name_their_key_in_one_line():
    for dotlist, message in ((["ppo.epochs=x"], "ppo.epochs: Value 'x' of type 'str' could not be converted"),
                             (["ppo.lam=2"], "ppo: lam must lie in [0, 1]"),
                             (["model.lstm_size=0"], "model: lstm_size (0) and embed_size (64) must be >= 1")):
        with pytest.raises(ValueError) as err:
            build_config(OmegaConf.from_dotlist(dotlist))
        assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_bad_config_from_the_command_line_fails_before_mpi_starts(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "jobs/train.py"), "ppo.lr.start=-1", f"runs_dir={tmp_path}"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "learning rate must be >= 0" in out.stderr
    assert not any(tmp_path.iterdir())  # nothing was written


@pytest.mark.mpi
def test_a_bad_config_is_reported_once_per_job(tmp_path):
    out = subprocess.run(mpirun_command(3, [str(ROOT / "jobs/train.py"), "ppo.lr=fast", f"runs_dir={tmp_path}"]),
                         capture_output=True, text=True, timeout=180, env=rank_env())
    assert out.returncode != 0
    assert (out.stdout + out.stderr).count("hpc_rl: bad config: ppo.lr must be a number") == 1, out.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.mpi
def test_wrong_world_size_is_a_clear_error_printed_once(tmp_path):
    out = subprocess.run(mpirun_command(3, [str(ROOT / "jobs/train.py"), f"runs_dir={tmp_path}"]),
                         capture_output=True, text=True, timeout=180, env=rank_env())
    assert out.returncode != 0
    assert (out.stdout + out.stderr).count("hpc_rl: the topology needs 6 ranks") == 1 and "has 3" in out.stderr
    assert not (tmp_path / "default").exists()


def test_composing_a_config_loads_no_training_stack():
    """A sweep is composed on a login node: the config and its checks import neither torch, numba nor mpi4py."""
    code = ("import sys; from hpc_rl.config import TrainConfig, build_config; build_config({'seed': 1}); "
            "TrainConfig().config_hash(); print(sorted(m for m in ('torch', 'numba', 'mpi4py') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_curriculum_stage_of_a_version():
    env = EnvConfig(warmup_map_size=32.0, warmup_versions=100, warmup_opponent="random")
    assert env.warming_up(99) and not env.warming_up(100)
    assert env.moba_at(0).map_size == 32.0 and env.moba_at(100) == env.moba
    assert (env.bot_at(99), env.bot_at(100)) == ("random", "scripted")
    assert env.moba_at(0).spec() == env.moba.spec()  # same units, so the same observation shapes
    assert EnvConfig(warmup_versions=100).moba_at(0) == EnvConfig().moba  # no warm-up map: the run's
    assert not EnvConfig().warming_up(0) and EnvConfig().bot_at(0) == "scripted"
    with pytest.raises(ValueError, match="map_size"):
        EnvConfig(warmup_map_size=10.0, warmup_versions=5)
    with pytest.raises(ValueError, match="warmup_versions"):
        EnvConfig(warmup_versions=-1)
    with pytest.raises(ValueError, match="warmup_opponent"):
        EnvConfig(warmup_opponent="league")


def test_env_ranks_can_step_the_neural_mmo_world():
    env_config = EnvConfig(name="nmmo", num_envs=2, nmmo=NmmoConfig(num_agents=8, map_size=24, border=2))
    assert env_config.is_nmmo and not env_config.is_moba and env_config.agents_per_copy == 8
    env = env_config.make(first_copy=4)
    assert env.num_envs == 2 and env.first_copy == 4 and env.spec.num_agents == 8
    env.spec.check_obs(env.reset(0), 2)
    rewards = env_config.reward_config()
    assert rewards.weights == (-1.0, 0.0, 0.0, 0.0) and rewards.decay_period_s is None and not rewards.zero_sum
