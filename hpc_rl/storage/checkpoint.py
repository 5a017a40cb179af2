"""HDF5 checkpoints committed atomically, verified on load, with fallback to the previous good one.

One file per committed policy version, ``checkpoints/v000123.h5``::

    bytes 0-511           the digest header (HDF5's user block, which the library skips), three lines and NULs:
                              hpc_rl checkpoint 2
                              size <n>
                              blake2b-256 <64 hex digits>
    bytes 512-            the HDF5 file: n bytes, their BLAKE2b-256 digest in the header
      /<section>/...      one group per section (params, optimizer, normalizer, rng, ...), see ``tree.py``
      attrs: format, version, config_hash, content_hash, config (the run's settings as JSON)

A load reads the whole file and checks the header and the digest before HDF5 parses a byte: HDF5 trusts its own
metadata, and a damaged file can make it raise anything or crash the process (a zeroed block of a few KiB has
segfaulted a reader). Only bytes that are exactly the committed ones reach h5py, and they are parsed from memory, so
the file cannot change between the check and the parse. Any error still raised while parsing is a CheckpointError.
The digest lives in the file itself rather than beside it or in ``latest``: a copied, moved or pruned checkpoint
keeps its digest, no second file can go missing or disagree, and every version (not only the one ``latest``
names) can be verified, as the evaluator, the opponent pool and the fallback need. A file without the header (it
starts with HDF5's signature) predates digests (format 1): it still loads, so that runs written before digests
resume, but its bytes cannot be checked before HDF5 parses them, and the load says so in the log. A header naming
a format newer than ``FORMAT`` is refused with both versions named. docs/FORMAT.md specifies the file.

A commit builds the file in memory, writes it to a temporary file, flushes and fsyncs it, ``os.replace``s it to its
name, fsyncs the directory, then replaces ``latest`` (a text file naming the checkpoint) the same way. A crash at
any point leaves ``latest`` naming a complete checkpoint: the old one or the new one. A failed write (a full
filesystem) removes its temporary file and raises CheckpointWriteError, one line naming the file, the cause and the
bytes it needed; HDF5 never writes to the filesystem itself, since it can crash closing a file after ENOSPC.
Datasets also carry Fletcher32 checksums, and the content hash (SHA-256 over every dataset's name, dtype, shape and
bytes, and the attributes) names the content whatever its HDF5 layout.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from hpc_rl.storage.hdf5 import (HEADER_BYTES, PARSE_ERRORS, Digested, fsync_path, hdf5_image, is_bare_hdf5,
                                 write_new_file)
from hpc_rl.storage.tree import read_tree, write_tree

FORMAT = 2  # 2: the digest header in the user block; 1 had none
LEGACY_FORMAT = 1  # still loaded, unverified
DIGEST = Digested("checkpoint", FORMAT)
LATEST = "latest"
_NAME = re.compile(r"^v(\d{6,})\.h5$")
log = logging.getLogger(__name__)

# The stages of a commit, in order; ``on_stage`` is called as each is reached (tests kill the writer there).
COMMIT_STAGES = ("image_built", "tmp_written", "tmp_synced", "replaced", "dir_synced", "latest_tmp_written",
                 "latest_replaced", "committed")


class CheckpointError(Exception):
    """A checkpoint that cannot be trusted: unreadable, truncated, digest, checksum or content-hash mismatch. Whether
    its settings suit a run is decided by the run (``hpc_rl.config.setting_changes``), not here."""


class CheckpointWriteError(OSError):
    """A commit that could not write its files (a full filesystem, a quota); its temporary file is removed."""


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    version: int
    config_hash: str
    content_hash: str
    sections: dict[str, Any]
    config: dict[str, Any] | None  # the settings of the run that wrote it (None: written before checkpoints held them)


def checkpoint_name(version: int) -> str:
    if version < 0:
        raise ValueError(f"version must be >= 0, got {version}")
    return f"v{version:06d}.h5"


def checkpoint_version(path: str | Path) -> int | None:
    m = _NAME.match(Path(path).name)
    return int(m.group(1)) if m else None


def digest_header(payload: bytes | memoryview) -> bytes:
    """The user block of a checkpoint whose HDF5 bytes (after the user block) are ``payload``."""
    return DIGEST.header(payload)


def verify_digest(data: bytes) -> str | None:
    """Why the bytes of a checkpoint file (format 2) are not the committed ones, or None when they are."""
    return DIGEST.why_refused(data)


def _content_hash(f: h5py.File) -> str:
    h = hashlib.sha256()
    for key in ("format", "version", "config_hash", "config"):
        if key in f.attrs:  # ``config`` since checkpoints hold their settings; an older file's hash is unchanged
            h.update(f"{key}={f.attrs[key]!r};".encode())
    names: list[str] = []
    f.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
    for name in sorted(names):
        data = np.asarray(f[name][()])
        h.update(f"{name}:{data.dtype.str}:{data.shape};".encode())
        h.update(data.tobytes())
    return h.hexdigest()


def _latest_name(directory: Path) -> str | None:
    """The checkpoint file name ``latest`` holds, or None when it is missing or does not hold one."""
    try:
        name = (directory / LATEST).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return name if checkpoint_version(name) is not None else None


def _write_failure(path: Path, err: OSError, size: int, latest: str | None) -> str:
    """One line: which file could not be written, why, the space it needed, and what ``latest`` still names."""
    cause = err.strerror or " ".join(str(err).split())
    return (f"cannot write {path}: {cause} (errno {err.errno}); it needs {size} bytes "
            f"({size / 2**20:.1f} MiB) free on {path.parent}; latest still names {latest or 'no checkpoint'}")


def commit_checkpoint(directory: str | Path, version: int, sections: dict[str, Any], config_hash: str,
                      on_stage: Callable[[str], None] | None = None, config: dict[str, Any] | None = None) -> Path:
    """Write the checkpoint of ``version`` into ``directory`` and make ``latest`` name it, crash-safely. ``config``:
    the run's settings (JSON-serialisable), which a resume compares with its own.

    Raises CheckpointWriteError when a file cannot be written (no temporary file is left; ``latest`` is unchanged).
    """
    stage = on_stage or (lambda _name: None)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / checkpoint_name(version)

    def fill(f: h5py.File) -> None:
        f.attrs["format"] = FORMAT
        f.attrs["version"] = int(version)
        f.attrs["config_hash"] = str(config_hash)
        if config is not None:
            f.attrs["config"] = json.dumps(config, sort_keys=True)
        for name, tree in sections.items():
            write_tree(f.create_group(name), tree)
        f.attrs["content_hash"] = _content_hash(f)

    image = hdf5_image(fill, userblock=HEADER_BYTES)
    stage("image_built")
    payload = image[HEADER_BYTES:]
    tmp = directory / f".{final.name}.{os.getpid()}.tmp"
    try:
        write_new_file(tmp, (digest_header(payload), payload), lambda: stage("tmp_written"))
        stage("tmp_synced")
        os.replace(tmp, final)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise CheckpointWriteError(_write_failure(final, err, len(image), _latest_name(directory))) from err
    stage("replaced")
    fsync_path(directory)
    stage("dir_synced")
    latest_tmp = directory / f".{LATEST}.{os.getpid()}.tmp"
    previous = _latest_name(directory)
    try:
        write_new_file(latest_tmp, ((final.name + "\n").encode(),))
        stage("latest_tmp_written")
        os.replace(latest_tmp, directory / LATEST)
    except OSError as err:
        latest_tmp.unlink(missing_ok=True)
        raise CheckpointWriteError(_write_failure(directory / LATEST, err, len(final.name) + 1, previous)) from err
    stage("latest_replaced")
    fsync_path(directory)
    stage("committed")
    return final


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Load and verify one checkpoint; raise CheckpointError saying why it cannot be trusted.

    The file's bytes are checked against its digest before HDF5 parses them (see the module's docstring); a format 1
    file, which has none, is parsed unchecked."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise CheckpointError(f"{path}: unreadable ({err})") from err
    expected_format = LEGACY_FORMAT if is_bare_hdf5(data) else FORMAT
    if expected_format == LEGACY_FORMAT:
        log.warning("%s: written before checkpoints carried a digest (format %d): parsed without checking its bytes",
                    path, LEGACY_FORMAT)
    elif (wrong := verify_digest(data)) is not None:
        raise CheckpointError(f"{path}: {wrong}")
    try:
        with h5py.File(io.BytesIO(data), "r") as f:
            missing = [k for k in ("format", "version", "config_hash", "content_hash") if k not in f.attrs]
            if missing:
                raise CheckpointError(f"{path}: not a complete checkpoint (attributes {missing} missing)")
            if int(f.attrs["format"]) != expected_format:
                raise CheckpointError(f"{path}: format {f.attrs['format']} in a file laid out as format "
                                      f"{expected_format}")
            stored = str(f.attrs["content_hash"])
            actual = _content_hash(f)
            if actual != stored:
                raise CheckpointError(f"{path}: content hash mismatch (stored {stored[:12]}, computed {actual[:12]})")
            sections = {name: read_tree(f[name]) for name in f.keys()}
            version, config_hash = int(f.attrs["version"]), str(f.attrs["config_hash"])
            config = json.loads(f.attrs["config"]) if "config" in f.attrs else None
    except CheckpointError:
        raise
    except PARSE_ERRORS as err:
        raise CheckpointError(f"{path}: unreadable ({type(err).__name__}: {err})") from err
    if checkpoint_version(path) not in (None, version):
        raise CheckpointError(f"{path}: file name says version {checkpoint_version(path)}, content says {version}")
    return Checkpoint(path, version, config_hash, stored, sections, config)


def committed_versions(directory: str | Path) -> list[int]:
    """Versions of the checkpoint files in ``directory``, ascending (temporary files excluded)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(v for p in directory.iterdir() if (v := checkpoint_version(p)) is not None)


