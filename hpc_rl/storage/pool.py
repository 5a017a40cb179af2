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

from hpc_rl.storage.checkpoint import checkpoint_name
from hpc_rl.storage.hdf5 import hdf5_image, open_h5, replace_durably, write_new_file


def write_pool(path: str | Path, versions: list[int], qualities: list[float], **attrs) -> None:
    """Write the pool crash-safely: a temporary file, flushed and fsynced, then ``os.replace``; a failed write
    leaves no temporary file."""
    path = Path(path)
    if len(versions) != len(qualities):
        raise ValueError(f"{len(versions)} versions and {len(qualities)} qualities")

    def fill(f: h5py.File) -> None:
        f.create_dataset("version", data=np.asarray(versions, np.int64), fletcher32=True)
        f.create_dataset("quality", data=np.asarray(qualities, np.float64), fletcher32=True)
        f.create_dataset("checkpoint", data=np.asarray([checkpoint_name(v) for v in versions], dtype=object),
                         dtype=h5py.string_dtype())
        for key, value in attrs.items():
            f.attrs[key] = value

    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    write_new_file(tmp, (hdf5_image(fill),))
    try:
        replace_durably(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # left only when the replace failed


def read_pool(path: str | Path) -> tuple[list[int], list[float], dict] | None:
    """(versions, qualities, attributes) of a pool file, or None when there is none."""
    path = Path(path)
    if not path.is_file():
        return None
    with open_h5(path, "r") as f:
        return ([int(v) for v in f["version"][()]], [float(q) for q in f["quality"][()]], dict(f.attrs))
