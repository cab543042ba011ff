"""Checkpoints: `accy.save(path, tree)` and `accy.load(path, like=tree)` in safetensors.

Any tree the front end accepts (dicts, lists, tuples, named tuples such as optimizer states,
dataclasses, None) of NamedArrays, NumPy arrays and Python scalars is one safetensors file:
one tensor per leaf, named by the leaf's path (`['params']['w']`, `[0].mu['w']`), each in its
own dtype (bf16 stays BF16; every accy dtype round-trips). The file's metadata holds, as JSON,
each leaf's kind and axis names and the tree's structure, so `load` gives back NamedArrays
with their axes; no pickle anywhere, so loading runs no code from the file.

`save` is atomic: it writes a temporary file in the same folder, fsyncs it and renames it over
`path` (`os.replace`), so a crash or a kill in the middle leaves the previous file intact.
`load(path, like=tree)` checks the file against `like` (the same keys, axes, extents and
dtypes; a `CheckpointError` names the first key that differs) and returns a tree of `like`'s
structure on `like`'s devices; without `like` it rebuilds trees of dicts, lists and tuples.

>>> import accy, numpy as np, os, tempfile
>>> tree = {"w": accy.named(np.ones((2, 3), np.float32), ("in", "out")), "step": 3}
>>> path = os.path.join(tempfile.mkdtemp(), "ckpt.safetensors")
>>> accy.save(path, tree)
>>> back = accy.load(path, like=tree)
>>> back["w"].axes, back["step"]
(('in', 'out'), 3)
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np
import optree
import safetensors

from .core.types import DTYPES, dtype_of_numpy
from .errors import AccyError, CheckpointError
from .frontend.named import NamedArray, named
from .frontend.tracing import NAMESPACE

FORMAT = "accy.checkpoint/1"
_SAFETENSORS_DTYPES = {
    "f32": "F32",
    "f64": "F64",
    "f16": "F16",
    "bf16": "BF16",
    "i32": "I32",
    "i64": "I64",
    "u8": "U8",
    "bool": "BOOL",
}
_ACCY_DTYPES = {v: DTYPES[k] for k, v in _SAFETENSORS_DTYPES.items()}


# -- saving ------------------------------------------------------------------------------------


def save(path: str | os.PathLike, tree: Any) -> None:
    """Write `tree` to `path` as one safetensors file, atomically (see the module's doc).

    >>> import accy, numpy as np, os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "t.safetensors")
    >>> accy.save(path, [accy.named(np.zeros(2, accy.bf16.numpy), ("a",))])
    >>> accy.load(path)[0].dtype
    accy.bf16
    """
    path = os.fspath(path)
    keys, leaves, _ = _flatten(tree)
    arrays, entries = [], []
    for key, leaf in zip(keys, leaves, strict=True):
        array, entry = _encode_leaf(key, leaf)
        arrays.append(array)
        entries.append(entry)
    metadata = {
        "format": FORMAT,
        "leaves": json.dumps(entries),
        "structure": json.dumps(_structure(tree, "")),
    }
    specs = {
        key: safetensors.TensorSpec(
            dtype=array.dtype.name,
            shape=list(array.shape),
            data_ptr=array.ctypes.data,
            data_len=array.nbytes,
        )
        for key, array in zip(keys, arrays, strict=True)
    }
    _write_atomically(path, specs, metadata, arrays)


def _flatten(tree: Any) -> tuple[list[str], list[Any], Any]:
    leaves, treedef = optree.tree_flatten(tree, namespace=NAMESPACE)
    keys = [a.codify("") or "[]" for a in optree.tree_accessors(tree, namespace=NAMESPACE)]
    return keys, leaves, treedef


def _encode_leaf(key: str, leaf: Any) -> tuple[np.ndarray, dict]:
    """The array stored for `leaf` and its metadata entry (kind, axes, dtype)."""
    if isinstance(leaf, NamedArray):
        array = np.asarray(leaf)
        entry = {"key": key, "kind": "named", "axes": list(leaf.axes), "dtype": leaf.dtype.name}
    elif hasattr(leaf, "ty"):
        raise CheckpointError(
            f"save: leaf {key} is a traced value; save concrete arrays, outside accy.jit "
            "(return them from the jitted function first)"
        )
    elif isinstance(leaf, bool | np.bool_) and not isinstance(leaf, np.ndarray):
        array, entry = np.asarray(leaf, np.bool_), {"key": key, "kind": "bool"}
    elif isinstance(leaf, int) and not isinstance(leaf, bool):
        array, entry = _python_int(key, leaf), {"key": key, "kind": "int"}
    elif isinstance(leaf, float):
        array, entry = np.asarray(leaf, np.float64), {"key": key, "kind": "float"}
    elif isinstance(leaf, np.ndarray | np.generic):
        array = np.asarray(leaf)
        kind = "numpy" if isinstance(leaf, np.ndarray) else "numpy_scalar"
        entry = {"key": key, "kind": kind, "dtype": _dtype_name(key, array)}
    else:
        raise CheckpointError(
            f"save: leaf {key} is {type(leaf).__name__}; a checkpoint holds NamedArrays, NumPy "
            "arrays and Python bools, ints and floats (make other values part of the code, or "
            "convert them)"
        )
    if "dtype" not in entry:
        entry["dtype"] = _dtype_name(key, array)
    # C order, and 0-d stays 0-d (np.ascontiguousarray would make it 1-d)
    return (array if array.flags.c_contiguous else array.copy(order="C")), entry


def _python_int(key: str, value: int) -> np.ndarray:
    if not -(2**63) <= value < 2**63:
        raise CheckpointError(f"save: leaf {key} = {value} does not fit in 64 bits")
    return np.asarray(value, np.int64)


def _dtype_name(key: str, array: np.ndarray) -> str:
    try:
        return dtype_of_numpy(array.dtype).name
    except AccyError:
        raise CheckpointError(
            f"save: leaf {key} has NumPy dtype {array.dtype}, which accy has no dtype for; "
            f"convert it to one of {', '.join(DTYPES)}"
        ) from None


def _structure(tree: Any, key: str) -> Any:
    """The tree's shape as JSON when it is made of dicts (str keys), lists, tuples and None;
    named tuples and other nodes are recorded by type name only (loading them needs `like`)."""
    if tree is None:
        return None
    kind = type(tree)
    if kind is dict and all(isinstance(k, str) for k in tree):
        return {"dict": [[k, _structure(v, f"{key}[{k!r}]")] for k, v in tree.items()]}
    if kind in (list, tuple):
        children = [_structure(v, f"{key}[{i}]") for i, v in enumerate(tree)]
        return {kind.__name__: children}
    treedef = optree.tree_structure(tree, namespace=NAMESPACE)
    if treedef.num_nodes == 1 and treedef.num_leaves == 1:
        return {"leaf": key or "[]"}
    return {"node": kind.__qualname__}


def _write_atomically(path: str, specs: dict, metadata: dict, arrays: Sequence[Any]) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    try:
        handle, temporary = tempfile.mkstemp(
            prefix=f".{os.path.basename(path)}.", suffix=".partial", dir=folder
        )
        os.close(handle)
    except OSError as error:
        raise CheckpointError(
            f"save: cannot write in {folder!r} ({error.strerror}); the folder must exist and "
            "be writable"
        ) from None
    try:
        safetensors.serialize_file(specs, temporary, metadata=metadata)
        del arrays  # kept alive until here: the specs point into them
        descriptor = os.open(temporary, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        os.replace(temporary, path)
    except BaseException as error:
        _remove_quietly(temporary)
        if isinstance(error, OSError | safetensors.SafetensorError):
            raise CheckpointError(f"save: writing {path!r} failed: {error}") from None
        raise
    _fsync_folder(folder)


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)


def _fsync_folder(folder: str) -> None:
    """Make the rename durable (POSIX); folders cannot be opened on every system."""
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


# -- loading -----------------------------------------------------------------------------------


def load(path: str | os.PathLike, like: Any = None, device: str | None = None) -> Any:
    """The tree saved at `path`. With `like` (a tree of the saved structure, e.g. freshly
    initialised parameters and `opt.init(params)`), the result has `like`'s structure and
    each NamedArray `like`'s leaf's device; every key, axis, extent and dtype must match.
    Without `like`, NamedArrays go to `device` (default "cpu").

    >>> import accy, numpy as np, os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "t.safetensors")
    >>> accy.save(path, {"b": accy.named(np.zeros(3, np.float32), ("out",))})
    >>> accy.load(path, like={"b": accy.named(np.zeros(4, np.float32), ("out",))})
    Traceback (most recent call last):
    ...
    accy.errors.CheckpointError: load: key ['b'] of ... has extents {'out': 3}; like has {'out': 4}
    """
    path = os.fspath(path)
    entries, tensors, metadata = _read(path)
    if like is None:
        return _rebuild(path, entries, tensors, metadata, device or "cpu")
    keys, leaves, treedef = _flatten(like)
    saved = {e["key"]: e for e in entries}
    missing = [k for k in keys if k not in saved]
    if missing:
        raise CheckpointError(
            f"load: {path!r} has no key {missing[0]} that like has"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
            + "; the file was saved from another tree"
        )
    extra = [k for k in saved if k not in set(keys)]
    if extra:
        raise CheckpointError(
            f"load: {path!r} has key {extra[0]}, which like does not have"
            + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else "")
            + "; the file was saved from another tree"
        )
    values = [
        _decode_like(path, saved[k], tensors[k], leaf, device)
        for k, leaf in zip(keys, leaves, strict=True)
    ]
    return optree.tree_unflatten(treedef, values)


def _read(path: str) -> tuple[list[dict], dict[str, np.ndarray], dict]:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as error:
        raise CheckpointError(f"load: cannot read {path!r} ({error.strerror})") from None
    try:
        content = safetensors.deserialize(data)
    except safetensors.SafetensorError as error:
        raise CheckpointError(
            f"load: {path!r} is not a complete safetensors file ({error}); it may be damaged, "
            "truncated, or another kind of file"
        ) from None
    metadata = _metadata(data)
    if metadata.get("format") != FORMAT:
        raise CheckpointError(
            f"load: {path!r} is a safetensors file but not an accy checkpoint (its metadata "
            f"has format {metadata.get('format')!r}, not {FORMAT!r})"
        )
    try:
        entries = json.loads(metadata["leaves"])
    except (KeyError, ValueError):
        raise CheckpointError(f"load: {path!r} has damaged accy metadata (leaves)") from None
    tensors = {}
    for name, record in content:
        dtype = _ACCY_DTYPES.get(record["dtype"])
        if dtype is None:
            raise CheckpointError(
                f"load: key {name} of {path!r} has safetensors dtype {record['dtype']}, which "
                "accy has no dtype for"
            )
        tensors[name] = np.frombuffer(record["data"], dtype.numpy).reshape(record["shape"])
    for entry in entries:
        if entry.get("key") not in tensors:
            raise CheckpointError(
                f"load: {path!r} lists key {entry.get('key')} in its metadata but holds no "
                "tensor of that name; the file is damaged"
            )
    return entries, tensors, metadata


def _metadata(data: bytes) -> dict:
    """The `__metadata__` of a safetensors file already checked by `deserialize`."""
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + size])
    return header.get("__metadata__") or {}


def _decode(path: str, entry: dict, array: np.ndarray, device: str) -> Any:
    kind = entry.get("kind")
    if entry.get("dtype") != dtype_of_numpy(array.dtype).name:
        raise CheckpointError(
            f"load: key {entry['key']} of {path!r}: the metadata says dtype "
            f"{entry.get('dtype')}, the tensor is {dtype_of_numpy(array.dtype).name}; the file "
            "is damaged"
        )
    array = array.copy()  # writable, and no longer a view of the whole file's bytes
    if kind == "named":
        axes = tuple(entry["axes"])
        if len(axes) != array.ndim:
            raise CheckpointError(
                f"load: key {entry['key']} of {path!r} has {array.ndim} dimensions but "
                f"{len(axes)} axis names; the file is damaged"
            )
        return named(array, axes, device=device)
    if kind == "numpy":
        return array
    if kind == "numpy_scalar":
        return array[()]
    if kind in ("int", "float", "bool"):
        return {"int": int, "float": float, "bool": bool}[kind](array[()])
    raise CheckpointError(f"load: key {entry['key']} of {path!r} has unknown kind {kind!r}")


def _decode_like(path: str, entry: dict, array: np.ndarray, leaf: Any, device: str | None) -> Any:
    key = entry["key"]
    where = f"load: key {key} of {path!r}"
    if isinstance(leaf, NamedArray):
        if entry.get("kind") != "named":
            raise CheckpointError(
                f"{where} holds a {entry.get('kind')} leaf; like has a NamedArray"
            )
        axes = tuple(entry["axes"])
        if axes != leaf.axes:
            raise CheckpointError(f"{where} has axes {axes}; like has {leaf.axes}")
        saved = dict(zip(axes, array.shape, strict=True))
        if saved != leaf.shape:
            raise CheckpointError(f"{where} has extents {saved}; like has {leaf.shape}")
        if entry["dtype"] != leaf.dtype.name:
            raise CheckpointError(f"{where} has dtype {entry['dtype']}; like has {leaf.dtype}")
        return _decode(path, entry, array, device or leaf.device)
    value = _decode(path, entry, array, device or "cpu")
    if isinstance(leaf, np.ndarray | np.generic):
        if not isinstance(value, np.ndarray | np.generic):
            raise CheckpointError(f"{where} holds a {entry['kind']} leaf; like has a NumPy array")
        if value.shape != leaf.shape or value.dtype != leaf.dtype:
            raise CheckpointError(
                f"{where} has shape {value.shape} and dtype {value.dtype}; like has "
                f"{leaf.shape} and {leaf.dtype}"
            )
        return value
    if type(value) is not type(leaf):
        raise CheckpointError(
            f"{where} holds a Python {type(value).__name__}; like has {type(leaf).__name__}"
        )
    return value


def _rebuild(path: str, entries: list[dict], tensors: dict, metadata: dict, device: str) -> Any:
    by_key = {e["key"]: e for e in entries}
    try:
        structure = json.loads(metadata["structure"])
    except (KeyError, ValueError):
        raise CheckpointError(f"load: {path!r} has damaged accy metadata (structure)") from None

    def build(node: Any) -> Any:
        if node is None:
            return None
        if "dict" in node:
            return {k: build(v) for k, v in node["dict"]}
        if "list" in node:
            return [build(v) for v in node["list"]]
        if "tuple" in node:
            return tuple(build(v) for v in node["tuple"])
        if "leaf" in node:
            key = node["leaf"]
            return _decode(path, by_key[key], tensors[key], device)
        raise CheckpointError(
            f"load: {path!r} holds a {node['node']} node, which only like= can rebuild: pass "
            "like=, a tree of the saved structure (e.g. the freshly initialised one)"
        )

    return build(structure)
