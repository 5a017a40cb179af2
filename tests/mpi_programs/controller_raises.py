"""A training job in which only the controller raises (its config.yaml path is a directory), run as a Hydra sweep
member runs inside submitit: by plain ``python``, not ``python -m mpi4py``, and with the exception caught and the
process left to exit normally, as submitit does. Without run()'s own abort, that rank would wait in MPI_Finalize for
ranks that wait for it: the job would hang instead of failing."""

import sys

from hpc_rl.config import EnvConfig, TrainConfig
from hpc_rl.roles.run import run

try:
    run(TrainConfig(run_name="broken", runs_dir=sys.argv[1], env=EnvConfig(name="gym:CartPole-v1", num_envs=2)))
except Exception:  # submitit records the exception and returns; the job must not outlive it
    pass
