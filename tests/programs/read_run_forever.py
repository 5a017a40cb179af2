"""Read RUN_DIR's metrics.h5, latest checkpoint and pool.h5 flat out, as analysis would during a run, until the file
STOP exists; then print one JSON line: {"reads": passes, "errors": [...], "first_names": the metric names of the first
read that found any, "names": those of the last read}.

Every read goes through the project's readers (which retry another process's HDF5 lock); any exception is an error.
"""

import json
import sys
import time
from pathlib import Path

from hpc_rl.storage import load_latest, read_metrics, read_pool
from hpc_rl.storage.layout import RunLayout

layout, stop = RunLayout(sys.argv[1]), Path(sys.argv[2])
reads, errors, first_names, names = 0, [], [], []
while not stop.exists():
    try:
        names = sorted(read_metrics(layout.metrics))
        first_names = first_names or names
        load_latest(layout.checkpoints)
        read_pool(layout.pool)
        reads += 1
    except Exception as err:  # noqa: BLE001 - every failure is reported to the test
        errors.append(f"{type(err).__name__}: {err}")
        time.sleep(0.01)
print(json.dumps({"reads": reads, "errors": errors[:20], "first_names": first_names, "names": names}), flush=True)
