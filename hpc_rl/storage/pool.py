"""``pool.h5``: the opponent pool of a run (past versions and their quality scores), replaced atomically.

    write_pool(run_dir / "pool.h5", versions, qualities, eta=0.01)
    versions, qualities, attrs = read_pool(run_dir / "pool.h5")

A past version's parameters are its checkpoint file (``checkpoints/v<version>.h5``), named in the file beside the
version so that the pool can be read without knowing the naming scheme.
"""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np

from hpc_rl.storage.checkpoint import _fsync_path, _replace_durably, checkpoint_name
from hpc_rl.storage.hdf5 import open_h5


def write_pool(path: str | Path, versions: list[int], qualities: list[float], **attrs) -> None:
    """Write the pool crash-safely: a temporary file, flushed and fsynced, then ``os.replace``."""
    path = Path(path)
    if len(versions) != len(qualities):
        raise ValueError(f"{len(versions)} versions and {len(qualities)} qualities")
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    with open_h5(tmp, "w") as f:
        f.create_dataset("version", data=np.asarray(versions, np.int64), fletcher32=True)
        f.create_dataset("quality", data=np.asarray(qualities, np.float64), fletcher32=True)
        f.create_dataset("checkpoint", data=np.asarray([checkpoint_name(v) for v in versions], dtype=object),
                         dtype=h5py.string_dtype())
        for key, value in attrs.items():
            f.attrs[key] = value
        f.flush()
    _fsync_path(tmp)
    _replace_durably(tmp, path)


def read_pool(path: str | Path) -> tuple[list[int], list[float], dict] | None:
    """(versions, qualities, attributes) of a pool file, or None when there is none."""
    path = Path(path)
    if not path.is_file():
        return None
    with open_h5(path, "r") as f:
        return ([int(v) for v in f["version"][()]], [float(q) for q in f["quality"][()]], dict(f.attrs))
