"""Files on the shared filesystem: HDF5 checkpoints, metrics.h5, and a reader for analysis.

Storage does not know who writes: callers pass numpy trees (see ``tree.py``). In a run only the controller writes,
holding the run lock (``runlock.py``). Every HDF5 open retries another process's lock (``hdf5.open_h5``). On
parallel filesystems without flock set ``HDF5_USE_FILE_LOCKING=FALSE``. ``hpc_rl.storage.tensorboard`` writes
metrics as TensorBoard event files when the optional ``tensorboard`` package is installed.
"""

from hpc_rl.storage.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointWriteError,
    commit_checkpoint,
    load_checkpoint,
    load_latest,
    prune_checkpoints,
)
from hpc_rl.storage.metrics import MetricsWriter, read_metrics
from hpc_rl.storage.pool import read_pool, write_pool
from hpc_rl.storage.run import Run, open_run, write_meta

__all__ = [
    "Checkpoint", "CheckpointError", "CheckpointWriteError", "commit_checkpoint", "load_checkpoint", "load_latest",
    "prune_checkpoints",
    "MetricsWriter", "read_metrics", "read_pool", "write_pool", "Run", "open_run", "write_meta",
]
