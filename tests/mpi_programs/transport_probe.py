"""The start-up probe on this MPI stack: prints, on rank 0, the result every rank agreed on.

argv: backend [assisted]
"""

import json
import sys

from mpi4py import MPI

from hpc_rl.transport import Transport, TransportConfig


def main() -> None:
    comm = MPI.COMM_WORLD
    assisted = sys.argv[2:] == ["assisted"]  # accept RMA that progresses only while the target is in MPI
    transport = Transport(comm, TransportConfig(backend=sys.argv[1], probe_hold_s=0.3,
                                                require_passive_progress=not assisted))
    results = comm.gather(transport.meta(), root=0)
    if comm.Get_rank() == 0:
        print(json.dumps({"agree": all(r == results[0] for r in results), **results[0]}))


main()
