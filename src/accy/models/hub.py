"""Hugging Face model folders on disk: `config.json` and the weights in safetensors files (one
`model.safetensors`, or shards listed by `model.safetensors.index.json`), read and written with
the `safetensors` package. No network: a folder is what `transformers`' `save_pretrained`
writes (or what a hub download leaves).

Writing is atomic per file (a temporary file renamed into place), so an interrupted save never
leaves a half-written file under a final name.

>>> import tempfile, numpy as np
>>> folder = tempfile.mkdtemp()
>>> write_folder(folder, {"model_type": "toy"}, {"w": np.ones((2, 3), np.float32)})
>>> read_config(folder, "toy")["model_type"], read_tensors(folder)["w"].shape
('toy', (2, 3))
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import PretrainedError

WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
CONFIG = "config.json"


def _safetensors():
    try:
        import safetensors.numpy
    except ImportError:
        raise PretrainedError(
            "reading and writing Hugging Face folders needs the safetensors package "
            "(pip install safetensors)"
        ) from None
    return safetensors.numpy


def _folder(folder: str | os.PathLike) -> Path:
    path = Path(folder)
    if not path.is_dir():
        raise PretrainedError(
            f"{path} is not a folder; from_pretrained reads a local Hugging Face model folder "
            f"(config.json and {WEIGHTS}, as transformers' save_pretrained writes)"
        )
    return path


def read_config(folder: str | os.PathLike, model_type: str | None = None) -> dict[str, Any]:
    """The parsed `config.json` of `folder`, checked to be of `model_type` if given."""
    path = _folder(folder) / CONFIG
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise PretrainedError(f"{path} is missing: a model folder has a {CONFIG}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise PretrainedError(f"{path} is not readable JSON ({error})") from None
    if not isinstance(config, dict):
        raise PretrainedError(f"{path} holds {type(config).__name__}, not a JSON object")
    found = config.get("model_type")
    if model_type is not None and found != model_type:
        raise PretrainedError(
            f"{path} describes a {found!r} model, not {model_type!r}; load it with "
            f"accy.models.{found}.from_pretrained (accy.models.from_pretrained picks by type)"
            if found
            else f"{path} has no model_type; a {model_type} config has model_type {model_type!r}"
        )
    return config


def _load_file(path: Path) -> dict[str, np.ndarray]:
    numpy_io = _safetensors()
    try:
        return numpy_io.load_file(str(path))
    except FileNotFoundError:
        raise PretrainedError(f"{path} is missing") from None
    except Exception as error:  # SafetensorError and the like: a truncated or foreign file
        raise PretrainedError(f"{path} is not a readable safetensors file ({error})") from None


def read_tensors(folder: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every tensor of the folder's weights by name: `model.safetensors`, or the shards that
    `model.safetensors.index.json` lists."""
    path = _folder(folder)
    if (path / WEIGHTS).is_file():
        return _load_file(path / WEIGHTS)
    index = path / INDEX
    if not index.is_file():
        others = sorted(p.name for p in path.glob("*.bin")) + sorted(
            p.name for p in path.glob("*.pth")
        )
        hint = (
            f" (it has {', '.join(others)}: PyTorch pickles, which accy does not read; save the "
            "model again with transformers' save_pretrained, whose default is safetensors)"
            if others
            else ""
        )
        raise PretrainedError(f"{path} has neither {WEIGHTS} nor {INDEX}{hint}")
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as error:
        raise PretrainedError(f"{index} is not an index with a weight_map ({error!r})") from None
    tensors: dict[str, np.ndarray] = {}
    for shard in sorted(set(weight_map.values())):
        tensors.update(_load_file(path / shard))
    missing = sorted(set(weight_map) - set(tensors))
    if missing:
        raise PretrainedError(f"{index} lists tensors its shards lack: {', '.join(missing[:5])}")
    return tensors


