"""One scenario of ``channel_scenarios.py`` on MPI ranks: every rank runs its part, rank 0 prints the report.

argv: scenario (ring, occupancy, ring_misuse, step, params, idle), then the scenario's own argv, the backend first.
Prints one JSON line on rank 0: ``backend`` (the one the transport chose) and the scenario's report. With
TRANSPORT_META_DIR set, rank 0 also writes the run's meta.json there (backend and probe result, the host of every
rank, the SLURM_* variables).
"""

import json
import sys

from mpi4py import MPI

from channel_scenarios import SCENARIOS
from run_meta import write_run_meta

from hpc_rl.transport import Transport


def main() -> None:
    scenario = SCENARIOS[sys.argv[1]](sys.argv[2:])
    comm = MPI.COMM_WORLD
    transport = Transport(comm, scenario.config)
    write_run_meta(comm, transport)
    results = comm.gather(scenario.run(comm, transport), root=0)
    if comm.Get_rank() == 0:
        print(json.dumps({"backend": transport.backend, **scenario.report(results)}))


main()
