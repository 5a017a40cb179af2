"""Every rank reports itself; rank 0 prints one JSON line with the allreduced rank sum and all reports."""

import json
import os
import socket

from mpi4py import MPI

comm = MPI.COMM_WORLD
report = {
    "rank": comm.Get_rank(),
    "size": comm.Get_size(),
    "host": socket.gethostname(),
    "array_task": os.environ.get("SLURM_ARRAY_TASK_ID"),
    "job": os.environ.get("SLURM_JOB_ID"),
}
rank_sum = comm.allreduce(comm.Get_rank())
reports = comm.gather(report, root=0)
if comm.Get_rank() == 0:
    print(json.dumps({"rank_sum": rank_sum, "ranks": reports}), flush=True)