def _write_atomically(path: Path, write) -> None:
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(handle)
    try:
        write(temporary)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _shards(
    tensors: Mapping[str, np.ndarray], max_shard_bytes: int | None
) -> list[dict[str, np.ndarray]]:
    if max_shard_bytes is None:
        return [dict(tensors)]
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, array in tensors.items():
        if shards[-1] and size + array.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = array
        size += array.nbytes
    return shards


def write_folder(
    folder: str | os.PathLike,
    config: Mapping[str, Any],
    tensors: Mapping[str, np.ndarray],
    max_shard_bytes: int | None = None,
    extra: Mapping[str, Mapping[str, Any]] | None = None,
) -> None:
    """Write `config.json` and the tensors (contiguous, C order) into `folder` (made if
    needed): one `model.safetensors`, or, with `max_shard_bytes`, shards of at most that size
    (a tensor larger alone fills a shard) and their index, named as `transformers` names them.
    `extra` maps more JSON file names (generation_config.json) to their contents."""
    path = Path(folder)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise PretrainedError(f"cannot make the folder {path}: {error}") from None
    numpy_io = _safetensors()
    arrays = {name: np.ascontiguousarray(a) for name, a in tensors.items()}
    shards = _shards(arrays, max_shard_bytes)
    metadata = {"format": "pt"}  # what transformers checks before loading safetensors
    try:
        if len(shards) == 1:
            _write_atomically(
                path / WEIGHTS, lambda t: numpy_io.save_file(shards[0], t, metadata=metadata)
            )
            (path / INDEX).unlink(missing_ok=True)
        else:
            weight_map = {}
            for number, shard in enumerate(shards, 1):
                name = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
                _write_atomically(
                    path / name, lambda t, s=shard: numpy_io.save_file(s, t, metadata=metadata)
                )
                weight_map |= dict.fromkeys(shard, name)
            index = {
                "metadata": {"total_size": sum(a.nbytes for a in arrays.values())},
                "weight_map": weight_map,
            }
            _write_json(path / INDEX, index)
            (path / WEIGHTS).unlink(missing_ok=True)
        for name, content in {CONFIG: config, **(extra or {})}.items():
            _write_json(path / name, content)
    except OSError as error:
        raise PretrainedError(f"cannot write the model into {path}: {error}") from None


def _write_json(path: Path, content: Any) -> None:
    text = json.dumps(content, indent=2, sort_keys=True) + "\n"
    _write_atomically(path, lambda t: Path(t).write_text(text))


def take(tensors: dict[str, np.ndarray], name: str, shape: tuple[int, ...], where: str):
    """The tensor `name`, removed from `tensors`, checked to have `shape` (as float32 or the
    file's float dtype)."""
    array = tensors.pop(name, None)
    if array is None:
        raise PretrainedError(f"{where} has no tensor {name!r} (expected shape {shape})")
    if tuple(array.shape) != tuple(shape):
        raise PretrainedError(
            f"{where}: tensor {name!r} has shape {tuple(array.shape)}, but the config says "
            f"{tuple(shape)}"
        )
    if array.dtype.kind not in "fV" and str(array.dtype) != "bfloat16":
        raise PretrainedError(f"{where}: tensor {name!r} is {array.dtype}, not a float tensor")
    return array


def size_in_bytes(text: str | int | None) -> int | None:
    """A shard size as transformers writes it ("5GB", "200MB", "16KB") or a number of bytes.

    >>> size_in_bytes("16KB"), size_in_bytes(100), size_in_bytes(None)
    (16000, 100, None)
    """
    if text is None or isinstance(text, int):
        return text
    units = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
    upper = text.strip().upper()
    for unit, factor in sorted(units.items(), key=lambda u: -len(u[0])):
        if upper.endswith(unit):
            try:
                return math.floor(float(upper[: -len(unit)]) * factor)
            except ValueError:
                break
    raise PretrainedError(f"a shard size is a number of bytes or like '5GB', got {text!r}")


__all__ = ["read_config", "read_tensors", "size_in_bytes", "take", "write_folder"]
