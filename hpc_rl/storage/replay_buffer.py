"""``replay_buffer/learner<k>.h5``: a Go learner's replay buffer, so that a resumed run trains on the games it held.

    write_replay_buffer(path, {"planes": ..., "pi": ..., ...}, version=4400)
    arrays, attrs = read_replay_buffer(path)          # None when there is no file

AlphaZero's learners sample a buffer of recent games (200,000 positions in ``experiment=go9``, ~40 minutes of
self-play on 2 cores). A run resumed without it would start from an empty buffer and train its first updates on the
first few games again and again (``alphazero.target_reuse`` times each), as a new run does, but with a trained
network that then overfits them. Each learner writes its buffer at every checkpoint and at its last version, and
reads it back when the run resumes. KataGo keeps its self-play data on disk for the same reason.

Written whole, as ``pool.h5`` is: a temporary file with a digest header (``hdf5.Digested``), fsynced, then
``os.replace``, so a reader sees the old buffer or the new one and a damaged file is a ``DamagedFileError`` naming it.
The file is a cache of self-play data, not committed state: the learner sets a damaged one aside and starts empty.
A float array whose values are all 0 or 1 (the input planes) is stored as uint8 and read back as float32, a quarter
of the bytes. docs/FORMAT.md specifies the file.
"""

from __future__ import annotations

import io
from pathlib import Path

import h5py
import numpy as np

from hpc_rl.storage.hdf5 import FORMAT_ATTR, PARSE_ERRORS, DamagedFileError, Digested, check_format

FORMAT = 1
DIGEST = Digested("replay_buffer", FORMAT, first=1)
BINARY_ATTR = "binary_float"  # a dataset stored as uint8 whose values were float 0 and 1


def write_replay_buffer(path: str | Path, arrays: dict[str, np.ndarray], **attrs) -> None:
    """Replace ``path`` with ``arrays`` (equal first dimensions: one row per position) and ``attrs``, crash-safely."""
    path = Path(path)
    rows = {len(a) for a in arrays.values()}
    if len(rows) > 1:
        raise ValueError(f"replay buffer arrays of different lengths: { {k: len(a) for k, a in arrays.items()} }")
    if FORMAT_ATTR in attrs:
        raise ValueError(f"the attribute {FORMAT_ATTR!r} is the file's format")

    def fill(f: h5py.File) -> None:
        for name, array in arrays.items():
            binary = array.dtype.kind == "f" and bool(((array == 0) | (array == 1)).all())
            data = array.astype(np.uint8) if binary else array
            chunks = (min(len(data), 4096), *data.shape[1:]) if len(data) else None
            ds = f.create_dataset(name, data=data, chunks=chunks, compression="lzf" if chunks else None,
                                  fletcher32=bool(chunks))
            ds.attrs[BINARY_ATTR] = binary
        f.attrs[FORMAT_ATTR] = FORMAT
        for key, value in attrs.items():
            f.attrs[key] = value

    path.parent.mkdir(parents=True, exist_ok=True)
    DIGEST.write(path, fill)


def read_replay_buffer(path: str | Path) -> tuple[dict[str, np.ndarray], dict] | None:
    """(the arrays, the attributes) of a replay buffer file, or None when there is none. Raises DamagedFileError when
    the file cannot be trusted, FormatError when it is newer than this code."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        data = path.read_bytes()
    except OSError as err:
        raise DamagedFileError(f"{path}: unreadable ({err})") from err
    check_format(path, "replay_buffer", DIGEST.header_format(data), FORMAT)
    if (wrong := DIGEST.why_refused(data)) is not None:
        raise DamagedFileError(f"{path}: {wrong}")
    try:
        with h5py.File(io.BytesIO(data), "r") as f:
            check_format(path, "replay_buffer", f.attrs.get(FORMAT_ATTR), FORMAT)
            attrs = {k: v for k, v in f.attrs.items() if k != FORMAT_ATTR}
            arrays = {name: (ds[()].astype(np.float32) if ds.attrs.get(BINARY_ATTR) else ds[()])
                      for name, ds in f.items()}
    except PARSE_ERRORS as err:
        raise DamagedFileError(f"{path}: unreadable ({type(err).__name__}: {err})") from err
    if len({len(a) for a in arrays.values()}) > 1:
        raise DamagedFileError(f"{path}: arrays of different lengths { {k: len(a) for k, a in arrays.items()} }")
    return arrays, attrs
