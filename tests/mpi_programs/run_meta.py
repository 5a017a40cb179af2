"""Shared by the transport test programs: record where the ranks ran and what the transport chose.

Rank 0 writes ``meta.json`` (the pipeline's own writer) into ``$TRANSPORT_META_DIR`` when that is set, so the
multi-host tests can check the hosts and the probe's choice.
"""

import os

from mpi4py import MPI

from hpc_rl.storage.run import write_meta


def write_run_meta(comm, transport) -> None:
    hosts = comm.gather(MPI.Get_processor_name(), root=0)
    if comm.Get_rank() == 0 and os.environ.get("TRANSPORT_META_DIR"):
        write_meta(os.environ["TRANSPORT_META_DIR"], world_size=comm.Get_size(), rank_hosts=hosts,
                   transport=transport.meta())