def load_latest(directory: str | Path) -> Checkpoint | None:
    """The checkpoint ``latest`` names, or else the newest one that verifies, saying which were refused and why.

    Returns None when the directory holds no checkpoint; raises CheckpointError when checkpoints exist and none
    verifies (resuming from scratch would silently lose a run).
    """
    directory = Path(directory)
    candidates: list[Path] = []
    named = _latest_name(directory)
    if named is not None:
        candidates.append(directory / named)
    elif (directory / LATEST).exists():
        log.warning("checkpoint refused: %s names no checkpoint file; trying every checkpoint, newest first",
                    directory / LATEST)
    candidates += [directory / checkpoint_name(v) for v in reversed(committed_versions(directory))
                   if directory / checkpoint_name(v) not in candidates]
    refused = []
    for path in candidates:
        try:
            ckpt = load_checkpoint(path)
        except CheckpointError as err:  # a missing file too (pruned since the listing)
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
    named = _latest_name(directory)
    pinned = None if named is None else checkpoint_version(named)
    versions = committed_versions(directory)
    keep = set(versions[-keep_last:]) | {v for v in versions if v % keep_every == 0} | {pinned}
    deleted = [v for v in versions if v not in keep]
    for v in deleted:
        (directory / checkpoint_name(v)).unlink()
    for tmp in directory.glob(".*.tmp"):
        tmp.unlink()
    if deleted:
        fsync_path(directory)
    return deleted
