"""``isolate_shared_memory`` in a real job: every rank reports the backing directory and the segments in it.

    python -m mpi4py shared_memory_dir.py JOB_ID          (under mpirun)
    python -m mpi4py shared_memory_dir.py                 (under srun)

Under srun the ranks have Slurm's job and step ids; under mpirun JOB_ID stands in for the job id, set here in the
ranks only (an mpirun that saw SLURM_JOB_ID would try to launch through Slurm). Rank 0 prints one JSON line.
"""

import json
import os
import sys

if len(sys.argv) > 1:
    os.environ["SLURM_JOB_ID"] = sys.argv[1]
    os.environ.pop("SLURM_STEP_ID", None)

from hpc_rl.launch import isolate_shared_memory  # noqa: E402

isolate_shared_memory()  # before mpi4py.MPI is imported

from mpi4py import MPI  # noqa: E402

comm = MPI.COMM_WORLD
comm.Barrier()  # every rank's segment exists once every rank got here
directory = os.environ["OMPI_MCA_btl_vader_backing_directory"]
reports = comm.gather({"rank": comm.Get_rank(), "directory": directory, "entries": sorted(os.listdir(directory))},
                      root=0)
if comm.Get_rank() == 0:
    print(json.dumps(reports), flush=True)
