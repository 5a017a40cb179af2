"""Nested state (dicts and lists of numpy arrays and plain scalars) to HDF5 groups and back.

A checkpoint section such as an optimizer's state is a tree: dicts and lists whose leaves are numpy arrays or
JSON scalars (int, float, str, bool, None). Arrays become datasets with Fletcher32 checksums; the shape of the tree
and its scalar leaves become a JSON document stored as a checksummed uint8 dataset ``__tree__``, so that every byte
of the section is covered by a checksum (HDF5 attributes are not). Storage knows nothing of torch: callers convert
tensors to numpy first.
"""

from __future__ import annotations

import json
from typing import Any

import h5py
import numpy as np

TREE_DATASET = "__tree__"
_ARRAY = "__array__"
_TUPLE = "__tuple__"


def _encode(node: Any, path: str, arrays: dict[str, np.ndarray]) -> Any:
    if isinstance(node, np.ndarray):
        arrays[path] = node
        return {_ARRAY: path}
    if isinstance(node, np.generic):
        return node.item()
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if not isinstance(key, (str, int)):
                raise TypeError(f"{path or '/'}: keys must be str or int, got {type(key).__name__}")
            # JSON keys are strings: int keys (torch optimizer state is keyed by parameter index) are tagged.
            name = f"i:{key}" if isinstance(key, int) else f"s:{key}"
            out[name] = _encode(value, f"{path}/{key}", arrays)
        return out
    if isinstance(node, (list, tuple)):
        items = [_encode(v, f"{path}/{i}", arrays) for i, v in enumerate(node)]
        return {_TUPLE: items} if isinstance(node, tuple) else items
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    raise TypeError(f"{path or '/'}: cannot store a {type(node).__name__} (convert tensors to numpy first)")


def _decode(node: Any, group: h5py.Group) -> Any:
    if isinstance(node, dict):
        if _ARRAY in node:
            return np.asarray(group[node[_ARRAY].lstrip("/")][()])
        if _TUPLE in node:
            return tuple(_decode(v, group) for v in node[_TUPLE])
        return {(int(k[2:]) if k.startswith("i:") else k[2:]): _decode(v, group) for k, v in node.items()}
    if isinstance(node, list):
        return [_decode(v, group) for v in node]
    return node


def write_tree(group: h5py.Group, tree: Any) -> None:
    """Write ``tree`` below ``group``: one Fletcher32 dataset per array plus the checksummed ``__tree__`` document."""
    arrays: dict[str, np.ndarray] = {}
    skeleton = _encode(tree, "", arrays)
    for path, array in arrays.items():
        array = np.asarray(array)
        # Fletcher32 needs a chunked layout; scalars (shape ()) cannot be chunked and are stored contiguous,
        # still covered by the file's content hash.
        kwargs = {"fletcher32": True, "chunks": True} if array.ndim and array.size else {}
        group.create_dataset(path.lstrip("/"), data=array, **kwargs)
    doc = np.frombuffer(json.dumps(skeleton, sort_keys=True).encode(), dtype=np.uint8)
    group.create_dataset(TREE_DATASET, data=doc, fletcher32=True, chunks=True)


def read_tree(group: h5py.Group) -> Any:
    """The tree written by ``write_tree``; h5py raises OSError when a checksum does not match."""
    skeleton = json.loads(group[TREE_DATASET][()].tobytes().decode())
    return _decode(skeleton, group)
