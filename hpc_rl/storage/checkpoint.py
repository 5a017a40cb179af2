"""HDF5 checkpoints committed atomically, verified on load, with fallback to the previous good one.

One file per committed policy version, ``checkpoints/v000123.h5``::

    /<section>/...        one group per section (params, optimizer, normalizer, rng, ...), see ``tree.py``
    attrs: format, version, config_hash, content_hash

A commit writes a temporary file, flushes and fsyncs it, ``os.replace``s it to its name, fsyncs the directory, then
replaces ``latest`` (a text file naming the checkpoint) the same way. A crash at any point leaves ``latest`` naming a
complete checkpoint: the old one or the new one. Datasets carry Fletcher32 checksums; the content hash (SHA-256 over
every dataset's name, dtype, shape and bytes, and the attributes) also covers what Fletcher32 does not.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from hpc_rl.storage.hdf5 import FileBusyError, open_h5
from hpc_rl.storage.tree import read_tree, write_tree

FORMAT = 1
LATEST = "latest"
_NAME = re.compile(r"^v(\d{6,})\.h5$")
log = logging.getLogger(__name__)

# The stages of a commit, in order; ``on_stage`` is called as each is reached (tests kill the writer there).
COMMIT_STAGES = ("tmp_written", "tmp_synced", "replaced", "dir_synced", "latest_tmp_written", "latest_replaced",
                 "committed")


class CheckpointError(Exception):
    """A checkpoint that cannot be trusted: unreadable, truncated, checksum or content-hash mismatch."""


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    version: int
    config_hash: str
    content_hash: str
    sections: dict[str, Any]


def checkpoint_name(version: int) -> str:
    if version < 0:
        raise ValueError(f"version must be >= 0, got {version}")
    return f"v{version:06d}.h5"


def checkpoint_version(path: str | Path) -> int | None:
    m = _NAME.match(Path(path).name)
    return int(m.group(1)) if m else None


def _content_hash(f: h5py.File) -> str:
    h = hashlib.sha256()
    for key in ("format", "version", "config_hash"):
        h.update(f"{key}={f.attrs[key]!r};".encode())
    names: list[str] = []
    f.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
    for name in sorted(names):
        data = np.asarray(f[name][()])
        h.update(f"{name}:{data.dtype.str}:{data.shape};".encode())
        h.update(data.tobytes())
    return h.hexdigest()


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _replace_durably(tmp: Path, final: Path) -> None:
    os.replace(tmp, final)
    _fsync_path(final.parent)


def commit_checkpoint(directory: str | Path, version: int, sections: dict[str, Any], config_hash: str,
                      on_stage: Callable[[str], None] | None = None) -> Path:
    """Write the checkpoint of ``version`` into ``directory`` and make ``latest`` name it, crash-safely."""
    stage = on_stage or (lambda _name: None)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / checkpoint_name(version)
    tmp = directory / f".{final.name}.{os.getpid()}.tmp"
    with open_h5(tmp, "w") as f:
        f.attrs["format"] = FORMAT
        f.attrs["version"] = int(version)
        f.attrs["config_hash"] = str(config_hash)
        for name, tree in sections.items():
            write_tree(f.create_group(name), tree)
        f.attrs["content_hash"] = _content_hash(f)
        f.flush()
    stage("tmp_written")
    _fsync_path(tmp)
    stage("tmp_synced")
    os.replace(tmp, final)
    stage("replaced")
    _fsync_path(directory)
    stage("dir_synced")
    latest_tmp = directory / f".{LATEST}.{os.getpid()}.tmp"
    with open(latest_tmp, "w") as fh:
        fh.write(final.name + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    stage("latest_tmp_written")
    os.replace(latest_tmp, directory / LATEST)
    stage("latest_replaced")
    _fsync_path(directory)
    stage("committed")
    return final


def load_checkpoint(path: str | Path, config_hash: str | None = None) -> Checkpoint:
    """Load and verify one checkpoint; raise CheckpointError saying why it cannot be trusted."""
    path = Path(path)
    try:
        with open_h5(path, "r") as f:
            missing = [k for k in ("format", "version", "config_hash", "content_hash") if k not in f.attrs]
            if missing:
                raise CheckpointError(f"{path}: not a complete checkpoint (attributes {missing} missing)")
            if int(f.attrs["format"]) != FORMAT:
                raise CheckpointError(f"{path}: format {f.attrs['format']}, this version reads format {FORMAT}")
            stored = str(f.attrs["content_hash"])
            actual = _content_hash(f)
            if actual != stored:
                raise CheckpointError(f"{path}: content hash mismatch (stored {stored[:12]}, computed {actual[:12]})")
            sections = {name: read_tree(f[name]) for name in f.keys()}
            version, stored_config = int(f.attrs["version"]), str(f.attrs["config_hash"])
    except (CheckpointError, FileBusyError):  # a busy file is not a bad one: no fallback to an older version
        raise
    except (OSError, KeyError, ValueError) as err:  # h5py raises OSError on truncation and checksum errors
        raise CheckpointError(f"{path}: unreadable ({err})") from err
    if config_hash is not None and stored_config != config_hash:
        raise CheckpointError(f"{path}: written by config {stored_config[:12]}, this run's config is {config_hash[:12]}")
    if checkpoint_version(path) not in (None, version):
        raise CheckpointError(f"{path}: file name says version {checkpoint_version(path)}, content says {version}")
    return Checkpoint(path, version, stored_config, stored, sections)


def committed_versions(directory: str | Path) -> list[int]:
    """Versions of the checkpoint files in ``directory``, ascending (temporary files excluded)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(v for p in directory.iterdir() if (v := checkpoint_version(p)) is not None)


