"""The GPU path: inference and learners on CUDA agree with the CPU to float32 tolerance, checkpoints move between
the two, and a job runs its inference and learner ranks on the GPU (learners reducing through host memory); the
same for Go's network (the search's leaf evaluation, the AlphaZero update) and a Go self-play job.

Every test here needs a CUDA device and is skipped (absent gpu) where torch sees none; the CPU side of the same
code (mixed precision, devices in the config) is tested in tests/test_algo_ppo.py and tests/test_config.py.
"""

import copy
import dataclasses
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from hpc_rl.algo.alphazero import AlphaZeroLearner
from hpc_rl.algo.config import AlphaZeroConfig, PPOConfig
from hpc_rl.algo.learner import Learner
from hpc_rl.algo.schedules import constant
from hpc_rl.config import EnvConfig, PipelineConfig, TrainConfig
from hpc_rl.envs.go import NUM_PLANES, GoGames, input_planes
from hpc_rl.evaluation import load_policy, policy_from_checkpoint
from hpc_rl.launch import mpirun_command, rank_env
from hpc_rl.model.config import GoNetConfig, ModelConfig
from hpc_rl.model.device import to_device
from hpc_rl.model.go_net import GoNet, NetEvaluator
from hpc_rl.model.policy import Policy, act, hero_indices
from hpc_rl.runner import SerialRunner
from hpc_rl.storage import commit_checkpoint, load_checkpoint, open_run

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.gpu

MODEL = ModelConfig(core="lstm", lstm_size=64, embed_size=32)
PPO = PPOConfig(lr=constant(1e-3), epochs=2, num_minibatches=2, value_norm=True)


@pytest.fixture(autouse=True)
def cuda(absent):
    """The GPU, with TF32 off: float32 agreement with the CPU is what these tests check, and TF32 rounds matmul
    inputs to 10 bits of mantissa."""
    if not torch.cuda.is_available():
        absent("gpu", "needs a CUDA device (torch.cuda.is_available() is False)")
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _runner(runs_dir: Path) -> SerialRunner:
    """A serial MOBA runner: real observations (entities, masks) and segments with stored LSTM states. Its roles
    take the GPU (pipeline.*_device=auto), as the serial runner does on a GPU machine."""
    return SerialRunner(TrainConfig(runs_dir=str(runs_dir), env=EnvConfig(num_envs=4), model=MODEL, ppo=PPO,
                                    pipeline=PipelineConfig(segment_len=32, segments_per_batch=1)))


def _learners(spec, cuda, ppo: PPOConfig = PPO) -> tuple[Learner, Learner]:
    """Two learners with the same initial parameters and shuffling seed, on the CPU and on the GPU."""
    torch.manual_seed(0)
    cpu_policy = Policy(spec, MODEL)
    gpu_policy = copy.deepcopy(cpu_policy).to(cuda)
    return Learner(cpu_policy, ppo, device="cpu", seed=1), Learner(gpu_policy, ppo, device=cuda, seed=1)


def _assert_same_learner(cpu: Learner, gpu: Learner, atol: float | None) -> None:
    """Parameters, normaliser buffers and the clip's moments agree (to ``atol``; None: exactly); the GPU side's live
    on the GPU."""
    pairs = [(name, a, b) for (name, a), b in zip(cpu.policy.state_dict().items(), gpu.policy.state_dict().values())]
    pairs.append(("clip.v", cpu.clip.v, gpu.clip.v))
    for name, a, b in pairs:
        assert b.device.type == "cuda", name
        if atol is None:
            assert torch.equal(b.cpu(), a), name
        else:
            torch.testing.assert_close(b.cpu(), a, rtol=1e-4, atol=atol if name != "clip.v" else 1e-12,
                                       msg=lambda m, n=name: f"{n}: {m}")


