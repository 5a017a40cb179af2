"""``pool.h5``: the opponent pool of a run (past versions and their quality scores), replaced atomically.

    write_pool(run_dir / "pool.h5", versions, qualities, eta=0.01)
    versions, qualities, attrs = read_pool(run_dir / "pool.h5")

A past version's parameters are its checkpoint file (``checkpoints/v<version>.h5``), named in the file beside the
version so that the pool can be read without knowing the naming scheme. Like a checkpoint, the file is written whole
and starts with a digest header (``hdf5.Digested``): a read checks it before HDF5 parses a byte, and parses the
checked bytes from memory, so a damaged file is a ``DamagedFileError`` naming it, never an h5py error, zeros read
for lost data or a crash. A file of format 1 (no header: it starts with HDF5's signature, written before the
header existed; or without the ``format`` attribute, written before that existed) is read unchecked; a newer format
is refused (``FormatError``). docs/FORMAT.md specifies the file.
"""

from __future__ import annotations

import io
from pathlib import Path

import h5py
import numpy as np

from hpc_rl.storage.checkpoint import checkpoint_name
from hpc_rl.storage.hdf5 import (FORMAT_ATTR, PARSE_ERRORS, DamagedFileError, Digested, check_format,
                                 is_bare_hdf5)

FORMAT = 2  # 2: the digest header in the user block; 1: versions, qualities and checkpoint names without it
DIGEST = Digested("pool.h5", FORMAT)


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

    DIGEST.write(path, fill)


def read_pool(path: str | Path) -> tuple[list[int], list[float], dict] | None:
    """(versions, qualities, the pool's settings) of a pool file, or None when there is none. Raises
    DamagedFileError when the file cannot be trusted, FormatError when it is newer than this code."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        data = path.read_bytes()  # a directory in its place too
    except OSError as err:
        raise DamagedFileError(f"{path}: unreadable ({err})") from err
    laid_out_as = 1 if is_bare_hdf5(data) else FORMAT
    if laid_out_as == FORMAT:
        check_format(path, "pool.h5", DIGEST.header_format(data), FORMAT)
        if (wrong := DIGEST.why_refused(data)) is not None:
            raise DamagedFileError(f"{path}: {wrong}")
    try:
        with h5py.File(io.BytesIO(data), "r") as f:
            found = check_format(path, "pool.h5", f.attrs.get(FORMAT_ATTR), FORMAT)
            if found != laid_out_as and not (found is None and laid_out_as == 1):
                raise DamagedFileError(f"{path}: format {found} in a file laid out as format {laid_out_as}")
            settings = {k: v for k, v in f.attrs.items() if k != FORMAT_ATTR}
            versions, qualities = f["version"][()], f["quality"][()]
            names = [n.decode() if isinstance(n, bytes) else str(n) for n in f["checkpoint"][()]]
    except DamagedFileError:
        raise
    except PARSE_ERRORS as err:
        raise DamagedFileError(f"{path}: unreadable ({type(err).__name__}: {err})") from err
    # What a format 1 file (unchecked) can still get wrong without HDF5 noticing: lengths, names, impossible values.
    if (versions.ndim, qualities.ndim) != (1, 1) or not len(versions) == len(qualities) == len(names):
        raise DamagedFileError(f"{path}: {versions.shape} versions, {qualities.shape} qualities, {len(names)} names")
    if (versions < 0).any() or not np.isfinite(qualities).all() or names != [checkpoint_name(int(v)) for v in versions]:
        raise DamagedFileError(f"{path}: versions, qualities and checkpoint names do not agree")
    return [int(v) for v in versions], [float(q) for q in qualities], settings
