"""A training job in which only the controller raises (its config.yaml path is a directory), run as a Hydra sweep
member runs inside submitit: by plain ``python``, not ``python -m mpi4py``. run() must abort the whole job."""

import sys

from hpc_rl.config import EnvConfig, TrainConfig
from hpc_rl.roles.run import run

run(TrainConfig(run_name="broken", runs_dir=sys.argv[1], env=EnvConfig(name="gym:CartPole-v1", num_envs=2)))
