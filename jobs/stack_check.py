"""Check that a Hydra sweep reaches Slurm as one array job whose members are MPI jobs.

    python jobs/stack_check.py -m member=0,1 hydra/launcher=local_slurm hydra.launcher.tasks_per_node=3

Every rank of every member writes ``stack_check_rank<k>.json`` (its rank, world size, Slurm array job and task)
into the member's output directory and the member fails if Slurm started more tasks than MPI sees, the symptom of
srun launched without an MPI plugin. Use it on a new site before spending an allocation on a sweep.
"""

import json
import os
from pathlib import Path

from hpc_rl.launch import isolate_shared_memory

isolate_shared_memory()  # before mpi4py.MPI is imported

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

CONF = str(Path(__file__).resolve().parent.parent / "conf")


@hydra.main(version_base="1.3", config_path=CONF, config_name="stack_check")
def main(cfg: DictConfig) -> dict:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    ntasks = int(os.environ.get("SLURM_NTASKS", comm.Get_size()))
    if ntasks != comm.Get_size():
        raise RuntimeError(f"Slurm started {ntasks} tasks but MPI sees a world of {comm.Get_size()}: "
                           "launch srun with --mpi=pmix (SLURM_MPI_TYPE=pmix)")
    report = {
        "member": cfg.member,
        "rank": comm.Get_rank(),
        "size": comm.Get_size(),
        "array_job": os.environ.get("SLURM_ARRAY_JOB_ID"),
        "array_task": os.environ.get("SLURM_ARRAY_TASK_ID"),
    }
    out = Path(HydraConfig.get().runtime.output_dir) / f"stack_check_rank{comm.Get_rank()}.json"
    out.write_text(json.dumps(report))
    comm.Barrier()
    return report


if __name__ == "__main__":
    main()
