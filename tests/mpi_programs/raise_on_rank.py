"""Rank 1 raises while every other rank waits in a blocking receive that will never be answered.

Under ``python -m mpi4py`` the uncaught exception calls MPI_Abort, which must end the whole job quickly.
"""

import sys
import time

from mpi4py import MPI

comm = MPI.COMM_WORLD
failing = int(sys.argv[1]) if len(sys.argv) > 1 else 1
if comm.Get_rank() == failing:
    time.sleep(0.5)
    raise RuntimeError(f"deliberate failure on rank {failing}")
comm.recv(source=failing)  # never sent: only the abort ends this