def load_latest(directory: str | Path, config_hash: str | None = None) -> Checkpoint | None:
    """The checkpoint ``latest`` names, or else the newest one that verifies, saying which were refused and why.

    Returns None when the directory holds no checkpoint; raises CheckpointError when checkpoints exist and none
    verifies (resuming from scratch would silently lose a run).
    """
    directory = Path(directory)
    candidates: list[Path] = []
    latest = directory / LATEST
    if latest.is_file():
        candidates.append(directory / latest.read_text().strip())
    candidates += [directory / checkpoint_name(v) for v in reversed(committed_versions(directory))
                   if directory / checkpoint_name(v) not in candidates]
    refused = []
    for path in candidates:
        try:
            ckpt = load_checkpoint(path, config_hash)
        except (CheckpointError, FileNotFoundError) as err:
            refused.append(str(err))
            log.warning("checkpoint refused: %s", err)
            continue
        if refused:
            log.warning("resuming from %s instead (%d newer checkpoint(s) refused)", path.name, len(refused))
        return ckpt
    if refused:
        raise CheckpointError("no checkpoint verifies:\n  " + "\n  ".join(refused))
    return None


def prune_checkpoints(directory: str | Path, keep_last: int, keep_every: int) -> list[int]:
    """Delete checkpoints but the last ``keep_last`` and every ``keep_every``-th version; return deleted versions.

    The checkpoint ``latest`` names is never deleted; leftover temporary files of interrupted commits are removed.
    """
    if keep_last < 1 or keep_every < 1:
        raise ValueError(f"keep_last and keep_every must be >= 1, got {keep_last}, {keep_every}")
    directory = Path(directory)
    latest = directory / LATEST
    pinned = checkpoint_version(latest.read_text().strip()) if latest.is_file() else None
    versions = committed_versions(directory)
    keep = set(versions[-keep_last:]) | {v for v in versions if v % keep_every == 0} | {pinned}
    deleted = [v for v in versions if v not in keep]
    for v in deleted:
        (directory / checkpoint_name(v)).unlink()
    for tmp in directory.glob(".*.tmp"):
        tmp.unlink()
    if deleted:
        _fsync_path(directory)
    return deleted
