"""``pool.h5``: the opponent pool of a run (past versions and their quality scores), replaced atomically.

    write_pool(run_dir / "pool.h5", versions, qualities, eta=0.01)
    versions, qualities, attrs = read_pool(run_dir / "pool.h5")

A past version's parameters are its checkpoint file (``checkpoints/v<version>.h5``), named in the file beside the
version so that the pool can be read without knowing the naming scheme. The root attribute ``format`` is
``FORMAT``; a file without it (written before the attribute existed) has the same layout and is read, a newer format
is refused (``hdf5.check_format``). docs/FORMAT.md specifies the file.
"""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np

from hpc_rl.storage.checkpoint import checkpoint_name
from hpc_rl.storage.hdf5 import FORMAT_ATTR, check_format, hdf5_image, open_h5, replace_durably, write_new_file

FORMAT = 1  # versions, qualities and checkpoint names; the settings in attributes


def write_pool(path: str | Path, versions: list[int], qualities: list[float], **attrs) -> None:
    """Write the pool crash-safely: a temporary file, flushed and fsynced, then ``os.replace``; a failed write
    leaves no temporary file."""
    path = Path(path)
    if len(versions) != len(qualities):
        raise ValueError(f"{len(versions)} versions and {len(qualities)} qualities")
    if FORMAT_ATTR in attrs:
        raise ValueError(f"the attribute {FORMAT_ATTR!r} is the file's format, not a setting of the pool")

    def fill(f: h5py.File) -> None:
        f.create_dataset("version", data=np.asarray(versions, np.int64), fletcher32=True)
        f.create_dataset("quality", data=np.asarray(qualities, np.float64), fletcher32=True)
        f.create_dataset("checkpoint", data=np.asarray([checkpoint_name(v) for v in versions], dtype=object),
                         dtype=h5py.string_dtype())
        f.attrs[FORMAT_ATTR] = FORMAT
        for key, value in attrs.items():
            f.attrs[key] = value

    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    write_new_file(tmp, (hdf5_image(fill),))
    try:
        replace_durably(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # left only when the replace failed


def read_pool(path: str | Path) -> tuple[list[int], list[float], dict] | None:
    """(versions, qualities, the pool's settings) of a pool file, or None when there is none."""
    path = Path(path)
    if not path.is_file():
        return None
    with open_h5(path, "r") as f:
        check_format(path, "pool.h5", f.attrs.get(FORMAT_ATTR), FORMAT)
        settings = {k: v for k, v in f.attrs.items() if k != FORMAT_ATTR}
        return [int(v) for v in f["version"][()]], [float(q) for q in f["quality"][()]], settings
