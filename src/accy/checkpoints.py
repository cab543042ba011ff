"""Checkpoints: `accy.save(path, tree)` and `accy.load(path, like=tree)` in safetensors.
(`accy.checkpoint`, singular, is rematerialization: gradient checkpointing.)

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

On a mesh, `save(path, tree, mesh=mesh, axis_mapping=mapping)` writes each device's blocks
(as `accy.shard` splits the arrays) to a file of their own and `path` as the index, last;
`load` puts the whole arrays back together, and `load_block(path, like, mesh, mapping, rank)`
gives one device's blocks on any mesh (re-sharding). A save on one mesh loads on another.

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
import uuid
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


def save(
    path: str | os.PathLike,
    tree: Any,
    mesh: Any = None,
    axis_mapping: dict[str, str] | None = None,
) -> None:
    """Write `tree` to `path` as one safetensors file, atomically (see the module's doc).

    With a `mesh` (an `accy.Mesh`) and its `axis_mapping`, every device's blocks go to a file
    of their own (`<path>.<id>.rank<r>-of-<n>.safetensors`, as `accy.shard` splits each array:
    every mapped axis whose extent the devices divide; whole leaves go with rank 0), and
    `path` becomes the index that names them. The index is written last, atomically, so a
    save killed before it leaves the previous checkpoint (index and shards) intact; the
    previous save's shards are removed once the index points at the new ones.

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
    metadata = {"format": FORMAT, "structure": json.dumps(_structure(tree, ""))}
    if mesh is None:
        if axis_mapping is not None:
            raise CheckpointError("save: axis_mapping= needs mesh= (the mesh it maps onto)")
        metadata["leaves"] = json.dumps(entries)
        _write_atomically(path, dict(zip(keys, arrays, strict=True)), metadata)
        return
    _save_sharded(path, keys, arrays, entries, metadata, mesh, axis_mapping or {})


def _specs(arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    return {
        key: safetensors.TensorSpec(
            dtype=array.dtype.name,
            shape=list(array.shape),
            data_ptr=array.ctypes.data,
            data_len=array.nbytes,
        )
        for key, array in arrays.items()
    }


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


def _write_atomically(path: str, arrays: dict[str, np.ndarray], metadata: dict) -> None:
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
        # the specs point into `arrays`, which this frame keeps alive while they are written
        safetensors.serialize_file(_specs(arrays), temporary, metadata=metadata)
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


# -- on a mesh ---------------------------------------------------------------------------------

SHARDED_FORMAT = "accy.checkpoint.sharded/1"


def _mesh_of(mesh: Any, axis_mapping: dict[str, str], where: str):
    from .mesh import Mesh, check_axis_mapping

    if not isinstance(mesh, Mesh):
        raise CheckpointError(f"{where}: mesh= must be an accy.Mesh, got {type(mesh).__name__}")
    return mesh, check_axis_mapping(mesh, axis_mapping)


def _split_axes(entry: dict, shape: Sequence[int], mesh: Any, axis_mapping: dict) -> dict:
    """The axes of a named leaf that the mesh splits (axis -> mesh axis), as accy.shard does:
    mapped axes whose extent the mesh axis divides, one axis per mesh axis."""
    if entry["kind"] != "named":
        return {}
    from .core.types import TensorType
    from .mesh.spmd import canonical

    ty = TensorType(DTYPES[entry["dtype"]], tuple(zip(entry["axes"], shape, strict=True)))
    return canonical(ty, mesh, axis_mapping).split


def _block(
    axes: Sequence[str], shape: Sequence[int], split: dict, mesh_shape: dict, coordinates: dict
) -> tuple:
    """The slices of a device's block: along each split axis, its share at its coordinate."""
    index = []
    for axis, extent in zip(axes, shape, strict=True):
        if axis in split:
            size = extent // mesh_shape[split[axis]]
            start = coordinates[split[axis]] * size
            index.append(slice(start, start + size))
        else:
            index.append(slice(None))
    return tuple(index)


def _save_sharded(path, keys, arrays, entries, metadata, mesh, axis_mapping) -> None:
    mesh, axis_mapping = _mesh_of(mesh, axis_mapping, "save")
    previous = _shard_files_of(path)
    token = uuid.uuid4().hex[:12]
    base = os.path.basename(path)
    names = [f"{base}.{token}.rank{r}-of-{mesh.size}.safetensors" for r in range(mesh.size)]
    folder = os.path.dirname(os.path.abspath(path))
    for entry, array in zip(entries, arrays, strict=True):
        entry["shape"] = list(array.shape)
        entry["split"] = _split_axes(entry, array.shape, mesh, axis_mapping)
    written = []
    try:
        for rank, name in enumerate(names):
            coordinates = mesh.coordinates(rank)
            blocks = {}
            for key, entry, array in zip(keys, entries, arrays, strict=True):
                if entry["split"]:
                    axes = entry["axes"]
                    index = _block(axes, array.shape, entry["split"], mesh.shape, coordinates)
                    blocks[key] = array[index].copy()
                elif rank == 0:  # a whole leaf is written once
                    blocks[key] = array
            shard_metadata = {
                "format": SHARDED_FORMAT + ":shard",
                "token": token,
                "rank": str(rank),
            }
            _write_atomically(os.path.join(folder, name), blocks, shard_metadata)
            written.append(name)
        metadata = dict(
            metadata,
            format=SHARDED_FORMAT,
            leaves=json.dumps(entries),
            token=token,
            mesh=json.dumps({"axes": list(mesh.axis_names), "shape": list(mesh.shape.values())}),
            shards=json.dumps(names),
        )
        _write_atomically(path, {}, metadata)  # the commit point
    except BaseException:
        for name in written:
            _remove_quietly(os.path.join(folder, name))
        raise
    for name in previous:
        if name not in names:
            _remove_quietly(os.path.join(folder, name))


def _shard_files_of(path: str) -> list[str]:
    """The shard files the sharded index at `path` names (none if it is something else)."""
    try:
        with open(path, "rb") as f:
            metadata = _metadata(f.read())
        if metadata.get("format") == SHARDED_FORMAT:
            return [os.path.basename(n) for n in json.loads(metadata["shards"])]
    except (OSError, ValueError, KeyError, struct.error):
        pass
    return []


def _assemble(path: str, metadata: dict, entries: list[dict]) -> dict[str, np.ndarray]:
    """The whole arrays of a sharded checkpoint, put together from every device's file."""
    try:
        names = json.loads(metadata["shards"])
        layout = json.loads(metadata["mesh"])
        token = metadata["token"]
    except (KeyError, ValueError):
        raise CheckpointError(f"load: {path!r} has damaged accy metadata (shards)") from None
    mesh_shape = dict(zip(layout["axes"], layout["shape"], strict=True))
    folder = os.path.dirname(os.path.abspath(path))
    whole: dict[str, np.ndarray] = {}
    for entry in entries:
        dtype = DTYPES[entry["dtype"]].numpy
        whole[entry["key"]] = np.empty(entry["shape"], dtype)
    for rank, name in enumerate(names):
        shard = os.path.join(folder, os.path.basename(name))
        tensors, shard_metadata = _read_tensors(shard)
        if shard_metadata.get("token") != token or shard_metadata.get("rank") != str(rank):
            raise CheckpointError(
                f"load: {shard!r} is not rank {rank}'s shard of the checkpoint {path!r} (it "
                "belongs to another save)"
            )
        coordinates = _coordinates(rank, mesh_shape)
        for entry in entries:
            key = entry["key"]
            if not entry.get("split") and rank != 0:
                continue
            if key not in tensors:
                raise CheckpointError(
                    f"load: {shard!r} has no block of key {key}; the checkpoint is damaged"
                )
            index = _block(
                entry.get("axes", []),
                entry["shape"],
                entry.get("split", {}),
                mesh_shape,
                coordinates,
            )
            target = whole[key][index] if entry.get("split") else whole[key]
            if tensors[key].shape != target.shape or tensors[key].dtype != target.dtype:
                raise CheckpointError(
                    f"load: {shard!r}: the block of key {key} has shape {tensors[key].shape}, "
                    f"the index says {target.shape}; the checkpoint is damaged"
                )
            if entry.get("split"):
                whole[key][index] = tensors[key]
            else:
                whole[key] = tensors[key]
    return whole


def _coordinates(rank: int, mesh_shape: dict[str, int]) -> dict[str, int]:
    position = np.unravel_index(rank, tuple(mesh_shape.values()))
    return {axis: int(i) for axis, i in zip(mesh_shape, position, strict=True)}


def load_block(
    path: str | os.PathLike, like: Any, mesh: Any, axis_mapping: dict[str, str], rank: int
) -> Any:
    """Device `rank`'s blocks of the checkpoint at `path` on `mesh` under `axis_mapping`
    (what one process of a run on that mesh holds), whatever mesh it was saved from: the
    checkpoint is re-sharded. `like` is the whole tree (as for `load`).

    >>> import accy, numpy as np, os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "t.safetensors")
    >>> w = accy.named(np.arange(8.0, dtype=np.float32), ("hidden",))
    >>> accy.save(path, {"w": w}, mesh=accy.Mesh(range(4), "data"), axis_mapping={"hidden": "data"})
    >>> two = accy.Mesh(range(2), "data")
    >>> accy.checkpoints.load_block(path, {"w": w}, two, {"hidden": "data"}, 1)["w"].array.tolist()
    [4.0, 5.0, 6.0, 7.0]
    """
    mesh, axis_mapping = _mesh_of(mesh, axis_mapping, "load_block")
    if not 0 <= rank < mesh.size:
        raise CheckpointError(f"load_block: rank {rank} is not one of the mesh's {mesh.size}")
    whole = load(path, like=like)
    coordinates = mesh.coordinates(rank)

    def cut(leaf: Any) -> Any:
        if not isinstance(leaf, NamedArray):
            return leaf
        entry = {"kind": "named", "axes": list(leaf.axes), "dtype": leaf.dtype.name}
        shape = leaf.ty.extents
        split = _split_axes(entry, shape, mesh, axis_mapping)
        index = _block(leaf.axes, shape, split, mesh.shape, coordinates)
        return named(np.asarray(leaf)[index].copy(), leaf.axes, device=leaf.device)

    return optree.tree_map(cut, whole, namespace=NAMESPACE)


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


def _read_tensors(path: str) -> tuple[dict[str, np.ndarray], dict]:
    """The tensors of the safetensors file at `path` (as NumPy arrays) and its metadata."""
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
    tensors = {}
    for name, record in content:
        dtype = _ACCY_DTYPES.get(record["dtype"])
        if dtype is None:
            raise CheckpointError(
                f"load: key {name} of {path!r} has safetensors dtype {record['dtype']}, which "
                "accy has no dtype for"
            )
        tensors[name] = np.frombuffer(record["data"], dtype.numpy).reshape(record["shape"])
    return tensors, _metadata(data)


def _read(path: str) -> tuple[list[dict], dict[str, np.ndarray], dict]:
    tensors, metadata = _read_tensors(path)
    if metadata.get("format") not in (FORMAT, SHARDED_FORMAT):
        raise CheckpointError(
            f"load: {path!r} is a safetensors file but not an accy checkpoint (its metadata "
            f"has format {metadata.get('format')!r}, not {FORMAT!r})"
        )
    try:
        entries = json.loads(metadata["leaves"])
    except (KeyError, ValueError):
        raise CheckpointError(f"load: {path!r} has damaged accy metadata (leaves)") from None
    if metadata["format"] == SHARDED_FORMAT:
        tensors = _assemble(path, metadata, entries)
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
