"""Log 50 metrics per version to metrics.h5 at PATH until a flush fails; print the error's line and end at once.

Ending with ``os._exit`` is what the job does (MPI_Abort): after a failed write, HDF5 can crash the process while
it closes the file. Prints ``version <V>`` after each flush that succeeded."""

import os
import sys

from hpc_rl.storage.metrics import MetricsWriteError, MetricsWriter

writer = MetricsWriter(sys.argv[1])
for version in range(1, 1_000_000):
    writer.log_many({f"family/m{k}": float(version) for k in range(50)}, version, version)
    try:
        writer.flush()
    except MetricsWriteError as err:
        print(f"error {err}", flush=True)
        os._exit(3)
    print(f"version {version}", flush=True)