def test_inference_on_cuda_matches_the_cpu(tmp_path, cuda):
    """Twenty steps of a game: the same greedy actions, log-probabilities, values and LSTM states on both devices,
    the GPU side fed through pinned memory as inference ranks feed it."""
    runner = _runner(tmp_path)
    env = runner.config.env.make(num_envs=4)
    cpu_policy = copy.deepcopy(runner.policy).cpu().eval()
    gpu_policy = copy.deepcopy(cpu_policy).to(cuda)
    n = 4 * env.spec.num_agents
    hero = torch.from_numpy(hero_indices(env.spec)).repeat(4)
    starts = torch.ones(n, dtype=torch.bool)
    states = cpu_policy.initial_state(n), gpu_policy.initial_state(n, cuda)
    obs = env.reset(seed=3)
    for _ in range(20):
        flat = {k: v.reshape(n, *v.shape[2:]) for k, v in obs.items()}
        on_cpu = act(cpu_policy, to_device(flat, torch.device("cpu")), hero, starts, states[0], deterministic=True)
        on_gpu = act(gpu_policy, to_device(flat, cuda), hero.to(cuda), starts.to(cuda), states[1],
                     deterministic=True)
        for head, chosen in on_cpu.actions.items():
            assert torch.equal(on_gpu.actions[head].cpu(), chosen), head
        torch.testing.assert_close(on_gpu.logp.cpu(), on_cpu.logp, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(on_gpu.value.cpu(), on_cpu.value, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(on_gpu.state[0].cpu(), on_cpu.state[0], rtol=1e-4, atol=1e-5)
        states = on_cpu.state, on_gpu.state
        starts = torch.zeros(n, dtype=torch.bool)
        obs, _reward, done, _info = env.step({k: v.reshape(4, -1).numpy() for k, v in on_cpu.actions.items()})
        starts = torch.from_numpy(done).repeat_interleave(env.spec.num_agents)


def test_learner_update_on_cuda_matches_the_cpu(tmp_path, cuda):
    """The same batch, the same initial parameters and shuffling: after two updates (four gradient steps each,
    through OpenAI Five's clip, Adam and the normalisers) both devices hold the same parameters, clip moments and
    normaliser statistics, and report the same losses."""
    runner = _runner(tmp_path)
    batches = runner.collect(), runner.collect()
    cpu, gpu = _learners(runner.spec, cuda)
    for batch in batches:
        on_cpu, on_gpu = cpu.update(batch), gpu.update(batch)
        for key in ("train/policy_loss", "train/value_loss", "train/entropy", "train/approx_kl"):
            assert on_gpu[key] == pytest.approx(on_cpu[key], rel=1e-3, abs=1e-6), key
    gap = max(float((a - b.cpu()).abs().max()) for a, b in zip(cpu.policy.state_dict().values(),
                                                               gpu.policy.state_dict().values())
              if a.is_floating_point())  # the action-head masks (uses_move, uses_target) are bool buffers
    print(f"largest parameter difference after 2 updates: {gap:.3g}")  # docs/GPU.md quotes it
    _assert_same_learner(cpu, gpu, atol=1e-5)


def test_mixed_precision_update_on_cuda_follows_the_float32_one(tmp_path, cuda):
    """bf16 autocast changes the arithmetic, not the update: its parameter step points the float32 step's way."""
    runner = _runner(tmp_path)
    batch = runner.collect()
    _, full = _learners(runner.spec, cuda)
    _, mixed = _learners(runner.spec, cuda, dataclasses.replace(PPO, precision="bfloat16"))
    before = torch.cat([p.detach().flatten() for p in full.policy.parameters()])
    metrics = mixed.update(batch)
    full.update(batch)
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
    step_full = torch.cat([p.detach().flatten() for p in full.policy.parameters()]) - before
    step_mixed = torch.cat([p.detach().flatten() for p in mixed.policy.parameters()]) - before
    cosine = float(torch.nn.functional.cosine_similarity(step_full, step_mixed, dim=0))
    print(f"cosine of the bf16 and float32 parameter steps: {cosine:.4f}")  # docs/GPU.md quotes it
    assert cosine > 0.9


def test_a_checkpoint_written_on_the_gpu_resumes_on_the_cpu_and_the_gpu_alike(tmp_path, cuda):
    """A GPU learner's checkpoint (a real HDF5 file) loads into a CPU learner and a GPU learner: the same parameters,
    optimiser and clip state, so their next updates agree; an inference rank's loader places it on the GPU."""
    runner = _runner(tmp_path)
    first, second = runner.collect(), runner.collect()
    _, writer = _learners(runner.spec, cuda)
    writer.update(first)
    path = commit_checkpoint(tmp_path / "ckpt", writer.version, writer.checkpoint_sections(), "hash")
    ckpt = load_checkpoint(path)
    cpu, gpu = _learners(runner.spec, cuda)
    for learner in (cpu, gpu):
        learner.load_checkpoint_sections(ckpt.sections)
        assert learner.version == writer.version
    _assert_same_learner(cpu, writer, atol=None)
    _assert_same_learner(cpu, gpu, atol=None)
    assert all(s.device.type == "cuda" for state in gpu.optimizer.state.values() for s in state.values()
               if torch.is_tensor(s) and s.dim() > 0)
    cpu.update(second)
    gpu.update(second)
    _assert_same_learner(cpu, gpu, atol=1e-5)
    served = policy_from_checkpoint(ckpt, runner.config).to(cuda)
    for a, b in zip(served.state_dict().values(), writer.policy.state_dict().values()):
        assert torch.equal(a, b)


JOB = ["topology.env=1", "topology.inference=1", "topology.learner=2", "env.num_envs=4", "pipeline.segment_len=32",
       "pipeline.segments_per_batch=1", "pipeline.checkpoint_every=2", "pipeline.allreduce=mpi",
       "pipeline.final_eval_games=0"]


def _job(runs: Path, versions: int, devices: list[str]) -> dict:
    cmd = mpirun_command(5, [str(ROOT / "jobs/train.py"), "run_name=gpu", f"runs_dir={runs}", *JOB, *devices,
                             f"pipeline.max_versions={versions}"])
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=runs, env=rank_env(), timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return json.loads((runs / "gpu/summary.json").read_text())


@pytest.mark.mpi
@pytest.mark.timeout(600)
def test_a_job_trains_on_the_gpu_and_resumes_on_the_cpu(tmp_path):
    """Real ranks: the inference rank and both learners (mpi4py allreduce of CUDA tensors through host memory) on
    the GPU for 4 versions, then the same run resumed from its GPU-written checkpoint with every rank on the CPU."""
    summary = _job(tmp_path, 4, ["pipeline.inference_device=cuda", "pipeline.learner_device=cuda"])
    assert summary["state"] == "finished" and summary["version"] == 4, summary
    assert summary["devices"] == {"inference": ["cuda:0"], "learner": ["cuda:0", "cuda:0"]}, summary["devices"]
    summary = _job(tmp_path, 6, ["pipeline.inference_device=cpu", "pipeline.learner_device=cpu"])
    assert summary["state"] == "finished" and summary["version"] == 6, summary
    assert summary["devices"] == {"inference": ["cpu"], "learner": ["cpu", "cpu"]}, summary["devices"]
    policy, _config, version = load_policy(tmp_path / "gpu")
    assert version == 6 and all(p.device.type == "cpu" for p in policy.parameters())


def _go_positions(n: int, size: int, seed: int) -> tuple[np.ndarray, np.ndarray, GoGames]:
    """One position from each of ``n`` random games, 0 to 60 moves in (its input planes and legal moves), and the
    games as they stand after 60 moves."""
    rng = np.random.default_rng(seed)
    games = GoGames(n, size)
    taken_at = rng.integers(0, 61, n)
    planes = np.empty((n, NUM_PLANES, size, size), np.float32)
    legal = np.empty((n, games.num_actions), bool)
    for move in range(61):
        now = games.legal_mask()
        rows = np.flatnonzero(taken_at == move)
        planes[rows], legal[rows] = input_planes(games, rows, now[rows]), now[rows]
        # No passes while a point is legal: two in a row would end a game, leaving no legal move to evaluate.
        games.step([rng.choice(np.flatnonzero(row[:-1])) if row[:-1].any() else games.pass_action for row in now])
    return planes, legal, games


def _go_nets(cuda, config: GoNetConfig, size: int) -> tuple[GoNet, GoNet]:
    torch.manual_seed(0)
    cpu_net = GoNet(config, size)
    return cpu_net, copy.deepcopy(cpu_net).to(cuda)


def test_go_leaf_evaluation_on_cuda_matches_the_cpu(cuda):
    """The search's batched leaf evaluation (``NetEvaluator``, what Go's inference ranks run): the same priors over
    the legal moves and values on both devices, for 256 positions of random 9x9 games in one batch."""
    planes, legal, _ = _go_positions(256, 9, seed=0)
    cpu_net, gpu_net = _go_nets(cuda, GoNetConfig(blocks=2, filters=32), 9)
    with torch.no_grad():  # batch norm's running statistics away from their initial 0 and 1
        for p, b in zip(cpu_net.modules(), gpu_net.modules()):
            if isinstance(p, torch.nn.BatchNorm2d):
                p.running_mean.uniform_(-0.5, 0.5)
                p.running_var.uniform_(0.5, 2.0)
                b.running_mean.copy_(p.running_mean)
                b.running_var.copy_(p.running_var)
    priors_cpu, values_cpu = NetEvaluator(cpu_net)(planes, legal)
    priors_gpu, values_gpu = NetEvaluator(gpu_net, cuda)(planes, legal)
    assert np.all(priors_gpu[~legal] == 0) and np.allclose(priors_gpu.sum(1), 1, atol=1e-5)
    np.testing.assert_allclose(priors_gpu, priors_cpu, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(values_gpu, values_cpu, rtol=1e-4, atol=1e-5)


def test_alphazero_update_on_cuda_matches_the_cpu(cuda):
    """Five AlphaZero updates (policy, value and ownership losses, SGD with momentum and weight decay) on the same
    positions from the same parameters: the same losses and parameters on both devices."""
    planes, legal, games = _go_positions(64, 9, seed=1)
    rng = np.random.default_rng(2)
    pi = rng.dirichlet(np.ones(82), 64).astype(np.float32) * legal
    pi = (pi / pi.sum(1, keepdims=True)).astype(np.float32)
    z = rng.choice([-1.0, 1.0], 64).astype(np.float32)
    ownership = games.area_owners().astype(np.int8)
    scored = rng.random(64) < 0.7
    config = AlphaZeroConfig(replay_positions=64, min_positions=1, batch_size=64, lr=0.02)
    cpu_net, gpu_net = _go_nets(cuda, GoNetConfig(blocks=2, filters=32), 9)
    cpu, gpu = AlphaZeroLearner(cpu_net, config), AlphaZeroLearner(gpu_net, config, device=cuda)
    for _ in range(5):
        on_cpu = cpu.update(planes, pi, z, ownership, scored)
        on_gpu = gpu.update(planes, pi, z, ownership, scored)
        for key, value in on_cpu.items():
            if "loss" in key:
                assert on_gpu[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    for (name, a), b in zip(cpu.net.state_dict().items(), gpu.net.state_dict().values()):
        assert b.device.type == "cuda", name
        torch.testing.assert_close(b.cpu(), a, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.mpi
@pytest.mark.timeout(600)
def test_a_go_job_selfplays_and_learns_on_the_gpu(tmp_path):
    """Real ranks on 5x5 (experiment=go5): the inference rank evaluates the env rank's leaves and the learner trains
    on the GPU (mpi4py's allreduce, as the job above: a GPU node set up by scripts/setup_gpu_node.sh has no
    Horovod); its checkpoints are committed and load on the CPU."""
    cmd = mpirun_command(4, [str(ROOT / "jobs/train.py"), "experiment=go5", "run_name=go", f"runs_dir={tmp_path}",
                             "pipeline.allreduce=mpi", "pipeline.inference_device=cuda",
                             "pipeline.learner_device=cuda"])
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=rank_env(), timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = json.loads((tmp_path / "go/summary.json").read_text())
    assert summary["state"] == "finished" and summary["version"] == 4, summary
    assert summary["devices"] == {"inference": ["cuda:0"], "learner": ["cuda:0"]}, summary["devices"]
    run = open_run(tmp_path / "go")
    assert run.checkpoint_versions == [2, 4]
    on_cpu = AlphaZeroLearner(GoNet(GoNetConfig(blocks=1, filters=8), 5), AlphaZeroConfig())
    on_cpu.load_checkpoint_sections(run.load_checkpoint(4).sections)
    assert on_cpu.version == 4 and all(p.device.type == "cpu" and torch.isfinite(p).all()
                                       for p in on_cpu.net.parameters())
