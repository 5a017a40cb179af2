"""Train a policy by self-play: one run = one MPI job (see hpc_rl/roles/run.py).

    mpirun -np 6 --oversubscribe python -m mpi4py jobs/train.py run_name=my_run          # local, 6 ranks
    srun --mpi=pmix python -m mpi4py jobs/train.py run_name=my_run topology.env=64 ...  # in an allocation
    mpirun -np 6 python -m mpi4py jobs/train.py env=cartpole run_name=cp                 # the sanity check

An existing run directory (runs/<run_name>) is resumed from its latest good checkpoint. Every rank composes the
same config; the controller (rank 0) writes the run directory.
"""

import os
import sys
from pathlib import Path

from hpc_rl.launch import hold_stop_signals, isolate_shared_memory, launched_rank

hold_stop_signals()  # a USR2 or TERM while this rank starts stops the run at its first version instead of killing it
isolate_shared_memory()  # before anything imports mpi4py.MPI (which initialises MPI)

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from hpc_rl.config import build_config, register  # noqa: E402
from hpc_rl.failures import EXIT_BAD_CONFIG  # noqa: E402

CONF = str(Path(__file__).resolve().parent.parent / "conf")
register()
STDERR = sys.stderr


@hydra.main(version_base="1.3", config_path=CONF, config_name="train")
def main(cfg: DictConfig):
    try:
        config = build_config(cfg)
    except ValueError as err:
        print(f"hpc_rl: bad config: {err}", file=sys.stderr, flush=True)
        sys.exit(EXIT_BAD_CONFIG)
    sys.stderr = STDERR
    from hpc_rl.roles.run import run  # initialises MPI: only once the config is known to be good

    return run(config, overrides=tuple(HydraConfig.get().overrides.task))


if __name__ == "__main__":
    # Every rank composes the same config from the same command line, so a bad one fails alike on every rank: only
    # the job's first rank says why (Hydra's composition errors and build_config's), once; no rank starts MPI.
    if launched_rank() != 0:
        sys.stderr = open(os.devnull, "w")
    main()
